/* megatrain plan: a run that fits is planned, one that does not is refused
 * (exit 1), before anything is allocated. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static void quiet(void) { cr_redirect_stdout(); }

/* The plan sizes the CUDA backend with its own allocation plan, which is
 * plain C: every build plans, also one without CUDA. */
Test(plan, a_30b_model_fits_512_gib_with_host_gradients, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "6656", "--layers", "60", "--heads", "52", "--ffn", "17920",
                    "--vocab", "32000", "--host-ram-gb", "549", "--gpu-gb", "141", NULL};
    cr_assert_eq(mt_test_cli(argv), 0);
    fflush(stdout);
    cr_assert_stdout_neq_str("");
}

/* 12 blocks of Qwen3-30B-A3B at 64k tokens: the CPU optimizer over 8.1B
 * parameters outlasts the forward over 1.3B active ones, so the plan names
 * more micro-batches; a dense 7B at 64k tokens gains too little to say so. */
static int plan_says_more_tokens(char **argv) {
    cr_redirect_stdout();
    int rc = mt_test_cli(argv);
    fflush(stdout);
    cr_assert_eq(rc, 0);
    FILE *f = cr_get_redirected_stdout();
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f))
        found |= strstr(line, "more tokens per step: --micro-batches") != NULL;
    return found;
}

Test(plan, an_optimizer_bound_moe_step_names_more_micro_batches) {
    char *moe[] = {"plan", "--preset", "qwen3-30b-a3b", "--layers", "12", "--gpu-mem", "139",
                   "--host-mem", "125", NULL};
    cr_assert(plan_says_more_tokens(moe));
}

Test(plan, a_compute_bound_dense_step_names_nothing) {
    char *dense[] = {"plan", "--preset", "7b", "--gpu-mem", "139", "--host-mem", "125", NULL};
    cr_assert_not(plan_says_more_tokens(dense));
}
/* The machine someone sizes a purchase on, with or without a GPU: the
 * planner's verdict on a described one (at 64k tokens a step this 70B
 * needs about 1050 GB of host memory beside 80 GB of GPU: refused, naming
 * the budgets; it fits with a quarter of them). */
static int plan_output_has(char **argv, int want_rc, const char *a, const char *b) {
    cr_redirect_stdout();
    int rc = mt_test_cli(argv);
    fflush(stdout);
    cr_assert_eq(rc, want_rc);
    FILE *f = cr_get_redirected_stdout();
    char line[2048];
    int found = 0;
    while (fgets(line, sizeof line, f))
        found |= (strstr(line, a) != NULL) | (strstr(line, b) != NULL) << 1;
    return found == 3;
}

