/* Packed documents (mt_batch.pos) through the CUDA streaming engine: the
 * transformers reference with per-document position_ids (fixture from
 * scripts/make_packed_fixture.py), the CPU reference on the bf16 flash
 * kernels' head size, in fp32 and bf16, forward and backward, with
 * micro-batch accumulation and kept activations, and run-to-run
 * determinism. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/backend_cuda.h"
#include "engine/step.h"
#include "fixture.h"
#include "gpu_train.h"
#include "kernels/cuda_ops.h"
#include "testlib.h"

/* The bounds of test_engine.c, for the same reasons: fp32 differs from the
 * reference by summation order only (observed < 3e-6 loss, < 2e-5
 * gradients on the CPU), bf16 by up to twice the fixture's own
 * bf16-vs-fp32 distance (3e-3 loss, 3% gradient). Packing only removes
 * terms from the softmax sums. A key of the wrong document moves logits by
 * ~4 (make_packed_fixture.py asserts > 1e-2), far past every bound. */
#define TOL32_LOSS 1e-5
#define TOL32_GRAD 2e-4
#define TOL32_LOGITS 3e-5 /* test_engine.c's bound for fp32 logits */
#define TOL16_LOSS 6e-3
#define TOL16_GRAD 6e-2

/* ---- against transformers ---- */

/* One step on the fixture's packed batch in M micro-batches; fills the
 * store's gradients, returns the loss; with fp32 and M = 1 also checks the
 * logits of every position. */
static double gpu_packed_step(mt_fixture *f, mt_gpu_precision prec, int M, int host_saved) {
    mt_error err;
    size_t N = (size_t)(f->B * f->T);
    int32_t *tok = mt_fixture_i32(f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(f, "targets", 0, N);
    int32_t *pos = mt_fixture_i32(f, "position_ids", 0, N);
    mt_cuda_backend_opts o = {.precision = prec, .host_saved_inputs = host_saved};
    int64_t B = f->B / M;
    mt_backend *be = mt_cuda_backend_create(&f->cfg, &f->table, &f->store, M, B, f->T, &o, &err);
    cr_assert_not_null(be, "%s", err.msg);
    memset(f->store.g, 0x7f, f->table.total * sizeof(float)); /* poison: every grad is written */
    mt_batch b = {.M = M, .B = B, .T = f->T, .tokens = tok, .targets = tgt, .pos = pos};
    double loss;
    cr_assert_eq(mt_step_forward_backward(be, f->table.n_layers, &b, &loss, &err), 0, "%s",
                 err.msg);
    mt_cuda_backend_wait_grads(be);
    if (prec == MT_GPU_FP32 && M == 1) {
        double sum;
        int64_t nv;
        cr_assert_eq(mt_step_eval(be, f->table.n_layers, &b, &sum, &nv, &err), 0, "%s", err.msg);
        size_t nl;
        float *ref = mt_fixture_f32(f, "logits", &nl);
        float *ours = malloc(nl * sizeof *ours);
        for (size_t r = 0; r < N; r++) mt_cuda_backend_logits(be, 0, (int64_t)r, ours + r * f->cfg.V);
        double e = mt_test_rel_err(ours, ref, nl);
        cr_log_info("%s: packed logits rel err %.3g", f->dir, e);
        cr_assert_leq(e, TOL32_LOGITS, "%s: packed logits rel err %.3g", f->dir, e);
        free(ours);
        free(ref);
    }
    mt_cuda_backend_free(be);
    free(tok), free(tgt), free(pos);
    return loss;
}

static void check_hf_packed(const char *model) {
    mt_test_need_gpu();
    mt_fixture f;
    mt_fixture_open(&f, model);
    mt_fixture_use_ref(&f, "packed.safetensors");
    float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
    struct { mt_gpu_precision p; int M, host; double tl, tg; } runs[] = {
        {MT_GPU_FP32, 1, 0, TOL32_LOSS, TOL32_GRAD},
        {MT_GPU_FP32, 2, 1, TOL32_LOSS, TOL32_GRAD}, /* 2 micro-batches, host checkpoints */
        {MT_GPU_BF16, 1, 0, TOL16_LOSS, TOL16_GRAD},
        {MT_GPU_BF16, 2, 0, TOL16_LOSS, TOL16_GRAD},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        double loss = gpu_packed_step(&f, runs[i].p, runs[i].M, runs[i].host);
        double el = fabs(loss - ref_loss[0]) / ref_loss[0];
        cr_assert_lt(el, runs[i].tl, "%s run %zu: loss %.7f vs HF %.7f", model, i, loss,
                     ref_loss[0]);
        double eg = mt_fixture_compare(&f, f.store.g, "grad.", runs[i].tg, "packed gradient", 0);
        cr_log_info("%s run %zu: loss err %.2e, worst grad err %.2e", model, i, el, eg);
    }
    free(ref_loss);
    mt_fixture_close(&f);
}

Test(packing_gpu, llama_matches_hf_position_ids) { check_hf_packed("llama_gqa"); }
Test(packing_gpu, qwen2_matches_hf_position_ids) { check_hf_packed("qwen2_bias_tied"); }
/* Gemma 3's sliding layer (window 6 of 16) and global one (gemma_cuda.c) */
Test(packing_gpu, gemma3_matches_hf_position_ids) { check_hf_packed("gemma3_text_sliding"); }

/* ---- against the CPU reference, head dim 64 (the bf16 flash kernels) ---- */

static mt_config small_config(mt_arch arch, const char *type) {
    mt_config c;
    mt_config_default_tiny(&c);
    c.arch = arch;
    snprintf(c.model_type, sizeof c.model_type, "%s", type);
    c.C = 256, c.NH = 4, c.NKV = 2, c.HD = 64, c.F = 512, c.V = 512, c.L = 2, c.max_pos = 256;
    c.qk_norm = arch == MT_ARCH_QWEN3;
    c.qkv_bias = arch == MT_ARCH_QWEN2;
    c.tie_embeddings = arch == MT_ARCH_QWEN3;
    return c;
}

enum { M = 2, B = 2, T = 256, N_TOK = M * B * T };

/* A packed step: random tokens and targets (one in five ignored), rows of
 * documents of 1 to 150 tokens (one-token documents, documents crossing
 * the 64- and 128-token tiles, and row 3 one document of all T). */
static void packed_batch(const mt_config *c, int32_t *tok, int32_t *tgt, int32_t *pos) {
    static const int lens[] = {1, 37, 64, 150, 2, 70, 9, 128, 5, 100};
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N_TOK; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        tok[i] = (int32_t)(s % (uint64_t)c->V);
        tgt[i] = (s >> 40) % 5 == 0 ? MT_IGNORE_INDEX : (int32_t)((s >> 20) % (uint64_t)c->V);
    }
    for (int r = 0, k = 0; r < M * B; r++) {
        for (int t = 0; t < T;) {
            int len = r == 3 ? T : lens[k++ % 10];
            for (int i = 0; i < len && t < T; i++, t++) pos[r * T + t] = i;
        }
    }
}

