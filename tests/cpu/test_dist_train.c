/* Training runs of several ranks on the CPU (`megatrain train --gpus N
 * --device cpu`: N processes, each holding its part of every layer, the
 * weights gathered and the gradient summed over the rendezvous' sockets):
 * the same losses as one process, checkpoints of n ranks resumed on any
 * other number, a rank that dies stopping the others with its name, and a
 * signal stopping every rank with a complete checkpoint. The GPU path
 * (NCCL) has the same tests in tests/gpu. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/file.h"
#include "testlib.h"

#define STEPS 16

/* The loss of each step of out/metrics.jsonl (training rows) into loss
 * (by step number, 1..n); returns the rows read. */
static int read_losses(const char *out, double *loss, int n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        const char *s = strstr(line, "\"step\":"), *l = strstr(line, "\"loss\":");
        if (!s || !l) continue;
        int step = atoi(s + 7);
        if (step >= 1 && step <= n) loss[step - 1] = strtod(l + 7, NULL), rows++;
    }
    fclose(f);
    return rows;
}

/* megatrain train on the built-in model in fp32, 4 micro-batches a step,
 * as `ranks` processes (1: alone), with extra arguments. */
static int train(const char *out, int ranks, const char *extra1, const char *extra2) {
    char steps[16], gpus[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    snprintf(gpus, sizeof gpus, "%d", ranks);
    char *argv[32] = {"train", "--device", "cpu", "--precision", "fp32", "--micro-batches",
                      "4", "--batch-size", "2", "--seq-len", "32", "--steps", steps,
                      "--save-every", "8", "--out", (char *)out, "--gpus", gpus};
    int n = 19;
    if (extra1) argv[n++] = (char *)extra1;
    if (extra2) argv[n++] = (char *)extra2;
    argv[n] = NULL;
    return mt_test_cli(argv);
}

/* The ranks' losses differ from one process's only by the order of the
 * gradient's fp32 sums (each rank adds its micro-batches, then rank 0 adds
 * the ranks'): measured within 3e-9 relative over these steps; 1e-6 is the
 * bound the design promises (reduction order only). */
static void assert_close(const double *want, const double *got, int from, int to,
                         const char *what) {
    for (int s = from; s < to; s++) {
        double rel = fabs(got[s] - want[s]) / fabs(want[s]);
        cr_assert(rel <= 1e-6, "%s: step %d loss %.9g, one process %.9g (rel %.2g)", what, s + 1,
                  got[s], want[s], rel);
    }
}

Test(dist_train, ranks_train_as_one_process, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), a[512], b[512], c[512];
    snprintf(a, sizeof a, "%s/one", dir);
    snprintf(b, sizeof b, "%s/two", dir);
    snprintf(c, sizeof c, "%s/four", dir);
    cr_assert_eq(train(a, 1, NULL, NULL), 0);
    cr_assert_eq(train(b, 2, NULL, NULL), 0);
    cr_assert_eq(train(c, 4, NULL, NULL), 0);
    double la[STEPS], lb[STEPS], lc[STEPS];
    cr_assert_eq(read_losses(a, la, STEPS), STEPS);
    cr_assert_eq(read_losses(b, lb, STEPS), STEPS, "rank 0 writes one row per step");
    cr_assert_eq(read_losses(c, lc, STEPS), STEPS);
    cr_assert(la[STEPS - 1] < la[0] - 0.1, "the model learns: %g -> %g", la[0], la[STEPS - 1]);
    assert_close(la, lb, 0, STEPS, "2 ranks");
    assert_close(la, lc, 0, STEPS, "4 ranks");
    /* the saved models hold the same weights up to the same rounding: same files as HF sees */
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    cr_assert(mt_file_exists(pa) && mt_file_exists(pb));
    mt_test_rmtree(dir);
    free(dir);
}

/* A checkpoint of 4 ranks resumed on 2 and on 1, and one of 1 resumed on
 * 4, continue as the uninterrupted run. */
