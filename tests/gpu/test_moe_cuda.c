/* The GPU MoE MLP (backend/cuda/moe_cuda.h) against the CPU reference
 * (backend/cpu/moe.h, itself checked against transformers in
 * tests/cpu/test_moe_hf.c), for small mixtral-, qwen2_moe- (shared expert)
 * and qwen3_moe-like blocks, in fp32 and bf16, with the load-balancing
 * loss on over two micro-batches as the engine runs them: forward and
 * count of both, the aux loss, then the recompute forward and backward of
 * the second and of the first. Compared: both outputs, both dxn, every
 * gradient tensor of the block (router, shared expert, shared gate, each
 * expert's gate, up and down), the loss; the block's other tensors (norms,
 * attention) must keep their gradient bits. The module's device range and
 * every output are poisoned (NaN bytes) before use, so an unwritten or
 * uninitialised element fails the comparison.
 *
 * Routing: no near ties. The router rows are drawn in [-1, 1] and the
 * inputs in [-1, 1], so logits spread over several units; any token whose
 * K-th and (K+1)-th largest logits (in double, on the exact operands both
 * sides use) are closer than ROUTE_GAP is redrawn. Both sides compute the
 * logits in fp32 from the same operands (the GPU's router is fp32 in both
 * precisions), differing by ~1e-6 at most, so they choose the same experts.
 *
 * Tolerances (relative error in the 2-norm, per tensor):
 *  - fp32: only the summation order differs. The same CPU code against
 *    transformers (test_moe_hf.c) shows 4e-7 on outputs and 1.6e-6 on
 *    gradients through a whole model; 1e-5 and 2e-5 are its bounds.
 *  - bf16: the CPU reference gets the bf16-rounded operands the GPU
 *    multiplies (xn, experts, shared expert; the router and shared gate
 *    stay fp32 on both sides), so what differs are the GPU's bf16
 *    intermediates: expert and shared gate and up outputs, the SwiGLU
 *    outputs, dL/dy, dL/d(shared out) and the SwiGLU gradients, each
 *    rounded to 8 significant bits (2^-9 relative). The CPU reference with
 *    those roundings inserted at the same places gives, on these cases,
 *    3.1e-3 on outputs and 5.2e-3 on gradients: 2e-2 leaves a 4x margin.
 *    Dropping a routing weight from dL/dy, the renormalisation or the
 *    shared gate's sigmoid gives 0.17 or more.
 *  - The aux coefficients are 10, not the published 0.001-0.02, so that
 *    the aux loss's gradient is a visible part of the router's: without it
 *    the router gradient moves by 7e-3 (mixtral) to 0.2-1 (qwen).
 *  - The loss: the aux part comes from the fp32 routing on both sides,
 *    1e-5 of it in both precisions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/moe.h"
#include "backend/cuda/moe_cuda.h"
#include "cuda_ops_util.h"
#include "model/config.h"
#include "model/params.h"

#define TOL_OUT_F32 1e-5
#define TOL_GRAD_F32 2e-5
#define TOL_BF16 2e-2
#define TOL_LOSS 1e-5
#define ROUTE_GAP 1e-2 /* logits; ~1e-6 is what fp32 summation order moves them */
#define LOSS0 0.25     /* the loss sum the aux loss is added to */
#define SCALE 3.0      /* the engine's scale (valid targets) */

/* Mixtral: renormalised top-2 of 6; 600 tokens, so that the 1200 choices
 * fill two tiles of the grouping (1024 each). */
#define MIXTRAL                                                                               \
    "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"num_hidden_layers\": 1, "          \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "    \
    "\"vocab_size\": 64, \"num_local_experts\": 6, \"num_experts_per_tok\": 2, "             \
    "\"router_aux_loss_coef\": 10.0, \"output_router_logits\": true}"