typedef struct step_out {
    double loss;
    float *grads;  /* (total), malloc'd */
    float *logits; /* (M * B * T, V) of an evaluation pass after the step, malloc'd */
} step_out;

/* One step of backend `be` on the packed batch (pos NULL: the same rows
 * unpacked); the gradients are read from the store once they are there;
 * then the logits of every position. */
static step_out run_step(mt_backend *be, int gpu, const mt_config *c, const mt_param_table *t,
                         mt_host_store *s, const int32_t *tok, const int32_t *tgt,
                         const int32_t *pos) {
    mt_error err;
    mt_batch b = {.M = M, .B = B, .T = T, .tokens = tok, .targets = tgt, .pos = pos};
    step_out o;
    cr_assert_eq(mt_step_forward_backward(be, t->n_layers, &b, &o.loss, &err), 0, "%s", err.msg);
    if (gpu) mt_cuda_backend_wait_grads(be);
    o.grads = malloc(t->total * sizeof *o.grads);
    memcpy(o.grads, s->g, t->total * sizeof *o.grads);
    double sum;
    int64_t nv;
    cr_assert_eq(mt_step_eval(be, t->n_layers, &b, &sum, &nv, &err), 0, "%s", err.msg);
    o.logits = malloc((size_t)N_TOK * c->V * sizeof *o.logits);
    for (int mb = 0; mb < M; mb++)
        for (int64_t r = 0; r < B * T; r++) {
            float *row = o.logits + ((size_t)mb * B * T + r) * c->V;
            if (gpu) mt_cuda_backend_logits(be, mb, r, row);
            else mt_cpu_backend_logits(be, mb, r, row);
        }
    return o;
}

static void step_out_free(step_out *o) { free(o->grads), free(o->logits); }

static double worst_grad_err(const mt_param_table *t, const float *g, const float *ref) {
    double worst = 0;
    for (int l = 0; l < t->n_layers; l++)
        for (int k = 0; k < t->layers[l].n_tensors; k++) {
            size_t off = t->layers[l].offset + t->layers[l].tensors[k].offset;
            double e = mt_test_rel_err(g + off, ref + off, t->layers[l].tensors[k].numel);
            if (e > worst) worst = e;
        }
    return worst;
}

static step_out gpu_step(const mt_config *c, const mt_param_table *t, mt_host_store *s,
                         mt_gpu_precision prec, int keep, const int32_t *tok, const int32_t *tgt,
                         const int32_t *pos) {
    mt_error err;
    mt_cuda_backend_opts o = {.precision = prec, .keep_layers = keep};
    mt_backend *be = mt_cuda_backend_create(c, t, s, M, B, T, &o, &err);
    cr_assert_not_null(be, "%s", err.msg);
    if (keep) /* asked for: the fast path keeps them (else the check below is moot) */
        cr_assert_eq(mt_cuda_backend_kept_layers(be), keep, "%s keeps %d layers",
                     c->model_type, mt_cuda_backend_kept_layers(be));
    step_out r = run_step(be, 1, c, t, s, tok, tgt, pos);
    mt_cuda_backend_free(be);
    return r;
}

