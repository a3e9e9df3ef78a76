/* Preference objectives on several CPU ranks (`megatrain train --gpus N
 * --device cpu`): DPO and ORPO on 1, 2 and 4 ranks with the same global
 * batch give the same losses and metrics, the reference log-probabilities
 * every rank computes its share of are the one-process ones, and a run of
 * two ranks resumed from its checkpoint continues bitwise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file.h"
#include "testlib.h"

#define STEPS 6
#define KEYS 7

static const char *const keys[KEYS] = {"loss", "rewards/chosen", "rewards/rejected",
                                       "rewards/margins", "rewards/accuracies",
                                       "logps/chosen", "logps/rejected"};

/* n pairs of prompts and answers of varied lengths. */
static void write_pairs(const char *path, int n) {
    static const char *const words = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": \"%.*s\", \"chosen\": \" %.*s\", \"rejected\": \" %.*s\"}\n",
                3 + i % 7, words + i % 5, 2 + (i * 3) % 11, words + 20, 1 + (i * 5) % 9,
                words + 7);
    fclose(f);
}

/* megatrain train of objective obj on the built-in model in fp32, 4
 * micro-batches a step, as `ranks` processes, with held-out pairs
 * evaluated every 2 steps and a checkpoint every 3. */
static int train(const char *dir, const char *out, const char *obj, int ranks,
                 const char *extra) {
    char data[600], held[600], gpus[16], steps[16];
    snprintf(data, sizeof data, "%s/pairs.jsonl", dir);
    snprintf(held, sizeof held, "%s/held.jsonl", dir);
    snprintf(gpus, sizeof gpus, "%d", ranks);
    snprintf(steps, sizeof steps, "%d", STEPS);
    char *argv[48] = {"train", "--device", "cpu", "--precision", "fp32", "--gpus", gpus,
                      "--objective", (char *)obj, "--beta", "0.5", "--data", data,
                      "--eval-data", held, "--eval-every", "2", "--micro-batches", "4",
                      "--batch-size", "2", "--seq-len", "48", "--steps", steps, "--epochs", "3",
                      "--save-every", "3", "--save-dtype", "fp32", "--sample-tokens", "0",
                      "--out", (char *)out};
    int n = 35;
    if (extra) argv[n++] = (char *)extra, argv[n++] = "auto";
    argv[n] = NULL;
    return mt_test_cli(argv);
}

/* The value of "prefix+key" in each row of out/metrics.jsonl that has it,
 * by step (1..STEPS) into v[key][step - 1]; prefix "" (training rows) or
 * "eval_". Returns the rows read. */
static int read_metrics(const char *out, const char *prefix, double v[KEYS][STEPS]) {
    char path[700], line[4096], want[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        int step = atoi(strstr(line, "\"step\":") + 7), got = 0;
        for (int k = 0; k < KEYS && step >= 1 && step <= STEPS; k++) {
            snprintf(want, sizeof want, "\"%s%s\":", prefix, keys[k]);
            const char *p = strstr(line, want);
            if (p) v[k][step - 1] = strtod(p + strlen(want), NULL), got = 1;
        }
        rows += got;
    }
    fclose(f);
    return rows;
}

/* The ranks differ from one process only by the order of the sums (each
 * rank adds its micro-batches' gradients, then the ranks' are added; the
 * metrics' sums likewise), as tests/cpu/test_dist_train.c: losses and
 * log-probabilities within 1e-6 relative. A DPO reward is beta times a
 * difference of log-probabilities of some 50 (the logps), so its rounding
 * is theirs, not its own size: within 1e-6 of beta * |logps/chosen| (ORPO's
 * rewards are smaller, lambda times per-token means: the same bound holds
 * with room). Measured over these runs: 1.8e-7 relative for losses and
 * log-probabilities, 7e-9 of beta * |logps| for rewards. */
static void assert_close(double want[KEYS][STEPS], double got[KEYS][STEPS], const char *what) {
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < KEYS; k++) {
            double scale = k >= 1 && k <= 3 ? 0.5 * fabs(want[5][s]) : fabs(want[k][s]);
            cr_assert(fabs(got[k][s] - want[k][s]) <= 1e-6 * scale + 1e-12,
                      "%s: step %d %s %.9g, one process %.9g", what, s + 1, keys[k],
                      got[k][s], want[k][s]);
        }
}

static void same_as_one_rank(const char *obj) {
    char *dir = mt_test_tmpdir(), p[600], out[3][600];
    snprintf(p, sizeof p, "%s/pairs.jsonl", dir);
    write_pairs(p, 24);
    snprintf(p, sizeof p, "%s/held.jsonl", dir);
    write_pairs(p, 9);
    static const int ranks[3] = {1, 2, 4};
    double v[3][2][KEYS][STEPS];
    for (int i = 0; i < 3; i++) {
        snprintf(out[i], sizeof out[i], "%s/r%d", dir, ranks[i]);
        cr_assert_eq(train(dir, out[i], obj, ranks[i], NULL), 0, "%s on %d ranks", obj,
                     ranks[i]);
        cr_assert_eq(read_metrics(out[i], "", v[i][0]), STEPS, "rank 0 writes a row a step");
        cr_assert_eq(read_metrics(out[i], "eval_", v[i][1]), STEPS / 2);
    }
    cr_assert(v[0][0][0][STEPS - 1] < v[0][0][0][0] - 0.1, "%s learns: %g -> %g", obj,
              v[0][0][0][0], v[0][0][0][STEPS - 1]);
    for (int i = 1; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s, %d ranks", obj, ranks[i]);
        assert_close(v[0][0], v[i][0], what);
        snprintf(what, sizeof what, "%s eval, %d ranks", obj, ranks[i]);
        /* an evaluation every 2 steps: steps 2, 4, 6 */
        for (int k = 0; k < KEYS; k++)
            for (int s = 0; s < STEPS; s += 2) v[0][1][k][s] = v[i][1][k][s] = 1;
        assert_close(v[0][1], v[i][1], what);
    }
    mt_test_rmtree(dir);
    free(dir);
}

