/* A user's size is refused with the numbers before anything is allocated,
 * never answered by an out-of-memory abort (train/train_memory.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_config.h"
#include "train/train_memory.h"
#include "train/trainer.h"
#include "model/params.h"
#include "testlib.h"

static void config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 --device cpu %s",
                                    out, extra), 0, "%s", err.msg);
}

/* Runs train with extra options; it must fail with a message holding each of want[]. */
static void refused(const char *extra, const char *const *want, int n_want) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, extra);
    cr_assert_eq(mt_train(&tc, &err), -1, "%s was not refused", extra);
    for (int i = 0; i < n_want; i++)
        cr_assert(strstr(err.msg, want[i]), "%s: the message lacks \"%s\": %s", extra, want[i],
                  err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

Test(host_memory, a_huge_seq_len_on_the_cpu_is_refused_not_an_abort) {
    const char *want[] = {"seq_len 100000000", "--seq-len"};
    refused("--seq-len 100000000", want, 2);
}

Test(host_memory, a_huge_batch_size_on_the_cpu_is_refused_with_the_numbers) {
    const char *want[] = {"GB of host RAM", "GB are available", "CPU activations",
                          "2 x 1000000000 x 64 tokens", "use --batch-size"};
    refused("--batch-size 1000000000", want, 5);
}

Test(host_memory, sizes_that_overflow_64_bits_are_refused) {
    const char *want[] = {"overflow 64 bits", "--batch-size"};
    refused("--micro-batches 1000000000 --batch-size 1000000000 --seq-len 100000", want, 2);
}

/* The fix the message proposes is the largest batch size that fits. */
Test(host_memory, the_proposed_batch_size_is_the_largest_that_fits) {
    mt_train_config tc;
    config(&tc, "/nonexistent-out", "--batch-size 64 --seq-len 256");
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.max_pos = 256;
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_train_host_bytes b;
    cr_assert_eq(mt_train_host_bytes_compute(&tc, &cfg, &t, 1, 1, &b, &err), 0, "%s", err.msg);
    size_t avail = b.total / 3;
    cr_assert_eq(mt_train_check_host_memory(&tc, &cfg, &t, 1, 1, avail, 0, &err), -1);
    const char *p = strstr(err.msg, "use --batch-size ");
    cr_assert(p, "%s", err.msg);
    long long best = atoll(p + strlen("use --batch-size "));
    cr_assert(best >= 1 && best < 64, "%s", err.msg);
    tc.batch_size = best;
    cr_assert_eq(mt_train_check_host_memory(&tc, &cfg, &t, 1, 1, avail, 0, &err), 0, "%s", err.msg);
    tc.batch_size = best + 1;
    cr_assert_eq(mt_train_check_host_memory(&tc, &cfg, &t, 1, 1, avail, 0, &err), -1);
    mt_params_free(&t);
}

/* Issue 29: --host-mem was not kept on the CPU: a run with --host-mem 0.05
 * trained (and --host-mem 1 reached 1.37 GB RSS). It is refused before
 * anything is allocated, naming both numbers; without the option the
 * same run trains. */
Test(host_memory, host_mem_is_kept_on_the_cpu) {
    const char *want[] = {"GB of host RAM", "--host-mem allows 0.05 GB", "model state",
                          "use --batch-size", "raise --host-mem"};
    refused("--host-mem 0.05 --batch-size 64 --seq-len 256 --steps 1", want, 5);
    mt_train_config tc;
    config(&tc, "/nonexistent-out", "--host-mem 0.05 --batch-size 64 --seq-len 256");
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.max_pos = 256;
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_train_host_bytes b;
    cr_assert_eq(mt_train_host_bytes_compute(&tc, &cfg, &t, 1, 1, &b, &err), 0, "%s", err.msg);
    cr_assert_gt(b.total, (size_t)50000000, "the run must need more than 0.05 GB: %zu", b.total);
    cr_assert_eq(mt_train_check_host_memory(&tc, &cfg, &t, 1, 1, 0, b.total, &err), 0, "%s",
                 err.msg);
    mt_params_free(&t);
}