/* bf16: the fast path, with q/k norms (qwen3) and biases (qwen2) where
 * the model has them; fp32: the general path with the fp32 kernels. Each
 * against the CPU on the same packed step; bf16 also run twice (bitwise
 * equal), with kept activations (bitwise equal to recomputing), and with
 * positions 0..T-1 in every row against no positions (bitwise equal). */
Test(packing_gpu, flash_paths_match_the_cpu_on_packed_rows, .timeout = 120) {
    mt_test_need_gpu();
    const mt_arch archs[] = {MT_ARCH_LLAMA, MT_ARCH_QWEN3, MT_ARCH_QWEN2};
    const char *names[] = {"llama", "qwen3", "qwen2"};
    int32_t *tok = malloc(N_TOK * 4), *tgt = malloc(N_TOK * 4), *pos = malloc(N_TOK * 4);
    int32_t *iota = malloc(N_TOK * 4);
    for (int i = 0; i < N_TOK; i++) iota[i] = i % T;
    for (int a = 0; a < 3; a++) {
        mt_error err;
        mt_config c = small_config(archs[a], names[a]);
        mt_param_table t;
        mt_host_store s;
        cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(mt_host_store_init(&s, &t, &err), 0, "%s", err.msg);
        mt_host_store_init_random(&s, 5, 0.05f);
        packed_batch(&c, tok, tgt, pos);

        mt_backend *cpu = mt_cpu_backend_create(&c, &t, &s, M, B, T, &err);
        cr_assert_not_null(cpu, "%s", err.msg);
        step_out ref = run_step(cpu, 0, &c, &t, &s, tok, tgt, pos);
        step_out unpacked = run_step(cpu, 0, &c, &t, &s, tok, tgt, NULL);
        mt_cpu_backend_free(cpu);
        /* The packed step must differ from the unpacked one, or this test
         * could not see a missing mask. */
        cr_assert_gt(worst_grad_err(&t, unpacked.grads, ref.grads), 10 * TOL16_GRAD,
                     "%s: packing changes the gradients too little to test", names[a]);

        step_out g32 = gpu_step(&c, &t, &s, MT_GPU_FP32, 0, tok, tgt, pos);
        double e32 = worst_grad_err(&t, g32.grads, ref.grads);
        cr_log_info("%s fp32 packed: loss %.7f vs cpu %.7f, worst grad err %.3g", names[a],
                    g32.loss, ref.loss, e32);
        cr_assert_lt(fabs(g32.loss - ref.loss) / ref.loss, TOL32_LOSS, "%s fp32 loss", names[a]);
        cr_assert_lt(e32, TOL32_GRAD, "%s fp32 worst grad err %.3g", names[a], e32);
        double l32 = mt_test_rel_err(g32.logits, ref.logits, (size_t)N_TOK * c.V);
        cr_log_info("%s fp32 packed: logits rel err %.3g", names[a], l32);
        cr_assert_lt(l32, TOL32_LOGITS, "%s fp32 logits rel err %.3g", names[a], l32);

        step_out g16 = gpu_step(&c, &t, &s, MT_GPU_BF16, 0, tok, tgt, pos);
        double e16 = worst_grad_err(&t, g16.grads, ref.grads);
        cr_log_info("%s bf16 packed: loss %.7f vs cpu %.7f, worst grad err %.3g", names[a],
                    g16.loss, ref.loss, e16);
        cr_assert_lt(fabs(g16.loss - ref.loss) / ref.loss, TOL16_LOSS, "%s bf16 loss", names[a]);
        cr_assert_lt(e16, TOL16_GRAD, "%s bf16 worst grad err %.3g", names[a], e16);

        step_out again = gpu_step(&c, &t, &s, MT_GPU_BF16, 0, tok, tgt, pos);
        cr_assert_eq(again.loss, g16.loss, "%s: two runs differ", names[a]);
        cr_assert(!memcmp(again.grads, g16.grads, t.total * sizeof(float)),
                  "%s: two runs give different gradients", names[a]);
        { /* head dim 64, bf16: the fast path, which keeps activations */
            step_out kept = gpu_step(&c, &t, &s, MT_GPU_BF16, 1, tok, tgt, pos);
            cr_assert_eq(kept.loss, g16.loss, "%s: kept activations change the loss", names[a]);
            cr_assert(!memcmp(kept.grads, g16.grads, t.total * sizeof(float)),
                      "%s: kept activations change the gradients", names[a]);
            step_out_free(&kept);
        }
        step_out plain = gpu_step(&c, &t, &s, MT_GPU_BF16, 0, tok, tgt, NULL);
        step_out trivial = gpu_step(&c, &t, &s, MT_GPU_BF16, 0, tok, tgt, iota);
        cr_assert_eq(plain.loss, trivial.loss, "%s: one document per row", names[a]);
        cr_assert(!memcmp(plain.grads, trivial.grads, t.total * sizeof(float)),
                  "%s: one document per row differs from no positions", names[a]);
        step_out *all[] = {&ref, &unpacked, &g32, &g16, &again, &plain, &trivial};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) step_out_free(all[i]);
        mt_host_store_free(&s);
        mt_params_free(&t);
    }
    free(tok), free(tgt), free(pos), free(iota);
}
