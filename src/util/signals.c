/* SIGINT/SIGTERM handlers that only record the signal (see signals.h for
 * why this state is global). */
#include "util/signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_pending;
static volatile sig_atomic_t g_last;
/* The handlers before mt_signals_install, for mt_signals_restore: written
 * and read by the thread that trains, never by a handler. */
static struct sigaction g_old_int, g_old_term;
static int g_saved;

static void on_signal(int sig) {
    g_last = sig;
    g_pending = 1;
}

void mt_signals_install(void) {
    g_pending = 0;
    g_last = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* SA_RESETHAND: the handler runs once, then the default action is back,
     * so the second Ctrl-C (or SIGTERM) ends the process. SA_RESTART keeps
     * blocking reads and writes of the step going until the poll. */
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    if (g_saved) {
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        return;
    }
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_saved = 1;
}

void mt_signals_restore(void) {
    if (!g_saved) return;
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    g_saved = 0;
    g_pending = 0;
}

int mt_signals_pending(void) { return g_pending != 0; }

int mt_signals_last(void) { return (int)g_last; }
