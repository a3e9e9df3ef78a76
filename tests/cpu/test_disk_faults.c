/* The disk tier's failures: a disk error in the middle of a run stops it
 * with an error naming the tier's directory, and the last checkpoint, saved
 * before, stays intact (the bytes of the same run without the error); a
 * run killed (SIGKILL) at a few moments and resumed with --resume auto ends
 * on the bits of the uninterrupted run. CPU runs of the built-in tiny
 * model, fp32, the m and v of the last 3 layers on disk. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "testlib.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "util/fault.h"

#define STEPS "40"

/* The run in RAM: every checkpoint (every 2 steps, all kept) and the model. */
static void ram_run(const char *out) {
    char *ram[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", STEPS,
                   "--save-every", "2", "--keep-last", "25", "--save-dtype", "fp32",
                   "--out", (char *)out, NULL};
    cr_assert_eq(mt_test_cli(ram), 0);
}

static int same_file(const char *a, const char *b) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A run with the disk tier whose n-th disk stripe fails: it must stop with
 * the tier's error, `during` in it ("" for the optimizer's own message),
 * its last checkpoint the RAM run's step 4. */
static void fail_at(const char *dir, const char *ram, long n, const char *during) {
    char out[600], nv[600];
    snprintf(out, sizeof out, "%s/disk-%ld", dir, n);
    snprintf(nv, sizeof nv, "%s/nvme-%ld", dir, n);
    cr_assert_eq(mkdir(nv, 0700), 0);
    mt_train_config tc;
    mt_error err;
    cr_assert_eq(mt_test_train_args(&tc, &err, "train --device cpu --precision fp32 --steps " STEPS
                                    " --save-every 4 --keep-last 25 --save-dtype fp32 "
                                    "--sample-tokens 0 --out %s --nvme-dir %s --disk-layers 3",
                                    out, nv), 0, "%s", err.msg);
    mt_fault_arm(MT_FAULT_DISK, n);
    int rc = mt_train(&tc, &err);
    long left = mt_fault_pending(MT_FAULT_DISK);
    mt_fault_arm(MT_FAULT_DISK, 0);
    cr_assert_eq(left, 0, "the armed failure never came (%ld transfers left)", left);
    cr_assert_neq(rc, 0, "a disk error must stop the run");
    cr_assert(strstr(err.msg, nv) && strstr(err.msg, "Input/output error") &&
                  strstr(err.msg, "last checkpoint is intact"),
              "the error names the tier's directory and the reason: %s", err.msg);
    cr_assert(*during ? strstr(err.msg, during) != NULL : strstr(err.msg, "saving") == NULL,
              "stripe %ld fails elsewhere than expected (%s): %s", n,
              *during ? during : "the optimizer", err.msg);
    char found[1024], a[1400], b[1400];
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    const char *step = strrchr(found, '/') + 1;
    cr_assert_str_eq(step, "step-00000004", "the last checkpoint");
    const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/checkpoints/%s/%s", ram, step, files[i]);
        snprintf(b, sizeof b, "%s/%s", found, files[i]);
        cr_assert(same_file(a, b), "%s of the last checkpoint (%s) is not the RAM run's", files[i],
                  step);
    }
}

/* Each of the 3 disk layers moves one read and one write a step, a save
 * reads them: the 40th stripe falls in the optimizer between the saves of
 * steps 4 and 8, the 58th in the save of step 8 (counted on this model). */
Test(disk_faults, a_disk_error_stops_the_run_and_keeps_the_last_checkpoint,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), ram[600];
    snprintf(ram, sizeof ram, "%s/ram", dir);
    ram_run(ram);
    fail_at(dir, ram, 40, "");
    fail_at(dir, ram, 58, "saving checkpoint step 8");
    mt_test_rmtree(dir);
    free(dir);
}

Test(disk_faults, a_killed_run_resumes_to_the_same_bits, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), ram[600], nv[600];
    snprintf(ram, sizeof ram, "%s/ram", dir);
    snprintf(nv, sizeof nv, "%s/nvme", dir);
    cr_assert_eq(mkdir(nv, 0700), 0);
    ram_run(ram);
    /* killed as its step-4 checkpoint appears, and 30 and 90 ms after (a
     * step takes about 12 ms) */
    int delays_ms[] = {0, 30, 90};
    for (int k = 0; k < 3; k++) {
        char out[700], first[800], a[1400], b[1400];
        snprintf(out, sizeof out, "%s/run%d", dir, k);
        snprintf(first, sizeof first, "%s/checkpoints/step-00000004", out);
        char *run[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", STEPS,
                       "--save-every", "2", "--keep-last", "25", "--save-dtype", "fp32", "--out",
                       out, "--nvme-dir", nv, "--disk-layers", "3", "--resume", "auto", NULL};
        pid_t pid = mt_test_cli_start(run);
        cr_assert_gt(pid, 0);
        for (int i = 0; i < 3000 && !exists(first); i++) usleep(10000);
        usleep(1000 * delays_ms[k]);
        kill(pid, SIGKILL);
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(exists(first), "no step-4 checkpoint in 30 s");
        cr_assert(WIFSIGNALED(st), "run %d ended before the kill: make it longer", k);
        cr_assert_eq(mt_test_cli(run), 0, "the resume of run %d", k);
        snprintf(a, sizeof a, "%s/model/model.safetensors", ram);
        snprintf(b, sizeof b, "%s/model/model.safetensors", out);
        cr_assert(same_file(a, b), "run %d, killed %d ms after step 4's save, ends elsewhere", k,
                  delays_ms[k]);
        snprintf(a, sizeof a, "%s/checkpoints/step-000000" STEPS "/optimizer.safetensors", ram);
        snprintf(b, sizeof b, "%s/checkpoints/step-000000" STEPS "/optimizer.safetensors", out);
        cr_assert(same_file(a, b), "run %d's last Adam state differs", k);
    }
    mt_test_rmtree(dir);
    free(dir);
}