Test(pref_ranks, dpo_on_1_2_and_4_ranks_trains_as_one_process, .timeout = MT_TEST_LIMIT(300)) {
    same_as_one_rank("dpo");
}

Test(pref_ranks, orpo_on_1_2_and_4_ranks_trains_as_one_process, .timeout = MT_TEST_LIMIT(300)) {
    same_as_one_rank("orpo");
}

/* The file's log-probabilities (after its 32-byte header, before its
 * checksum and end mark) of out. */
static char *ref_values(const char *out, const char *name, size_t *n) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", out, name);
    char *buf = NULL;
    size_t len = 0;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert(len > 48);
    *n = len - 48;
    memmove(buf, buf + 32, *n);
    return buf;
}

/* Each rank computes the pairs of its micro-batches and the values are
 * added over the ranks (each comes from one rank): the same bits as one
 * process, in both sets' files, which rank 0 writes. */
Test(pref_ranks, the_reference_pass_of_two_ranks_is_the_one_process_pass,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), p[600], one[600], two[600];
    snprintf(p, sizeof p, "%s/pairs.jsonl", dir);
    write_pairs(p, 24);
    snprintf(p, sizeof p, "%s/held.jsonl", dir);
    write_pairs(p, 9);
    snprintf(one, sizeof one, "%s/one", dir);
    snprintf(two, sizeof two, "%s/two", dir);
    cr_assert_eq(train(dir, one, "dpo", 1, NULL), 0);
    cr_assert_eq(train(dir, two, "dpo", 2, NULL), 0);
    static const char *const files[2] = {"reference_logps.bin", "reference_logps_eval.bin"};
    for (int i = 0; i < 2; i++) {
        size_t na, nb;
        char *a = ref_values(one, files[i], &na), *b = ref_values(two, files[i], &nb);
        cr_assert(na == nb && !memcmp(a, b, na), "%s differs", files[i]);
        free(a), free(b);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* A run of two ranks stopped after its checkpoint at step 3 and resumed
 * gives the uninterrupted run's model and metrics, bitwise. */
Test(pref_ranks, a_resumed_two_rank_dpo_run_continues_bitwise, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), p[600], a[600], b[600], cmd[2000];
    snprintf(p, sizeof p, "%s/pairs.jsonl", dir);
    write_pairs(p, 24);
    snprintf(p, sizeof p, "%s/held.jsonl", dir);
    write_pairs(p, 9);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    cr_assert_eq(train(dir, a, "dpo", 2, NULL), 0);
    cr_assert_eq(train(dir, b, "dpo", 2, NULL), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoints/step-00000006 %s/model", b, b);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(train(dir, b, "dpo", 2, "--resume"), 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s/model/model.safetensors %s/model/model.safetensors", a,
             b);
    cr_assert_eq(system(cmd), 0, "the resumed model differs");
    double va[KEYS][STEPS], vb[KEYS][STEPS];
    cr_assert_eq(read_metrics(a, "", va), STEPS);
    cr_assert_eq(read_metrics(b, "", vb), STEPS);
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < KEYS; k++)
            cr_assert(va[k][s] == vb[k][s], "step %d %s: %.9g resumed, %.9g", s + 1, keys[k],
                      vb[k][s], va[k][s]);
    mt_test_rmtree(dir);
    free(dir);
}

/* The data's last step fills fewer micro-batches than there are ranks:
 * a rank with no pair still runs its part of the step (its weights all
 * zero), and the losses are still the one-process ones. */
Test(pref_ranks, a_rank_without_pairs_in_the_last_step_takes_part, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), p[600], one[600], four[600];
    snprintf(p, sizeof p, "%s/pairs.jsonl", dir);
    write_pairs(p, 5); /* 3 epochs of 5: the last step's pairs fill one micro-batch */
    snprintf(p, sizeof p, "%s/held.jsonl", dir);
    write_pairs(p, 2);
    snprintf(one, sizeof one, "%s/one", dir);
    snprintf(four, sizeof four, "%s/four", dir);
    cr_assert_eq(train(dir, one, "dpo", 1, NULL), 0);
    cr_assert_eq(train(dir, four, "dpo", 4, NULL), 0);
    double va[KEYS][STEPS], vb[KEYS][STEPS];
    int rows = read_metrics(one, "", va);
    cr_assert(rows >= 2 && rows < STEPS, "the data ends before step %d: %d rows", STEPS, rows);
    cr_assert_eq(read_metrics(four, "", vb), rows);
    for (int s = 0; s < rows; s++)
        cr_assert(fabs(vb[0][s] - va[0][s]) <= 1e-6 * fabs(va[0][s]),
                  "step %d loss %.9g, one process %.9g", s + 1, vb[0][s], va[0][s]);
    mt_test_rmtree(dir);
    free(dir);
}
