/* Starting and watching the ranks of a run on this machine (see launch.h). */
#include "dist/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/mem.h"
#include "util/signals.h"

int mt_launch_is_rank(void) {
    static const char *vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* A TCP port that was free on 127.0.0.1 a moment ago (MASTER_PORT when the
 * user set one). */
static int pick_port(mt_error *err) {
    const char *p = getenv("MASTER_PORT");
    if (p && *p) return atoi(p);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    int e = errno;
    if (fd >= 0) close(fd);
    if (!ok)
        return mt_errorf(err, "cannot find a free TCP port on 127.0.0.1 for the ranks to meet "
                         "(%s); set MASTER_PORT", strerror(e));
    return ntohs(a.sin_port);
}

static void set_int(const char *name, int v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%d", v);
    setenv(name, buf, 1);
}

/* In the child: becomes rank r of n and runs the program again. */
static void exec_rank(int r, int n, int port, char **argv) {
    set_int("RANK", r);
    set_int("WORLD_SIZE", n);
    set_int("LOCAL_RANK", r);
    set_int("LOCAL_WORLD_SIZE", n);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_int("MASTER_PORT", port);
    /* Signals reach the ranks through the launcher only (a terminal's
     * Ctrl-C goes to its foreground group, not theirs), once; a launcher
     * that dies stops them too. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (r > 0) { /* progress and metrics come from rank 0 */
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, STDOUT_FILENO);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "rank %d: cannot run /proc/self/exe: %s\n", r, strerror(errno));
    _exit(127);
}

static void describe(char *buf, size_t cap, int st) {
    if (WIFEXITED(st))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, cap, "ended (status %d)", st);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A stopped rank (SIGSTOP, a debugger) gets the signal once it runs
 * again: SIGCONT follows a request to stop. */
static void signal_all(const pid_t *pid, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (pid[i] > 0) {
            kill(pid[i], sig);
            if (sig == SIGTERM || sig == SIGINT) kill(pid[i], SIGCONT);
        }
}

int mt_launch_ranks(int n, char **argv, FILE *log, int *exit_code, mt_error *err) {
    *exit_code = 1;
    if (n < 1) return mt_errorf(err, "--gpus %d: give 1 or more", n);
    int port = pick_port(err);
    if (port < 0) return -1;
    fflush(NULL);
    pid_t *pid = mt_calloc_or_die((size_t)n, sizeof *pid);
    int *status = mt_calloc_or_die((size_t)n, sizeof *status);
    mt_signals_install();
    int running = 0, failed = -1, forwarded = 0;
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) exec_rank(r, n, port, argv);
        if (pid[r] < 0) {
            mt_errorf(err, "cannot start rank %d: %s", r, strerror(errno));
            failed = r;
            break;
        }
        running++;
    }
    double stop_at = failed >= 0 ? now_s() : 0; /* when the survivors were told to stop */
    if (failed >= 0) signal_all(pid, n, SIGTERM);
    while (running > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < n && pid[r] != p) r++;
            if (r == n) continue;
            pid[r] = -pid[r]; /* ended */
            status[r] = st;
            running--;
            /* a rank told to stop (by a signal passed on) ends with 130 */
            int ok = WIFEXITED(st) &&
                     (WEXITSTATUS(st) == 0 || (forwarded && WEXITSTATUS(st) == 130));
            if (!ok && failed < 0) {
                failed = r;
                char how[96];
                describe(how, sizeof how, st);
                mt_errorf(err, "rank %d of %d %s (its output above says why); the other ranks "
                          "were stopped", r, n, how);
                if (running > 0) {
                    if (log) fprintf(log, "launch: rank %d %s; stopping the other ranks\n", r, how);
                    signal_all(pid, n, SIGTERM);
                    stop_at = now_s();
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR) break;
        if (mt_signals_pending() && !forwarded) { /* SIGINT or SIGTERM to the launcher */
            signal_all(pid, n, mt_signals_last());
            forwarded = 1;
        }
        if (stop_at > 0 && now_s() - stop_at > MT_LAUNCH_GRACE_S) {
            if (log) fprintf(log, "launch: ranks still running %d s after being told to stop: "
                             "killing them\n", MT_LAUNCH_GRACE_S);
            signal_all(pid, n, SIGKILL);
            stop_at = 0;
        }
        usleep(20000);
    }
    mt_signals_restore();
    int rc = failed >= 0 ? -1 : 0;
    if (rc == 0) *exit_code = forwarded ? 130 : 0;
    free(pid);
    free(status);
    return rc;
}
