/* TensorBoard event files on the C side: CRC32C against the published
 * iSCSI test vectors, the records decoded back with protobuf-c, the scalars
 * of a metrics row, and the errors. (tests/python/test_tensorboard.py reads
 * the files with the tensorboard package itself.) */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "engine/metrics.h"
#include "io/file.h"
#include "io/tensorboard.h"
#include "io/tensorboard.pb-c.h"
#include "util/mem.h"
#include "testlib.h"

/* RFC 3720 (iSCSI), appendix B.4: CRC32C of 32-byte patterns. */
Test(tensorboard, crc32c_matches_the_rfc_3720_vectors) {
    unsigned char zeros[32] = {0}, ones[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) ones[i] = 0xff, inc[i] = (unsigned char)i, dec[i] = (unsigned char)(31 - i);
    cr_expect_eq(mt_crc32c(zeros, 32), 0x8a9136aau);
    cr_expect_eq(mt_crc32c(ones, 32), 0x62a8ab43u);
    cr_expect_eq(mt_crc32c(inc, 32), 0x46dd794eu);
    cr_expect_eq(mt_crc32c(dec, 32), 0x113fdb5cu);
    cr_expect_eq(mt_crc32c("123456789", 9), 0xe3069283u);  // the CRC catalogue's check value
}

/* The records of an event file, each checked and decoded. */
static size_t read_events(const char *path, Tensorboard__Event **ev, size_t cap) {
    char *buf;
    size_t len, pos = 0, n = 0;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    while (pos < len) {
        cr_assert_leq(pos + 12, len, "torn record header");
        uint64_t rl;
        uint32_t c1, c2;
        memcpy(&rl, buf + pos, 8);
        memcpy(&c1, buf + pos + 8, 4);
        cr_assert_eq(c1, mt_tb_mask_crc(mt_crc32c(buf + pos, 8)), "record %zu: length CRC", n);
        cr_assert_leq(pos + 16 + rl, len, "torn record");
        memcpy(&c2, buf + pos + 12 + rl, 4);
        cr_assert_eq(c2, mt_tb_mask_crc(mt_crc32c(buf + pos + 12, rl)), "record %zu: data CRC", n);
        cr_assert_lt(n, cap);
        ev[n] = tensorboard__event__unpack(NULL, rl, (const uint8_t *)buf + pos + 12);
        cr_assert(ev[n], "record %zu does not decode as an Event", n);
        n++;
        pos += 16 + rl;
    }
    free(buf);
    return n;
}