Test(dist_train, checkpoints_resume_on_any_number_of_ranks, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), full[512], path[2000];
    snprintf(full, sizeof full, "%s/four", dir);
    cr_assert_eq(train(full, 4, NULL, NULL), 0);
    double want[STEPS];
    cr_assert_eq(read_losses(full, want, STEPS), STEPS);
    int ranks[3][2] = {{4, 2}, {4, 1}, {1, 4}}; /* saved by, resumed on */
    for (int i = 0; i < 3; i++) {
        char saved[512], out[512];
        snprintf(saved, sizeof saved, "%s/saved%d", dir, i);
        snprintf(out, sizeof out, "%s/resumed%d", dir, i);
        if (ranks[i][0] == 4)
            snprintf(path, sizeof path, "mkdir -p %s/checkpoints && cp -r %s/checkpoints/"
                     "step-00000008 %s/checkpoints/", out, full, out);
        else /* a one-process run's checkpoint at step 8 */
            snprintf(path, sizeof path, "mkdir -p %s/checkpoints && cp -r %s/checkpoints/"
                     "step-00000008 %s/checkpoints/", out, saved, out);
        if (ranks[i][0] == 1) cr_assert_eq(train(saved, 1, NULL, NULL), 0);
        cr_assert_eq(system(path), 0);
        cr_assert_eq(train(out, ranks[i][1], "--resume", "auto"), 0, "resume on %d ranks",
                     ranks[i][1]);
        double got[STEPS];
        for (int s = 0; s < STEPS; s++) got[s] = want[s];
        cr_assert_eq(read_losses(out, got, STEPS), STEPS - 8, "steps 9..16 logged once each");
        char what[64];
        snprintf(what, sizeof what, "%d ranks' checkpoint on %d", ranks[i][0], ranks[i][1]);
        assert_close(want, got, 8, STEPS, what);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* A checkpoint of 2 ranks resumed by one process whose last layers keep
 * their Adam state on disk: the state of those layers goes to the disk, and
 * the run continues as the uninterrupted one. */
Test(dist_train, a_ranks_checkpoint_resumes_with_a_disk_tier, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), full[512], out[512], disk[512], cmd[4096];
    snprintf(full, sizeof full, "%s/two", dir);
    snprintf(out, sizeof out, "%s/resumed", dir);
    snprintf(disk, sizeof disk, "%s/nvme", dir);
    cr_assert_eq(train(full, 2, NULL, NULL), 0);
    double want[STEPS], got[STEPS];
    cr_assert_eq(read_losses(full, want, STEPS), STEPS);
    snprintf(cmd, sizeof cmd, "mkdir -p %s %s/checkpoints && cp -r %s/checkpoints/step-00000008 "
             "%s/checkpoints/", disk, out, full, out);
    cr_assert_eq(system(cmd), 0);
    char *argv[32] = {"train", "--device", "cpu", "--precision", "fp32", "--micro-batches",
                      "4", "--batch-size", "2", "--seq-len", "32", "--steps", "16",
                      "--save-every", "8", "--out", out, "--resume", "auto", "--nvme-dir", disk,
                      "--disk-layers", "3", NULL};
    cr_assert_eq(mt_test_cli(argv), 0);
    for (int s = 0; s < STEPS; s++) got[s] = want[s];
    cr_assert_eq(read_losses(out, got, STEPS), STEPS - 8, "steps 9..16 logged once each");
    assert_close(want, got, 8, STEPS, "2 ranks' checkpoint on one process with 3 disk layers");
    mt_test_rmtree(dir);
    free(dir);
}

/* `train` on `ranks` processes whose last 3 layers keep their parts of the
 * Adam state on disk (a directory of each run's own), with extra arguments;
 * its output must say so. */