/* Qwen2-MoE: top-3 of 6 without renormalisation, a shared expert. */
#define QWEN2_MOE                                                                             \
    "{\"model_type\": \"qwen2_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 1, "        \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 48, "    \
    "\"vocab_size\": 64, \"num_experts\": 6, \"num_experts_per_tok\": 3, "                   \
    "\"moe_intermediate_size\": 20, \"shared_expert_intermediate_size\": 40, "               \
    "\"router_aux_loss_coef\": 10.0, \"output_router_logits\": true}"
/* Qwen3-MoE: top-3 of 8, norm_topk_prob off. */
#define QWEN3_MOE                                                                             \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 1, "        \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, "              \
    "\"intermediate_size\": 48, \"vocab_size\": 64, \"num_experts\": 8, "                    \
    "\"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16, \"norm_topk_prob\": false, " \
    "\"router_aux_loss_coef\": 10.0, \"output_router_logits\": true}"

/* One block, its weights and the two micro-batches' data, on the host. */
typedef struct {
    mt_config c;
    mt_param_table t;
    const mt_layer_desc *ld;
    size_t N, C, numel;
    mt_precision prec;
    float *w;       /* (numel) the layer's fp32 weights (the GPU's w32) */
    float *w_ref;   /* what the CPU multiplies: in bf16, w rounded but for router and gate */
    float *xn[2];   /* (N, C) inputs; bf16-exact in bf16 */
    float *dout[2]; /* (N, C) */
    float *g0;      /* (numel) the gradient before the step */
} moe_case;

/* What one run gives. */
typedef struct {
    float *out[2], *out_re[2]; /* first forwards, recompute forwards */
    float *dxn[2];
    float *g;
    double loss;
} moe_result;

static bool is_moe_role(mt_role r) { return r >= MT_T_ROUTER && r < MT_T_COUNT; }

static const mt_tensor_desc *tensor(const moe_case *k, mt_role r) {
    return &k->ld->tensors[k->ld->by_role[r]];
}

/* Redraws the rows of x (N, C) whose K-th and (K+1)-th router logits are
 * within ROUTE_GAP (see the top comment); rounds x to bf16 in bf16. */
static void untie(const moe_case *k, float *x, unsigned long long seed, float lo, float hi) {
    size_t C = k->C, E = (size_t)k->c.moe.E, K = (size_t)k->c.moe.K;
    const float *wr = k->w + tensor(k, MT_T_ROUTER)->offset;
    double *z = malloc(E * sizeof *z);
    for (size_t n = 0; n < k->N; n++) {
        float *r = x + n * C;
        for (int tries = 0;; tries++) {
            if (k->prec == MT_PREC_BF16)
                for (size_t i = 0; i < C; i++) r[i] = bf2f(f2bf(r[i]));
            for (size_t e = 0; e < E; e++) {
                z[e] = 0;
                for (size_t i = 0; i < C; i++) z[e] += (double)r[i] * wr[e * C + i];
            }
            double kth = INFINITY, next = -INFINITY; /* K-th largest, and the largest below */
            for (size_t j = 0; j < K; j++) {
                double best = -INFINITY;
                for (size_t e = 0; e < E; e++)
                    if (z[e] < kth && z[e] > best) best = z[e];
                kth = best;
            }
            for (size_t e = 0; e < E; e++)
                if (z[e] < kth && z[e] > next) next = z[e];
            if (kth - next > ROUTE_GAP) break;
            cr_assert_lt(tries, 100, "no untied row for token %zu", n);
            mt_test_fill_uniform(r, C, seed * 7919 + n * 131 + (unsigned long long)tries + 1, lo,
                                 hi);
        }
    }
    free(z);
}

