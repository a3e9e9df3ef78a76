/* megatrain plot: draws loss, eval loss and learning rate (second axis) against
 * step from a metrics.jsonl into a PNG, with gnuplot run as a child process
 * that reads its script, data inline, on stdin (the file is read by
 * engine/metrics_read.h). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "engine/metrics_read.h"
#include "util/error.h"
#include "util/mem.h"

extern char **environ;

/* s as a gnuplot single-quoted string ('' stands for '). */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        if (*s != '\n') fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_script(FILE *f, const mt_metrics_series *s, const char *out, const char *title) {
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1000,600 noenhanced font 'sans,11'\n"
               "} else {\n  set terminal png size 1000,600 noenhanced\n}\n");
    fprintf(f, "set output ");
    gp_quote(f, out);
    fprintf(f, "\nset title ");
    gp_quote(f, title);
    fprintf(f, "\nset xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right\n"
               "set datafile missing '?'\nset ytics nomirror\n");
    if (s->has_lr)
        fprintf(f, "set y2label 'learning rate'\nset y2tics\nset format y2 '%%.1e'\n");
    fprintf(f, "$data << EOD\n");
    for (size_t i = 0; i < s->n; i++) {
        fprintf(f, "%.17g %.9g ", s->step[i], s->loss[i]);
        if (isnan(s->lr[i])) fprintf(f, "?\n");
        else fprintf(f, "%.9g\n", s->lr[i]);
    }
    fprintf(f, "EOD\n");
    if (s->n_eval) {
        fprintf(f, "$eval << EOD\n");
        for (size_t i = 0; i < s->n_eval; i++) fprintf(f, "%.17g %.9g\n", s->eval_step[i], s->eval_loss[i]);
        fprintf(f, "EOD\n");
    }
    fprintf(f, "plot $data using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'loss' axes x1y1");
    if (s->n_eval)
        fprintf(f, ", $eval using 1:2 with linespoints pt 7 lw 2 lc rgb '#2ca02c' title 'eval loss' "
                   "axes x1y1");
    if (s->has_lr)
        fprintf(f, ", $data using 1:3 with lines lw 1 dt 2 lc rgb '#d62728' title 'lr' axes x1y2");
    fprintf(f, "\nset output\n");
}

/* Runs gnuplot with the script on its stdin and waits for it. */
static int run_gnuplot(const mt_metrics_series *s, const char *out, const char *title,
                       mt_error *err) {
    int fds[2];
    if (pipe(fds)) return mt_errorf(err, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    char *args[] = {"gnuplot", NULL};
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[0]);
    if (rc) {
        close(fds[1]);
        if (rc == ENOENT)
            return mt_errorf(err, "gnuplot not found on PATH; install it (Debian/Ubuntu: "
                                  "apt-get install gnuplot-nox)");
        return mt_errorf(err, "starting gnuplot: %s", strerror(rc));
    }
    /* If gnuplot dies early, a write must fail with EPIPE, not kill us. */
    void (*old)(int) = signal(SIGPIPE, SIG_IGN);
    FILE *f = fdopen(fds[1], "w");
    write_script(f, s, out, title);
    fclose(f);
    signal(SIGPIPE, old);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        return mt_errorf(err, "gnuplot failed (its message is above) writing '%s'", out);
    struct stat st;
    if (stat(out, &st) || st.st_size == 0)
        return mt_errorf(err, "gnuplot wrote no image to '%s' (is the directory writable?)", out);
    return 0;
}

typedef struct plot_args {
    const char *metrics, *out, *title;
    bool given[3];
} plot_args;

static const mt_opt options[] = {
    {"metrics", MT_OPT_TEXT, offsetof(plot_args, metrics), NULL, NULL, MT_OPT_ANY, NULL,
     "METRICS.jsonl", NULL, "the metrics.jsonl to draw (or give it as the argument)"},
    {"out", MT_OPT_TEXT, offsetof(plot_args, out), "", NULL, MT_OPT_ANY, NULL, "OUT.png", NULL,
     "image to write; none: loss.png next to METRICS"},
    {"title", MT_OPT_TEXT, offsetof(plot_args, title), "", NULL, MT_OPT_ANY, NULL, "T", NULL,
     "title; none: the metrics path"},
};
static const mt_opt_alias aliases[] = {
    {"o", "out", MT_ALIAS_SHORT},
    {"output", "out", MT_ALIAS_DEPRECATED},
};
/* Default output: loss.png in the directory of the metrics file. */
static char *default_out(const char *metrics) {
    const char *slash = strrchr(metrics, '/');
    size_t dir = slash ? (size_t)(slash - metrics) + 1 : 0;
    char *out = mt_malloc_or_die(dir + sizeof "loss.png");
    memcpy(out, metrics, dir);
    strcpy(out + dir, "loss.png");
    return out;
}

static int run(void *args, int argc, char **argv) {
    plot_args *a = args;
    const char *in = a->metrics, *out = a->out, *title = a->title;
    char *own_out = out ? NULL : default_out(in);
    mt_metrics_series s = {0};
    mt_error err;
    int rc = mt_metrics_read(in, &s, "megatrain plot", &err) ||
         run_gnuplot(&s, out ? out : own_out, title ? title : in, &err);
    if (rc) fprintf(stderr, "megatrain plot: %s\n", err.msg);
    else printf("megatrain plot: %zu points -> %s\n", s.n, out ? out : own_out);
    mt_metrics_series_free(&s);
    free(own_out);
    return rc ? 1 : 0;
}

static const mt_opt_table table = {
    .command = "plot", MT_OPT_ROWS(options), MT_OPT_ALIASES(aliases), MT_OPT_STRUCT(plot_args),
    .positional = "metrics",
    .about = "Draws loss, eval loss (points) and learning rate (right axis) against step\n"
             "with gnuplot."};
const mt_cli_command mt_cli_plot = {
    "plot", "draw the loss curve of a metrics.jsonl to a PNG", &table, run};
