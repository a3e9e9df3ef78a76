/* What `megatrain train` shows as it trains: in a terminal (a pseudo-
 * terminal here) a progress bar redrawn in place at every step (step/total,
 * loss, tokens/s, ETA) between the progress lines of every log_every
 * steps; in a file or a pipe the progress lines only, no bar, no carriage
 * return. metrics.jsonl gets a row for every step either way. */
#include <criterion/criterion.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/file.h"
#include "testlib.h"

/* The output of `megatrain ARGS` run in a pseudo-terminal. */
static char *run_in_terminal(char *const argv[]) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    cr_assert_gt(n, 0);
    exe[n] = 0;
    strcpy(strrchr(exe, '/') + 1, "megatrain");
    char *args[32] = {exe};
    for (int i = 0; argv[i] && i < 30; i++) args[i + 1] = argv[i];
    int master;
    struct winsize ws = {.ws_row = 24, .ws_col = 100};
    fflush(stdout), fflush(stderr);
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    cr_assert_geq(pid, 0, "forkpty");
    if (pid == 0) {
        setenv("TERM", "xterm", 1);
        execv(exe, args);
        _exit(127);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    char buf[4096];
    ssize_t got;
    while ((got = read(master, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)got, m);
    fclose(m);
    close(master);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "train failed:\n%s", text);
    return text;
}

static int count(const char *s, const char *what) {
    int k = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) k++;
    return k;
}

Test(progress, a_bar_in_a_terminal_lines_in_a_file) {
    char *dir = mt_test_tmpdir(), *out = mt_path_join(dir, "run");
    char *args[] = {"train", "--steps", "6", "--log-every", "3", "--out", out, "--save-every", "0",
                    "--sample-tokens", "0", "--no-tensorboard", NULL};
    char *tty = run_in_terminal(args);
    /* the bar at the steps between the lines (not at the last: its line says it all) */
    for (int s = 1; s <= 5; s++) {
        char want[32];
        snprintf(want, sizeof want, "] %d/6 | loss ", s);
        cr_expect_eq(count(tty, want), 1, "step %d's bar in:\n%s", s, tty);
    }
    cr_expect(strstr(tty, "\r 17% [#"), "the bar is redrawn from the line's start:\n%s", tty);
    cr_expect(strstr(tty, "tok/s | ETA "), "%s", tty);
    cr_expect_eq(count(tty, "step 3/6 | loss"), 1, "%s", tty);
    cr_expect_eq(count(tty, "step 6/6 | loss"), 1, "%s", tty);
    cr_expect_eq(count(tty, "6/6 | loss"), 1, "no bar after the last step:\n%s", tty);

    char *o, *e;
    char *again[] = {"train", "--steps", "6", "--log-every", "3", "--out", out, "--overwrite",
                     "--save-every", "0", "--sample-tokens", "0", "--no-tensorboard", NULL};
    cr_assert_eq(mt_test_cli_output(again, &o, &e), 0, "%s", e);
    cr_expect_null(strchr(o, '\r'), "no carriage return in a file:\n%s", o);
    cr_expect_eq(count(o, "| loss"), 2, "the lines of steps 3 and 6 only:\n%s", o);
    char *rows = mt_path_join(out, "metrics.jsonl"), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(rows, &buf, &len, &err), 0, "%s", err.msg);
    cr_expect_eq(count(buf, "\"step\":"), 6, "a metrics.jsonl row per step:\n%s", buf);
    free(buf), free(rows), free(o), free(e), free(tty);
    mt_test_rmtree(dir);
    free(dir), free(out);
}