static int train_disk(const char *out, int ranks, const char *extra1, const char *extra2) {
    char steps[16], gpus[16], disk[600];
    snprintf(steps, sizeof steps, "%d", STEPS);
    snprintf(gpus, sizeof gpus, "%d", ranks);
    snprintf(disk, sizeof disk, "%s.nvme", out);
    mt_error me;
    if (mt_mkdirs(disk, &me)) return -1;
    char *argv[32] = {"train", "--device", "cpu", "--precision", "fp32", "--micro-batches",
                      "4", "--batch-size", "2", "--seq-len", "32", "--steps", steps,
                      "--save-every", "8", "--out", (char *)out, "--gpus", gpus,
                      "--nvme-dir", disk, "--disk-layers", "3"};
    int n = 23;
    if (extra1) argv[n++] = (char *)extra1;
    if (extra2) argv[n++] = (char *)extra2;
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int rc = mt_test_cli_output(argv, &o, &e);
    if (rc == 0 && !strstr(o, "disk tier: the optimizer state of the last 3 layers")) rc = -1;
    free(o), free(e);
    return rc;
}

/* Two ranks whose last 3 layers keep their parts of m and v on disk: the
 * losses of the ranks in RAM, bit for bit (the disk holds the same floats);
 * their checkpoint resumed on 2 ranks with the disk tier and on one process,
 * and one process's checkpoint resumed on 2 ranks with it, continue as the
 * uninterrupted run. */
Test(dist_train, ranks_keep_their_adam_state_on_disk, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), ram[512], disk[512], path[2000];
    snprintf(ram, sizeof ram, "%s/ram", dir);
    snprintf(disk, sizeof disk, "%s/disk", dir);
    cr_assert_eq(train(ram, 2, NULL, NULL), 0);
    cr_assert_eq(train_disk(disk, 2, NULL, NULL), 0, "2 ranks with 3 disk layers");
    double want[STEPS], got[STEPS];
    cr_assert_eq(read_losses(ram, want, STEPS), STEPS);
    cr_assert_eq(read_losses(disk, got, STEPS), STEPS);
    for (int s = 0; s < STEPS; s++)
        cr_assert(got[s] == want[s], "step %d: %.9g with the disk tier, %.9g in RAM", s + 1,
                  got[s], want[s]);
    const char *how[3] = {"2 ranks with the disk tier", "one process",
                          "a one-process checkpoint on 2 ranks with the disk tier"};
    for (int i = 0; i < 3; i++) {
        char out[512], one[512];
        snprintf(out, sizeof out, "%s/resumed%d", dir, i);
        snprintf(one, sizeof one, "%s/one", dir);
        if (i == 2) cr_assert_eq(train(one, 1, NULL, NULL), 0);
        snprintf(path, sizeof path, "mkdir -p %s/checkpoints && cp -r %s/checkpoints/"
                 "step-00000008 %s/checkpoints/", out, i == 2 ? one : disk, out);
        cr_assert_eq(system(path), 0);
        int rc = i == 1 ? train(out, 1, "--resume", "auto")
                        : train_disk(out, 2, "--resume", "auto");
        cr_assert_eq(rc, 0, "resume: %s", how[i]);
        for (int s = 0; s < STEPS; s++) got[s] = want[s];
        cr_assert_eq(read_losses(out, got, STEPS), STEPS - 8, "steps 9..16 logged once each");
        if (i == 0) /* the same ranks, the same arithmetic */
            for (int s = 8; s < STEPS; s++)
                cr_assert(got[s] == want[s], "%s: step %d %.9g, uninterrupted %.9g", how[i],
                          s + 1, got[s], want[s]);
        assert_close(want, got, 8, STEPS, how[i]);
    }
    mt_test_rmtree(dir);
    free(dir);
}

Test(dist_train, a_batch_the_ranks_cannot_share_is_refused, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    /* 4 micro-batches on 3 ranks */
    cr_assert_neq(train(out, 3, NULL, NULL), 0);
    mt_test_rmtree(dir);
    free(dir);
}