/* A case of config json, N tokens per micro-batch. Inputs in [xlo, 1]. */
static void case_init(moe_case *k, const char *json, size_t N, mt_precision prec,
                      unsigned long long seed, float xlo) {
    mt_error err;
    memset(k, 0, sizeof *k);
    cr_assert_eq(mt_config_parse(&k->c, json, "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(mt_params_init(&k->t, &k->c, &err), 0, "%s", err.msg);
    k->ld = &k->t.layers[1];
    cr_assert_eq(k->ld->n_experts, k->c.moe.E);
    k->N = N;
    k->C = (size_t)k->c.C;
    k->numel = k->ld->numel;
    k->prec = prec;
    k->w = hrand(k->numel, seed, -0.3f, 0.3f);
    const mt_tensor_desc *rt = tensor(k, MT_T_ROUTER);
    mt_test_fill_uniform(k->w + rt->offset, rt->numel, seed + 1, -1.0f, 1.0f);
    k->w_ref = malloc(k->numel * sizeof(float));
    memcpy(k->w_ref, k->w, k->numel * sizeof(float));
    if (prec == MT_PREC_BF16) {
        for (size_t i = 0; i < k->numel; i++) k->w_ref[i] = bf2f(f2bf(k->w[i]));
        mt_role fp32_roles[] = {MT_T_ROUTER, MT_T_SHARED_GATE};
        for (int i = 0; i < 2; i++) {
            if (k->ld->by_role[fp32_roles[i]] < 0) continue;
            const mt_tensor_desc *td = tensor(k, fp32_roles[i]);
            memcpy(k->w_ref + td->offset, k->w + td->offset, td->numel * sizeof(float));
        }
    }
    for (int mb = 0; mb < 2; mb++) {
        k->xn[mb] = hrand(N * k->C, seed + 10 + mb, xlo, 1.0f);
        untie(k, k->xn[mb], seed + 10 + mb, xlo, 1.0f);
        k->dout[mb] = hrand(N * k->C, seed + 20 + mb, -1.0f, 1.0f);
    }
    k->g0 = calloc(k->numel, sizeof(float));
}

static void case_free(moe_case *k) {
    free(k->w), free(k->w_ref), free(k->g0);
    for (int mb = 0; mb < 2; mb++) free(k->xn[mb]), free(k->dout[mb]);
    mt_params_free(&k->t);
}

static void result_init(moe_result *r, const moe_case *k) {
    size_t nc = k->N * k->C;
    for (int mb = 0; mb < 2; mb++) {
        r->out[mb] = malloc(nc * 4);
        r->out_re[mb] = malloc(nc * 4);
        r->dxn[mb] = calloc(nc, 4);
    }
    r->g = malloc(k->numel * 4);
    memcpy(r->g, k->g0, k->numel * 4);
}

static void result_free(moe_result *r) {
    for (int mb = 0; mb < 2; mb++) free(r->out[mb]), free(r->out_re[mb]), free(r->dxn[mb]);
    free(r->g);
}

/* The step on the CPU reference. */
static void run_cpu(const moe_case *k, moe_result *r) {
    result_init(r, k);
    mt_cpu_moe *m = mt_cpu_moe_create(&k->c, k->N);
    mt_cpu_moe_begin_step(m, 1);
    for (int mb = 0; mb < 2; mb++) {
        mt_cpu_moe_forward(m, k->ld, k->w_ref, k->xn[mb], r->out[mb]);
        mt_cpu_moe_count(m);
    }
    r->loss = LOSS0 + mt_cpu_moe_aux_loss(m) * SCALE;
    for (int mb = 1; mb >= 0; mb--) {
        mt_cpu_moe_forward(m, k->ld, k->w_ref, k->xn[mb], r->out_re[mb]);
        mt_cpu_moe_backward(m, k->ld, k->w_ref, r->g, k->xn[mb], k->dout[mb], r->dxn[mb]);
    }
    mt_cpu_moe_free(m);
}

/* The same step on the GPU. */
static void run_gpu(const moe_case *k, mt_cuda_ctx *ctx, moe_result *r) {
    dev_pool pool = {0};
    bool bf = k->prec == MT_PREC_BF16;
    size_t N = k->N, nc = N * k->C, es = bf ? 2 : 4;
    result_init(r, k);
    size_t bytes = mt_cuda_moe_bytes(&k->c, N, k->prec);
    cr_assert(bytes > 0 && bytes != SIZE_MAX);
    mt_cuda_moe *m = mt_cuda_moe_create(&k->c, N, k->prec, dalloc(&pool, bytes));
    cr_assert_not_null(m);
    float *w32 = dupload(&pool, k->w, k->numel * 4);
    void *w_op = w32, *xn[2];
    if (bf) {
        uint16_t *w16 = to_bf16(k->w, k->numel);
        w_op = dupload(&pool, w16, k->numel * 2);
        free(w16);
    }
    float *dout[2], *out[2], *out_re[2], *dxn[2];
    for (int mb = 0; mb < 2; mb++) {
        if (bf) {
            uint16_t *x16 = to_bf16(k->xn[mb], nc);
            xn[mb] = dupload(&pool, x16, nc * es);
            free(x16);
        } else {
            xn[mb] = dupload(&pool, k->xn[mb], nc * es);
        }
        dout[mb] = dupload(&pool, k->dout[mb], nc * 4);
        out[mb] = dalloc(&pool, nc * 4);
        out_re[mb] = dalloc(&pool, nc * 4);
        dxn[mb] = dalloc(&pool, nc * 4); /* poisoned: the backward overwrites it */
    }
    float *g = dupload(&pool, k->g0, k->numel * 4);
    double loss0 = LOSS0;
    double *loss = dupload(&pool, &loss0, sizeof loss0);
    mt_cuda_moe_begin_step(m, ctx, 1);
    for (int mb = 0; mb < 2; mb++) {
        mt_cuda_moe_forward(m, ctx, k->ld, w_op, w32, xn[mb], out[mb]);
        mt_cuda_moe_count(m, ctx);
    }
    mt_cuda_moe_add_aux_loss(m, ctx, loss, SCALE);
    for (int mb = 1; mb >= 0; mb--) {
        mt_cuda_moe_forward(m, ctx, k->ld, w_op, w32, xn[mb], out_re[mb]);
        mt_cuda_moe_backward(m, ctx, k->ld, w_op, w32, g, xn[mb], dout[mb], dxn[mb]);
    }
    for (int mb = 0; mb < 2; mb++) {
        download(r->out[mb], out[mb], nc * 4);
        download(r->out_re[mb], out_re[mb], nc * 4);
        download(r->dxn[mb], dxn[mb], nc * 4);
    }
    download(r->g, g, k->numel * 4);
    download(&r->loss, loss, sizeof r->loss);
    mt_cuda_moe_free(m);
    pool_free(&pool);
}

/* got against ref over n elements: relative error within tol, or both
 * exactly equal where ref is all zero. Returns the error. */
static double check(const float *got, const float *ref, size_t n, double tol, const char *what,
                    const char *label) {
    double nr = 0;
    for (size_t i = 0; i < n; i++) nr += (double)ref[i] * ref[i];
    if (nr == 0) {
        cr_expect(memcmp(got, ref, n * 4) == 0, "%s: %s should stay zero", label, what);
        return 0;
    }
    double e = mt_test_rel_err(got, ref, n);
    cr_expect(e <= tol, "%s: %s relative error %.3g > %.3g", label, what, e, tol);
    return e;
}

/* GPU result against the CPU's; the block's other tensors keep g0. */
static void compare(const moe_case *k, const moe_result *gpu, const moe_result *cpu,
                    const char *label) {
    bool bf = k->prec == MT_PREC_BF16;
    double tol_out = bf ? TOL_BF16 : TOL_OUT_F32, tol_g = bf ? TOL_BF16 : TOL_GRAD_F32;
    double worst_out = 0, worst_g = 0;
    size_t nc = k->N * k->C;
    char what[160];
    for (int mb = 0; mb < 2; mb++) {
        snprintf(what, sizeof what, "out of micro-batch %d", mb);
        worst_out = fmax(worst_out, check(gpu->out[mb], cpu->out[mb], nc, tol_out, what, label));
        cr_expect(memcmp(gpu->out[mb], gpu->out_re[mb], nc * 4) == 0,
                  "%s: the recompute forward of micro-batch %d differs from the first", label, mb);
        snprintf(what, sizeof what, "dxn of micro-batch %d", mb);
        worst_g = fmax(worst_g, check(gpu->dxn[mb], cpu->dxn[mb], nc, tol_g, what, label));
    }
    cr_expect_leq(fabs(gpu->loss - cpu->loss), TOL_LOSS * fabs(cpu->loss - LOSS0),
                  "%s: loss %.10g vs the CPU's %.10g", label, gpu->loss, cpu->loss);
    cr_expect_gt(cpu->loss, LOSS0, "%s: the aux loss is on", label);
    bool *moe = calloc(k->numel, sizeof *moe);
    for (int i = 0; i < k->ld->n_tensors; i++) {
        const mt_tensor_desc *td = &k->ld->tensors[i];
        if (!is_moe_role(td->role)) continue;
        for (size_t j = 0; j < td->numel; j++) moe[td->offset + j] = true;
        snprintf(what, sizeof what, "gradient of %s", td->name);
        worst_g = fmax(worst_g, check(gpu->g + td->offset, cpu->g + td->offset, td->numel, tol_g,
                                      what, label));
    }
    size_t stray = 0;
    for (size_t i = 0; i < k->numel; i++)
        if (!moe[i] && memcmp(&gpu->g[i], &k->g0[i], 4) != 0) stray++;
    cr_expect_eq(stray, 0, "%s: %zu gradient elements outside the MoE tensors changed", label,
                 stray);
    free(moe);
    cr_log_info("%s: worst relative error: outputs %.2e, gradients %.2e", label, worst_out,
                worst_g);
}

static void check_block(const char *json, size_t N, mt_precision prec, const char *label) {
    mt_cuda_ctx *ctx = gpu_ctx();
    moe_case k;
    case_init(&k, json, N, prec, 100, -1.0f);
    moe_result cpu, gpu;
    run_cpu(&k, &cpu);
    run_gpu(&k, ctx, &gpu);
    compare(&k, &gpu, &cpu, label);
    result_free(&cpu), result_free(&gpu);
    case_free(&k);
    mt_cuda_ctx_free(ctx);
}

Test(moe_cuda, mixtral_fp32) { check_block(MIXTRAL, 600, MT_PREC_FP32, "mixtral fp32"); }
Test(moe_cuda, mixtral_bf16) { check_block(MIXTRAL, 600, MT_PREC_BF16, "mixtral bf16"); }
Test(moe_cuda, qwen2_moe_shared_expert_fp32) {
    check_block(QWEN2_MOE, 37, MT_PREC_FP32, "qwen2_moe fp32");
}
Test(moe_cuda, qwen2_moe_shared_expert_bf16) {
    check_block(QWEN2_MOE, 37, MT_PREC_BF16, "qwen2_moe bf16");
}
Test(moe_cuda, qwen3_moe_fp32) { check_block(QWEN3_MOE, 45, MT_PREC_FP32, "qwen3_moe fp32"); }
Test(moe_cuda, qwen3_moe_bf16) { check_block(QWEN3_MOE, 45, MT_PREC_BF16, "qwen3_moe bf16"); }

/* Two runs of the same step give the same bits, in both precisions. */
Test(moe_cuda, deterministic) {
    mt_cuda_ctx *ctx = gpu_ctx();
    for (int bf = 0; bf < 2; bf++) {
        moe_case k;
        case_init(&k, QWEN2_MOE, 600, bf ? MT_PREC_BF16 : MT_PREC_FP32, 200, -1.0f);
        moe_result a, b;
        run_gpu(&k, ctx, &a);
        run_gpu(&k, ctx, &b);
        size_t nc = k.N * k.C;
        for (int mb = 0; mb < 2; mb++) {
            cr_expect(memcmp(a.out[mb], b.out[mb], nc * 4) == 0, "bf16=%d: out %d differs", bf, mb);
            cr_expect(memcmp(a.dxn[mb], b.dxn[mb], nc * 4) == 0, "bf16=%d: dxn %d differs", bf, mb);
        }
        cr_expect(memcmp(a.g, b.g, k.numel * 4) == 0, "bf16=%d: gradients differ", bf);
        cr_expect(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0, "bf16=%d: loss differs", bf);
        result_free(&a), result_free(&b);
        case_free(&k);
    }
    mt_cuda_ctx_free(ctx);
}

/* The last expert's router row is -1 everywhere and the inputs positive,
 * so its logit, -sum(x), is every token's smallest: no token reaches it.
 * Its gradient keeps its bits (pre-filled non-zero); the rest matches. */
Test(moe_cuda, an_expert_without_tokens_keeps_its_gradient) {
    mt_cuda_ctx *ctx = gpu_ctx();
    for (int bf = 0; bf < 2; bf++) {
        moe_case k;
        mt_precision prec = bf ? MT_PREC_BF16 : MT_PREC_FP32;
        case_init(&k, QWEN3_MOE, 45, prec, 300, 0.05f);
        const mt_tensor_desc *rt = tensor(&k, MT_T_ROUTER);
        size_t E = (size_t)k.c.moe.E, C = k.C;
        for (size_t i = 0; i < C; i++) k.w[rt->offset + (E - 1) * C + i] = -1.0f;
        memcpy(k.w_ref + rt->offset, k.w + rt->offset, rt->numel * 4);
        for (int mb = 0; mb < 2; mb++) untie(&k, k.xn[mb], 300 + mb, 0.05f, 1.0f);
        mt_test_fill_uniform(k.g0, k.numel, 301, -0.01f, 0.01f);
        moe_result cpu, gpu;
        run_cpu(&k, &cpu);
        run_gpu(&k, ctx, &gpu);
        compare(&k, &gpu, &cpu, bf ? "empty expert bf16" : "empty expert fp32");
        for (int j = 0; j < MT_EXPERT_TENSORS; j++) {
            const mt_tensor_desc *td =
                &k.ld->tensors[k.ld->expert_first + MT_EXPERT_TENSORS * (int)(E - 1) + j];
            cr_assert_eq(td->expert, (int)E - 1);
            cr_expect(memcmp(gpu.g + td->offset, k.g0 + td->offset, td->numel * 4) == 0,
                      "bf16=%d: %s changed", bf, td->name);
            cr_expect(memcmp(cpu.g + td->offset, k.g0 + td->offset, td->numel * 4) == 0,
                      "bf16=%d: the CPU changed %s", bf, td->name);
        }
        result_free(&cpu), result_free(&gpu);
        case_free(&k);
    }
    mt_cuda_ctx_free(ctx);
}

/* Sizes: none for a dense model, SIZE_MAX when N * K passes size_t or
 * int32 (the grouped rows are int32 on the device). Needs no GPU. */
Test(moe_cuda, bytes) {
    mt_config c;
    mt_error err;
    mt_config_default_tiny(&c);
    cr_assert_eq(mt_cuda_moe_bytes(&c, 64, MT_PREC_FP32), 0, "dense model");
    cr_assert_null(mt_cuda_moe_create(&c, 64, MT_PREC_FP32, NULL));
    cr_assert_eq(mt_config_parse(&c, QWEN2_MOE, "config.json", &err), 0, "%s", err.msg);
    size_t f32 = mt_cuda_moe_bytes(&c, 64, MT_PREC_FP32);
    cr_assert(f32 > 0 && f32 != SIZE_MAX && f32 % 256 == 0);
    cr_assert_gt(mt_cuda_moe_bytes(&c, 128, MT_PREC_FP32), f32);
    cr_assert_eq(mt_cuda_moe_bytes(&c, SIZE_MAX / 2, MT_PREC_FP32), SIZE_MAX);
    cr_assert_eq(mt_cuda_moe_bytes(&c, (size_t)1 << 30, MT_PREC_BF16), SIZE_MAX,
                 "N * K = 3 * 2^30 is past int32");
}
