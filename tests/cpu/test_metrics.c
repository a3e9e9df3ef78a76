/* Tests of metrics.jsonl (omitted fields, no duplicate steps on resume, torn
 * lines dropped and said, a failed write stopping the run), the progress
 * line, and `megatrain plot`. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/metrics.h"
#include "engine/metrics_read.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "testlib.h"


static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* Steps [from, to] with loss = step/10 and lr. */
static void write_steps(const char *path, int64_t keep, int from, int to) {
    mt_metrics_writer w;
    mt_error err;
    cr_assert_eq(mt_metrics_open(&w, path, keep, &err), 0, "%s", err.msg);
    for (int s = from; s <= to; s++) {
        mt_metrics_row r = mt_metrics_row_make(s);
        r.loss = s / 10.0;
        r.lr = 1e-4;
        cr_assert_eq(mt_metrics_write(&w, &r, &err), 0, "%s", err.msg);
    }
    mt_metrics_close(&w);
}

static int count_lines_with(const char *text, const char *s) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, s)); p++) n++;
    return n;
}

Test(metrics, json_omits_absent_fields) {
    mt_metrics_row r = mt_metrics_row_make(12);
    r.loss = 2.5;
    r.tokens = 4096;
    r.gpu_mem_gb = INFINITY; // not representable in JSON: left out
    char buf[512];
    mt_metrics_format_json(&r, buf, sizeof buf);
    cr_assert_str_eq(buf, "{\"step\":12,\"loss\":2.5,\"tokens\":4096}");
}

Test(metrics, resume_truncates_later_steps) {
    char *dir = mt_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_steps(path, 0, 1, 8);           // run got to step 8 ...
    write_steps(path, 5, 6, 10);          // ... resumed from the checkpoint of step 5
    const char *text = slurp(path);
    for (int s = 1; s <= 10; s++) {
        char key[32];
        snprintf(key, sizeof key, "{\"step\":%d,", s);
        cr_assert_eq(count_lines_with(text, key), 1, "step %d in:\n%s", s, text);
    }
    cr_assert_eq(count_lines_with(text, "\n"), 10);
    write_steps(path, 0, 1, 2);           // a fresh run starts the file again
    cr_assert_eq(count_lines_with(slurp(path), "\n"), 2);
    mt_test_rmtree(dir);
    free(dir);
}

Test(metrics, torn_last_line_is_dropped) {
    char *dir = mt_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_steps(path, 0, 1, 3);
    FILE *f = fopen(path, "ab");
    fputs("{\"step\":4,\"lo", f); // killed mid-write
    fclose(f);
    write_steps(path, 3, 4, 4);
    const char *text = slurp(path);
    cr_assert_eq(count_lines_with(text, "\n"), 4, "%s", text);
    cr_assert_null(strstr(text, "\"lo\n"));
    mt_test_rmtree(dir);
    free(dir);
}

static void train_config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 "
                                    "--log-every 1000 %s", out, extra), 0, "%s", err.msg);
}

/* What the child of the test below saw. */
typedef struct full_disk_result {
    int opened, rc;
    long long steps;
    char msg[1024];
} full_disk_result;

/* Issue 29: on a nearly full disk, training went 41 more steps after
 * metrics.jsonl stopped growing mid-line (a warning, then nothing). Here a
 * file size limit (EFBIG, as ENOSPC would be) leaves room for a few rows:
 * the step whose row fails stops the run with an error naming the file,
 * and the file holds whole rows only. The run is in a child process (the
 * limit is per process; forked before any OpenMP work). */