Test(tensorboard, records_decode_to_the_events_written) {
    char *dir = mt_test_tmpdir(), *logdir = mt_path_join(dir, "a/tensorboard");
    mt_error err;
    mt_tb_writer *w = mt_tb_open(logdir, 5, &err);
    cr_assert(w, "%s", err.msg);
    mt_tb_scalar s[2] = {{"train/loss", 2.5f}, {"eval/loss", -0.125f}};
    cr_assert_eq(mt_tb_write_scalars(w, 5, s, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_tb_write_scalars(w, 6, s, 1, &err), 0, "%s", err.msg);
    char *path = mt_strdup_or_die(mt_tb_path(w));
    cr_expect(strstr(path, "/a/tensorboard/events.out.tfevents."), "%s", path);
    mt_tb_close(w);
    Tensorboard__Event *ev[8];
    size_t n = read_events(path, ev, 8);
    cr_assert_eq(n, 4);
    cr_expect_eq(ev[0]->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
    cr_expect_str_eq(ev[0]->file_version, "brain.Event:2");
    cr_expect_eq(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SESSION_LOG);
    cr_expect_eq(ev[1]->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
    cr_expect_eq(ev[1]->step, 5);
    cr_assert_eq(ev[2]->what_case, TENSORBOARD__EVENT__WHAT_SUMMARY);
    cr_expect_eq(ev[2]->step, 5);
    cr_assert_eq(ev[2]->summary->n_value, 2);
    cr_expect_str_eq(ev[2]->summary->value[1]->tag, "eval/loss");
    cr_expect_eq(ev[2]->summary->value[1]->simple_value, -0.125f);
    cr_expect_eq(ev[3]->step, 6);
    cr_expect_eq(ev[3]->summary->n_value, 1);
    for (size_t i = 0; i < n; i++) {
        cr_expect_gt(ev[i]->wall_time, 1.6e9);
        tensorboard__event__free_unpacked(ev[i], NULL);
    }
    /* a second writer of the same second gets a name of its own */
    mt_tb_writer *w2 = mt_tb_open(logdir, 0, &err), *w3 = mt_tb_open(logdir, 0, &err);
    cr_assert(w2 && w3, "%s", err.msg);
    cr_expect_str_neq(mt_tb_path(w2), mt_tb_path(w3));
    mt_tb_close(w2), mt_tb_close(w3);
    free(path), free(logdir);
    mt_test_rmtree(dir);
    free(dir);
}

Test(tensorboard, a_row_gives_its_finite_fields_as_scalars) {
    mt_metrics_row r = mt_metrics_row_make(3);
    r.loss = 2.0, r.lr = 1e-4, r.tokens = 4096, r.grad_norm = INFINITY;
    mt_tb_scalar s[MT_METRICS_MAX_SCALARS];
    size_t n = mt_metrics_scalars(&r, s);
    cr_assert_eq(n, 3);
    cr_expect_str_eq(s[0].tag, "train/loss");
    cr_expect_str_eq(s[1].tag, "train/lr");
    cr_expect_eq(s[1].value, 1e-4f);
    cr_expect_str_eq(s[2].tag, "train/tokens");
    cr_expect_eq(s[2].value, 4096.0f);
    mt_metrics_row e = mt_metrics_row_make(4);
    e.eval_loss = 1.5, e.eval_tokens = 100, e.eval_time_s = 0.5;
    n = mt_metrics_scalars(&e, s);
    cr_assert_eq(n, 2);
    cr_expect(!strcmp(s[0].tag, "eval/loss") && s[0].value == 1.5f);
    cr_expect(!strcmp(s[1].tag, "eval/tokens") && s[1].value == 100.0f);
}

Test(tensorboard, an_unwritable_directory_is_an_error_naming_it) {
    char *dir = mt_test_tmpdir(), *file = mt_path_join(dir, "file");
    FILE *f = fopen(file, "w");
    fclose(f);
    char *logdir = mt_path_join(file, "tensorboard");
    mt_error err = {{0}};
    cr_assert_null(mt_tb_open(logdir, 1, &err));
    cr_expect(strstr(err.msg, "file"), "%s", err.msg);
    free(logdir), free(file);
    mt_test_rmtree(dir);
    free(dir);
}

/* Issue 29: a write that failed for want of room left part of a record,
 * which ends the file for every reader (TensorBoard stops at a bad CRC).
 * Under a file size limit (EFBIG, as ENOSPC would be), the failed write is
 * an error naming the file, and the file keeps whole records only. */
Test(tensorboard, a_failed_write_leaves_whole_records) {
    char *dir = mt_test_tmpdir(), *logdir = mt_path_join(dir, "tensorboard");
    mt_error err = {{0}};
    mt_tb_writer *w = mt_tb_open(logdir, 1, &err);
    cr_assert(w, "%s", err.msg);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 1000; /* a few records of 14 scalars */
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    mt_metrics_row row = mt_metrics_row_make(0);
    row.loss = row.lr = row.grad_norm = row.epoch = row.tokens_per_s = row.tflops = 1.5;
    row.step_time_s = row.h2d_gbps = row.d2h_gbps = row.gpu_mem_gb = row.host_mem_gb = 2.5;
    row.tokens = 4096;
    mt_tb_scalar s[MT_METRICS_MAX_SCALARS];
    size_t n = mt_metrics_scalars(&row, s);
    int step = 1, rc;
    while ((rc = mt_tb_write_scalars(w, step, s, n, &err)) == 0 && step < 100) step++;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(rc, -1, "no write failed under a 1000-byte limit");
    cr_assert(strstr(err.msg, mt_tb_path(w)) && strstr(err.msg, "File too large"), "%s",
              err.msg);
    Tensorboard__Event *ev[128];
    size_t got = read_events(mt_tb_path(w), ev, 128); /* asserts every record whole */
    cr_assert_eq(got, (size_t)(2 + step - 1), "version, session start and the steps written");
    for (size_t i = 0; i < got; i++) tensorboard__event__free_unpacked(ev[i], NULL);
    mt_tb_close(w);
    free(logdir);
    mt_test_rmtree(dir);
    free(dir);
}