/* Pids of the children of process p (the launcher's ranks). */
static int children_of(pid_t p, pid_t *out, int cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)p, (int)p);
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) return 0;
    int c;
    while (n < cap && fscanf(f, "%d", &c) == 1) out[n++] = c;
    fclose(f);
    return n;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Starts a long run of 2 ranks and waits until it has logged a step. */
static pid_t start_long_run(const char *out) {
    char *argv[] = {"train", "--device", "cpu", "--precision", "fp32", "--micro-batches", "2",
                    "--batch-size", "8", "--seq-len", "64", "--steps", "100000", "--save-every",
                    "0", "--log-every", "1", "--out", (char *)out, "--gpus", "2", NULL};
    pid_t p = mt_test_cli_start(argv);
    cr_assert(p > 0);
    double l[2];
    for (int i = 0; i < 600 && read_losses(out, l, 2) < 2; i++) sleep_ms(100);
    cr_assert_eq(read_losses(out, l, 2), 2, "the run did not start");
    return p;
}

static int no_temporary_saves(const char *out) {
    char ck[600];
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    DIR *d = opendir(ck);
    if (!d) return 1;
    struct dirent *e;
    int clean = 1;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, ".tmp", 4)) clean = 0;
    closedir(d);
    return clean;
}

Test(dist_train, a_rank_that_dies_stops_the_others, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    pid_t launcher = start_long_run(out);
    pid_t ranks[4];
    cr_assert_eq(children_of(launcher, ranks, 4), 2, "two ranks");
    kill(ranks[1], SIGKILL); /* the second rank, by start order */
    int st;
    cr_assert_eq(waitpid(launcher, &st, 0), launcher);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "the run must fail, status %d", st);
    for (int i = 0; i < 2; i++)
        cr_assert(kill(ranks[i], 0) != 0, "rank %d is still running", i);
    cr_assert(no_temporary_saves(out));
    mt_test_rmtree(dir);
    free(dir);
}

Test(dist_train, a_signal_stops_every_rank_with_a_checkpoint, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512], path[1200];
    snprintf(out, sizeof out, "%s/run", dir);
    pid_t launcher = start_long_run(out);
    kill(launcher, SIGINT);
    int st;
    cr_assert_eq(waitpid(launcher, &st, 0), launcher);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 130, "stopped by a signal: status %d", st);
    /* every rank wrote its shard of one complete checkpoint */
    DIR *d = NULL;
    snprintf(path, sizeof path, "%s/checkpoints", out);
    cr_assert((d = opendir(path)) != NULL);
    struct dirent *e;
    int complete = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step-", 5)) continue;
        snprintf(path, sizeof path, "%s/checkpoints/%s/shard-00001-of-00002.safetensors", out,
                 e->d_name);
        complete += mt_file_exists(path);
    }
    closedir(d);
    cr_assert_eq(complete, 1, "one checkpoint with both ranks' shards");
    cr_assert(no_temporary_saves(out));
    mt_test_rmtree(dir);
    free(dir);
}

/* A rank that stops answering (SIGSTOP: alive, but stuck) fails the others
 * within the rendezvous' timeout, and the launcher ends the run. */
Test(dist_train, a_rank_that_hangs_stops_the_run_within_the_timeout,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    setenv("MT_DIST_TIMEOUT", "4", 1);
    pid_t launcher = start_long_run(out);
    pid_t ranks[4];
    cr_assert_eq(children_of(launcher, ranks, 4), 2, "two ranks");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(ranks[1], SIGSTOP);
    int st;
    cr_assert_eq(waitpid(launcher, &st, 0), launcher);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "the run must fail, status %d", st);
    /* the timeout, then the stuck rank, woken and told to stop, fails its collective */
    cr_assert(waited < 4 + 15, "took %.0f s", waited);
    for (int i = 0; i < 2; i++) cr_assert(kill(ranks[i], 0) != 0, "rank %d still there", i);
    cr_assert(no_temporary_saves(out));
    mt_test_rmtree(dir);
    free(dir);
}