Test(metrics, a_row_that_cannot_be_written_stops_the_run, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], path[700];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        full_disk_result r = {0};
        mt_train_config tc;
        mt_error err = {{0}};
        train_config(&tc, out, "--steps 40 --save-every 0 --no-tensorboard");
        mt_run *R = mt_trainer_open(&tc, NULL, &err);
        if ((r.opened = R != NULL)) {
            struct rlimit lim;
            getrlimit(RLIMIT_FSIZE, &lim);
            lim.rlim_cur = 700; /* two or three rows of about 250 bytes */
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &lim);
            while ((r.rc = mt_trainer_step(R, NULL, &err)) == 0) r.steps++;
        }
        snprintf(r.msg, sizeof r.msg, "%s", err.msg);
        _exit(write(fds[1], &r, sizeof r) == sizeof r ? 0 : 1);
    }
    close(fds[1]);
    full_disk_result r;
    cr_assert_eq(read(fds[0], &r, sizeof r), (ssize_t)sizeof r, "the child died");
    waitpid(pid, NULL, 0);
    cr_assert(r.opened, "%s", r.msg);
    cr_assert_eq(r.rc, -1, "the run went on (%lld steps) after its metrics stopped: %s",
                 r.steps, r.msg);
    cr_assert_lt(r.steps, 5);
    cr_assert(strstr(r.msg, path) && strstr(r.msg, "File too large") &&
              strstr(r.msg, "--resume auto"), "%s", r.msg);
    const char *text = slurp(path);
    cr_assert_eq(count_lines_with(text, "\n"), r.steps, "rows: %s", text);
    cr_assert(text[0] == 0 || text[strlen(text) - 1] == '\n', "a torn row was left:\n%s", text);
    mt_test_rmtree(dir);
    free(dir);
}

static char warnings[4096];

static void keep_warnings(const mt_event *ev, void *user) {
    if (ev->kind == MT_EVENT_WARNING) strncat(warnings, ev->text, sizeof warnings - strlen(warnings) - 1);
}

/* Issue 29: a resume that met a torn last row (a write cut short) dropped
 * it without a word. Now it says so, and the file goes on whole. */
Test(metrics, a_resume_says_it_removed_a_torn_row, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], path[700];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    mt_train_config tc;
    mt_error err;
    train_config(&tc, out, "--steps 3 --save-every 3");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    FILE *f = fopen(path, "ab");
    fputs("{\"step\":4,\"lo", f); /* the row of a step after the checkpoint, cut short */
    fclose(f);
    train_config(&tc, out, "--steps 5 --save-every 3 --resume auto");
    mt_events ev = {.fn = keep_warnings};
    mt_run *R = mt_trainer_open(&tc, &ev, &err);
    cr_assert(R, "%s", err.msg);
    cr_assert(strstr(warnings, path) && strstr(warnings, "torn row") &&
              strstr(warnings, "removed"), "no warning: '%s'", warnings);
    cr_assert_eq(mt_trainer_train(R, &err), 0, "%s", err.msg);
    mt_trainer_close(R);
    const char *text = slurp(path);
    cr_assert_eq(count_lines_with(text, "\n"), 5, "%s", text);
    cr_assert_null(strstr(text, "\"lo{"), "%s", text);
    mt_test_rmtree(dir);
    free(dir);
}

Test(metrics, progress_line_full) {
    mt_metrics_row r = mt_metrics_row_make(120);
    r.loss = 2.34119, r.lr = 9.8e-6, r.grad_norm = 0.4123, r.tokens_per_s = 41234;
    r.tflops = 412.3, r.gpu_mem_gb = 52.08, r.host_mem_gb = 108.2, r.h2d_gbps = 7.06;
    r.d2h_gbps = 6.94, r.eta_s = 3725;
    char buf[512];
    mt_progress_format(&r, 1000, buf, sizeof buf);
    cr_assert_str_eq(buf, "step 120/1000 | loss 2.3412 | lr 9.8e-06 | grad norm 0.412 | "
                          "41.2k tok/s | 412 TFLOPS | gpu 52.1 GB | host 108 GB | "
                          "H2D 7.1 GB/s | D2H 6.9 GB/s | ETA 1h02m");
}

Test(metrics, progress_line_leaves_out_absent_fields) {
    mt_metrics_row r = mt_metrics_row_make(3);
    r.loss = 5.5;
    r.tokens_per_s = 812;
    char buf[512];
    mt_progress_format(&r, 0, buf, sizeof buf);
    cr_assert_str_eq(buf, "step 3 | loss 5.5000 | 812 tok/s");
    r.tokens_per_s = 2.5e6;
    mt_progress_format(&r, 10, buf, sizeof buf);
    cr_assert_str_eq(buf, "step 3/10 | loss 5.5000 | 2.50M tok/s");
}