Test(plan, a_70b_model_is_planned_for_a_described_machine) {
    char *big[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000", NULL};
    cr_assert(plan_output_has(big, 1, "budgets: GPU 80.0 GB (given), host 1000.0 GB",
                              "does not fit: the two budgets together are short"));
}

Test(plan, a_70b_model_fits_a_described_machine_with_fewer_tokens) {
    char *fewer[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000",
                     "--micro-batches", "1", NULL};
    cr_assert(plan_output_has(fewer, 0, "budgets: GPU 80.0 GB (given)", "PLAN model=70.55B"));
}

/* A refusal names a step that fits, predicted as its own plan predicts it:
 * the 70B's refusal above names --micro-batches 1 at that plan's step_s;
 * a GPU budget short of one micro-batch's activations names smaller
 * micro-batches; budgets nothing fits say so. */
static char *plan_stdout(char **argv, int want_rc) {
    char *out, *err;
    cr_assert_eq(mt_test_cli_output(argv, &out, &err), want_rc, "%s", err);
    free(err);
    return out;
}

/* gpt_neox, falcon, gemma2 and gemma3_text run on the GPU: their plans are
 * their own, without the note of a family with CPU references only. */
Test(plan, a_gpu_family_gets_no_cpu_only_note) {
    const char *presets[] = {"pythia-1b", "falcon-7b", "gemma2-2b", "gemma3-1b"};
    for (int i = 0; i < 4; i++) {
        char *argv[] = {"plan", "--preset", (char *)presets[i], "--gpu-mem", "80", "--host-mem",
                        "125", NULL};
        char *out = plan_stdout(argv, 0);
        cr_expect(strstr(out, "PLAN model="), "%s", out);
        cr_expect_null(strstr(out, "CPU only"), "%s: %s", presets[i], out);
        free(out);
    }
}

/* Gemma's blocks keep their activations on the GPU in bf16 (gemma_cuda.c's
 * bf16 path) where there is memory to spare, and none in fp32 (that path
 * recomputes them). */
Test(plan, gemma_keeps_activations_in_bf16_only) {
    const char *presets[] = {"gemma2-2b", "gemma3-1b"};
    for (int i = 0; i < 2; i++)
        for (int fp32 = 0; fp32 < 2; fp32++) {
            char *argv[] = {"plan", "--preset", (char *)presets[i], "--gpu-mem", "141",
                            "--host-mem", "125", "--seq-len", "1024", "--precision",
                            fp32 ? "fp32" : "bf16", NULL};
            char *out = plan_stdout(argv, 0);
            cr_expect(strstr(out, "PLAN model="), "%s", out);
            if (fp32) cr_expect_null(strstr(out, "activations kept"), "%s: %s", presets[i], out);
            else cr_expect(strstr(out, "activations kept"), "%s: %s", presets[i], out);
            free(out);
        }
}

Test(plan, a_refusal_names_a_step_that_fits) {
    char *big[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000", NULL};
    char *refused = plan_stdout(big, 1), want[128], mb[8];
    /* fewer micro-batches of the same size: the plan of the one named fits
     * with the time the refusal gives */
    const char *offer = strstr(refused, "; --micro-batches ");
    cr_assert(offer, "%s", refused);
    int n_mb = atoi(offer + strlen("; --micro-batches "));
    cr_assert(n_mb >= 1 && n_mb < 4, "%s", refused);
    snprintf(mb, sizeof mb, "%d", n_mb);
    char *fewer[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000",
                     "--micro-batches", mb, NULL};
    char *fits = plan_stdout(fewer, 0);
    const char *step = strstr(fits, " step_s=");
    cr_assert(step, "%s", fits);
    snprintf(want, sizeof want, "; --micro-batches %d fits (%d tokens a step, predicted at %.2f "
             "s a step)", n_mb, n_mb * 16384, strtod(step + 8, NULL));
    cr_assert(strstr(refused, want), "'%s' not in:\n%s", want, refused);
    cr_assert_null(strstr(refused, "SPEC"), "%s", refused);
    free(refused), free(fits);

    char *long_rows[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000",
                         "--seq-len", "8192", NULL};
    refused = plan_stdout(long_rows, 1);
    cr_assert(strstr(refused, "GPU budget short"), "%s", refused);
    const char *named = strstr(refused, "; --batch-size ");
    cr_assert(named, "%s", refused);
    char *argv[16] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "1000",
                      "--seq-len", "8192"}, b[16], m[16] = "4";
    cr_assert_geq(sscanf(named, "; --batch-size %15s --micro-batches %15s", b, m), 1, "%s", named);
    int n = 9;
    argv[n++] = "--batch-size", argv[n++] = b, argv[n++] = "--micro-batches", argv[n++] = m;
    free(plan_stdout(argv, 0));  /* what the refusal names fits */
    free(refused);

    char *nothing[] = {"plan", "--preset", "70b", "--gpu-mem", "80", "--host-mem", "100", NULL};
    refused = plan_stdout(nothing, 1);
    cr_assert(strstr(refused, "no smaller step (down to --batch-size 1 --micro-batches 1) fits"),
              "%s", refused);
    free(refused);
}

Test(plan, every_known_gpu_plans_an_8b_model, .init = quiet) {
    const char *gpus[] = {"h100", "h200", "a100", "l40s", "4090", "H100"};
    for (size_t i = 0; i < sizeof gpus / sizeof *gpus; i++) {
        char *argv[] = {"plan", "--preset", "8b", "--gpu", (char *)gpus[i], "--host-mem", "500",
                        "--batch-size", "1", "--micro-batches", "32", NULL};
        cr_assert_eq(mt_test_cli(argv), 0, "--gpu %s", gpus[i]);
    }
}

Test(plan, an_unknown_gpu_or_two_sources_of_rates_are_usage_errors, .init = quiet) {
    char *unknown[] = {"plan", "--preset", "8b", "--gpu", "v100", NULL};
    cr_assert_eq(mt_test_cli(unknown), 2);
    char *both[] = {"plan", "--preset", "8b", "--gpu", "h100", "--calibration", "x.json", NULL};
    cr_assert_eq(mt_test_cli(both), 2);
}

Test(plan, the_same_model_on_128_gib_is_refused, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "6656", "--layers", "60", "--heads", "52", "--ffn", "17920",
                    "--vocab", "32000", "--host-ram-gb", "134", "--gpu-gb", "141", NULL};
    cr_assert_eq(mt_test_cli(argv), 1);
}

Test(plan, missing_shape_is_a_usage_error, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "4096", NULL};
    cr_assert_eq(mt_test_cli(argv), 2);
}

/* bench train checks its flags before it looks for a GPU. */
Test(plan, bench_train_refuses_a_negative_gpu_adam_layer_count, .init = quiet) {
    cr_redirect_stderr();
    char *neg[] = {"bench", "train", "--gpu-adam-layers", "-2", NULL};
    cr_assert_eq(mt_test_cli(neg), 2);
    char *word[] = {"bench", "train", "--gpu-adam-layers", "two", NULL};
    cr_assert_eq(mt_test_cli(word), 2);
}

/* Several GPUs and machines: each GPU's share of the step and of its
 * machine's RAM, the collectives' time at the link's rate; a step its GPUs
 * cannot share is a usage error. */
Test(plan, four_gpus_of_a_machine_are_planned_per_rank) {
    char *four[] = {"plan", "--preset", "8b", "--gpus", "4", "--micro-batches", "16", "--gpu",
                    "h100", "--host-mem", "480", NULL};
    cr_assert(plan_output_has(four, 0, "ranks: 4 GPUs on each of 1 machines", "collectives"));
}

Test(plan, two_machines_collect_at_the_network_rate) {
    char *two_nodes[] = {"plan", "--preset", "34b", "--gpus", "2", "--nodes", "2",
                         "--micro-batches", "4", "--gpu", "h200", "--host-mem", "250",
                         "--net-gbps", "10", NULL};
    cr_assert(plan_output_has(two_nodes, 0, "collectives at 10 GB/s", "gpus=4"));
}

Test(plan, a_step_its_gpus_cannot_share_is_a_usage_error, .init = quiet) {
    char *odd[] = {"plan", "--preset", "8b", "--gpus", "3", "--micro-batches", "4", NULL};
    cr_assert_eq(mt_test_cli(odd), 2);
}
