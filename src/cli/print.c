/* How the command line shows what the library reports: information and
 * progress lines on stdout, warnings on stderr after "megatrain: ",
 * generated text as it comes. In a terminal, training also shows a
 * progress bar, redrawn in place at every step (step/total, loss,
 * tokens/s, ETA), between the periodic progress lines. */
#include "cli/commands.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* "1h02m", "3m05s", "12s". */
static void duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (!isfinite(s) || s < 0) snprintf(buf, n, "?");
    else if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

void mt_cli_progress_bar(const mt_step_metrics *m, int width, char *buf, size_t n) {
    char eta[32], rate[32];
    duration(m->eta_s, eta, sizeof eta);
    double r = m->tokens_per_s;
    if (!isfinite(r)) snprintf(rate, sizeof rate, "?");
    else if (r >= 1e6) snprintf(rate, sizeof rate, "%.2fM", r / 1e6);
    else if (r >= 1e3) snprintf(rate, sizeof rate, "%.1fk", r / 1e3);
    else snprintf(rate, sizeof rate, "%.0f", r);
    double frac = m->total_steps > 0 ? (double)m->step / (double)m->total_steps : 0;
    if (frac > 1) frac = 1;
    char tail[160];
    int tl = snprintf(tail, sizeof tail, " %lld/%lld | loss %.4f | %s tok/s | ETA %s",
                      (long long)m->step, (long long)m->total_steps, m->loss, rate, eta);
    int cells = width - tl - 7;  /* "100% [" + "]" */
    if (cells > 30) cells = 30;
    int u = snprintf(buf, n, "%3.0f%%", 100 * frac);
    if (cells >= 5 && (size_t)u + (size_t)cells + 2 < n) {
        int full = (int)(frac * cells);
        buf[u++] = ' ', buf[u++] = '[';
        for (int i = 0; i < cells; i++) buf[u++] = i < full ? '#' : '-';
        buf[u++] = ']';
    }
    snprintf(buf + u, n - (size_t)u, "%s", tail);
    if (width > 1 && strlen(buf) >= (size_t)width) buf[width - 1] = 0;  /* no wrap: \r stays on the line */
}

static int term_width(void) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

/* Clears a bar on the line before other output. */
static void clear_bar(mt_cli_progress *p) {
    if (p && p->shown) fputs("\r\033[K", stdout), p->shown = false;
}

void mt_cli_print_event(const mt_event *ev, void *user) {
    mt_cli_progress *p = user;
    switch (ev->kind) {
    case MT_EVENT_INFO:
        clear_bar(p);
        printf("%s\n", ev->text);
        break;
    case MT_EVENT_WARNING:
        clear_bar(p);
        fflush(stdout);
        fprintf(stderr, "megatrain: %s\n", ev->text);
        break;
    case MT_EVENT_STEP:
        if (ev->text) clear_bar(p), printf("%s\n", ev->text);
        if (p && p->bar && ev->step && ev->step->step < ev->step->total_steps) {
            char bar[512];
            mt_cli_progress_bar(ev->step, term_width(), bar, sizeof bar);
            printf("\r%s\033[K", bar);
            p->shown = true;
        }
        fflush(stdout);
        break;
    case MT_EVENT_TEXT:
        clear_bar(p);
        fputs(ev->text, stdout);
        fflush(stdout);
        break;
    }
}
