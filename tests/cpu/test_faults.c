/* Injected failures (util/fault.h) of every write, fsync and rename of a
 * checkpoint save, one at a time: each save fails with a message, leaves
 * no temporary directory, the previous checkpoint still loads, and the
 * newest complete one is intact; an allocation failure of the host store is an error too. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_config.h"
#include "train/trainer.h"
#include "host/store.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/params.h"
#include "util/fault.h"
#include "testlib.h"

static int count_tmp(const char *ck) {
    DIR *d = opendir(ck);
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strncmp(e->d_name, ".tmp", 4) == 0;
    closedir(d);
    return n;
}

Test(faults, every_failing_write_fsync_and_rename_of_a_save_keeps_the_previous_one,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), ck[600], found[1024];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_host_store s;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s, &t, 0, &err), 0, "%s", err.msg);
    mt_host_store_init_random(&s, 1, 0.02f);
    cr_assert_eq(mt_checkpoint_save(dir, 1, &s, &cfg, "{\"x\":1}", 5, NULL, 0, &err), 0, "%s",
                 err.msg);
    const char *names[] = {"write", "fsync", "rename"};
    for (int k = MT_FAULT_WRITE; k <= MT_FAULT_RENAME; k++) {
        int failures = 0;
        for (long n = 1;; n++) {
            mt_fault_arm((mt_fault_kind)k, n);
            err.msg[0] = 0;
            int rc = mt_checkpoint_save(dir, 2, &s, &cfg, "{\"x\":2}", 5, NULL, 0, &err);
            int hit = mt_fault_pending((mt_fault_kind)k) == 0;
            mt_fault_arm((mt_fault_kind)k, 0);
            if (rc == 0) {
                /* the fault may hit the prune after the publish: still a complete save */
                cr_assert(n > 1, "%s: no call was failed", names[k]);
                break;
            }
            failures++;
            cr_assert(hit, "%s %ld: the save failed without the fault", names[k], n);
            cr_assert(strstr(err.msg, "earlier checkpoints are untouched"), "%s %ld: %s",
                      names[k], n, err.msg);
            cr_assert_eq(count_tmp(ck), 0, "%s %ld: a temporary directory stayed", names[k], n);
            /* a failed fsync after the publish may leave step 2, then complete and intact */
            cr_assert_eq(mt_checkpoint_find_latest(dir, found, sizeof found, &err), 0);
            cr_assert_eq(mt_checkpoint_verify(found, &err), 0, "%s %ld: %s", names[k], n, err.msg);
            snprintf(found, sizeof found, "%s/step-00000001", ck);
            char *js;
            cr_assert_eq(mt_checkpoint_load(found, &s, &cfg, &js, &err), 0, "%s %ld: %s",
                         names[k], n, err.msg);
            free(js);
        }
        cr_assert_gt(failures, 1, "%s: every call site was failed once", names[k]);
        /* the completed save of step 2 goes, for the next kind */
        char p[700];
        snprintf(p, sizeof p, "rm -rf %s/step-00000002", ck);
        cr_assert_eq(system(p), 0);
    }
    /* the host store's allocation */
    mt_host_store s2;
    mt_fault_arm(MT_FAULT_ALLOC, 1);
    cr_assert_eq(mt_host_store_create(&s2, &t, 1, &err), -1);
    mt_fault_arm(MT_FAULT_ALLOC, 0);
    cr_assert(strstr(err.msg, "host memory"), "%s", err.msg);
    mt_host_store_free(&s);
    mt_params_free(&t);
    mt_test_rmtree(dir);
    free(dir);
}

/* The trainer passes a failed save on: non-zero, with the message. */
Test(faults, a_failed_save_stops_train_with_an_error, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    cr_assert_eq(mt_test_train_args(&tc, &err, "train --out %s --sample-tokens 0 --steps 4 "
                                    "--save-every 2", out), 0, "%s", err.msg);
    mt_fault_arm(MT_FAULT_FSYNC, 3);
    cr_assert_eq(mt_train(&tc, &err), -1);
    mt_fault_arm(MT_FAULT_FSYNC, 0);
    cr_assert(strstr(err.msg, "fsync") || strstr(err.msg, "sync"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}