Test(metrics, duration_formats) {
    static const struct { double s; const char *text; } cases[] = {
        {0, "0s"},          {42.4, "42s"},        {59.6, "1m00s"},  {725, "12m05s"},
        {3725, "1h02m"},    {86399, "23h59m"},    {273600, "3d04h"}, {NAN, "?"},
        {-1, "?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[32];
        mt_format_duration(cases[i].s, buf, sizeof buf);
        cr_assert_str_eq(buf, cases[i].text, "%g s", cases[i].s);
    }
}

/* plot ------------------------------------------------------------------- */

static int plot(const char *in, const char *out) {
    char *argv[] = {"plot", (char *)in, "-o", (char *)out, "--title", "it's a test", NULL};
    return mt_test_cli(argv);
}

Test(plot, writes_a_png) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        cr_skip_test("gnuplot not installed (Debian: gnuplot-nox); plot not tested");
    }
    char *dir = mt_test_tmpdir(), in[4200], out[4200];
    snprintf(in, sizeof in, "%s/metrics.jsonl", dir);
    snprintf(out, sizeof out, "%s/loss.png", dir);
    FILE *f = fopen(in, "wb");
    for (int s = 1; s <= 200; s++)
        fprintf(f, "{\"step\":%d,\"loss\":%.4f,\"lr\":%g}\n", s, 5.5 * exp(-s / 60.0) + 1.2,
                s < 20 ? 1e-4 * s / 20 : 1e-4 * (1 - (s - 20) / 180.0));
    fclose(f);
    cr_assert_eq(plot(in, out), 0);
    FILE *png = fopen(out, "rb");
    cr_assert(png);
    unsigned char magic[8];
    cr_assert_eq(fread(magic, 1, 8, png), 8);
    fseek(png, 0, SEEK_END);
    long size = ftell(png);
    fclose(png);
    cr_assert_eq(memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0);
    cr_assert_gt(size, 1000); // a 1000x600 chart with text is tens of kB; an empty one is not
    mt_test_rmtree(dir);
    free(dir);
}

/* The reader on the fuzz seeds: which lines count as rows. */
Test(plot, reads_rows) {
    mt_metrics_series s = {0};
    mt_error err;
    cr_assert_eq(mt_metrics_read("tests/fuzz/corpus/plot/eval", &s, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.n_eval, 2);
    cr_assert(s.has_lr);
    cr_assert_eq(s.step[1], 20);
    cr_assert_eq(s.eval_step[1], 20);
    cr_assert_eq(s.eval_loss[1], 4.02);
    mt_metrics_series_free(&s);
    // strings, null, arrays and non-JSON are skipped; 1e400 reads as inf
    cr_assert_eq(mt_metrics_read("tests/fuzz/corpus/plot/nonnumeric", &s, NULL, &err), 0);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.n_eval, 0);
    cr_assert_eq(s.step[1], 5);
    cr_assert(isinf(s.loss[1]));
    cr_assert(isnan(s.lr[0]));
    mt_metrics_series_free(&s);
    cr_assert_eq(mt_metrics_read("tests/fuzz/corpus/plot/torn", &s, NULL, &err), 0);
    cr_assert_eq(s.n, 2);
    mt_metrics_series_free(&s);
    cr_assert_eq(mt_metrics_read("tests/fuzz/corpus/plot/noloss", &s, NULL, &err), -1);
    cr_assert_null(s.step);
    cr_assert(strstr(err.msg, "no rows with"), "%s", err.msg);
}

Test(plot, errors) {
    char *dir = mt_test_tmpdir(), in[4200], out[4200];
    snprintf(in, sizeof in, "%s/metrics.jsonl", dir);
    snprintf(out, sizeof out, "%s/loss.png", dir);
    cr_assert_eq(plot(in, out), 1); // missing file
    FILE *f = fopen(in, "wb");
    fputs("{\"step\":1,\"lr\":0.1}\n", f); // no loss
    fclose(f);
    cr_assert_eq(plot(in, out), 1);
    char *argv[] = {"plot", NULL};
    cr_assert_eq(mt_test_cli(argv), 2); // no input
    mt_test_rmtree(dir);
    free(dir);
}
