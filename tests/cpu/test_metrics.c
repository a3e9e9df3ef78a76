/* Tests of metrics.jsonl (omitted fields, no duplicate steps on resume, torn
 * lines dropped), the progress line, and `megatrain plot`. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/metrics.h"
#include "engine/metrics_read.h"
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
