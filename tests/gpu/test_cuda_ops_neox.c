/* The CUDA operators of the gpt_neox and falcon blocks (LayerNorm with
 * bias, GELU, the fused qkv's split with partial rotary and its backward)
 * against the CPU reference operators (backend/cpu/ops.h), as
 * test_cuda_ops.c tests the others: outputs poisoned first, "+=" outputs
 * pre-filled, backwards run twice and compared bit for bit. The
 * tolerances are test_cuda_ops.c's (cuda_ops_util.h): TOL_F32 for fp32
 * results (the CPU reference sums in double, the GPU in fp32 in another
 * order), TOL_BF16_OUT for results rounded to bf16. */
#include "backend/cpu/ops.h"
#include "cuda_ops_util.h"

/* ---- LayerNorm ---- */

/* Forward of N rows of C against mt_cpu_layernorm_forward: fp32 output
 * with mean and rstd, then bf16 output. C = 96: fewer than a warp's 128
 * floats a pass; 4544 (Falcon-7B's width): a partial last pass. */
static void check_layernorm_forward(size_t N, size_t C) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const float eps = 1e-5f;
    /* an offset mean: a one-pass variance would lose digits here */
    float *inp = hrand(N * C, 31, 2.0f, 4.0f), *w = hrand(C, 32, 0.5f, 1.5f);
    float *b = hrand(C, 33, -1, 1);
    float *ref = malloc(N * C * 4), *rmean = malloc(N * 4), *rrstd = malloc(N * 4);
    mt_cpu_layernorm_forward(ref, rmean, rrstd, inp, w, b, N, C, eps);
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_b = dupload(&pool, b, C * 4), *d_out = dalloc(&pool, N * C * 4);
    float *d_mean = dalloc(&pool, N * 4), *d_rstd = dalloc(&pool, N * 4);
    dpoison(d_out, N * C * 4);
    dpoison(d_mean, N * 4);
    dpoison(d_rstd, N * 4);
    mt_cuda_layernorm_forward(ctx, d_out, MT_DT_F32, d_mean, d_rstd, d_inp, d_w, d_b, N, C, eps);
    float *out = malloc(N * C * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    download(out, d_out, N * C * 4);
    download(mean, d_mean, N * 4);
    download(rstd, d_rstd, N * 4);
    double *dref = dcopy(ref, N * C), *dmean = dcopy(rmean, N), *drstd = dcopy(rrstd, N);
    expect_close(out, dref, N * C, TOL_F32, "layernorm out");
    expect_close(mean, dmean, N, TOL_F32, "layernorm mean");
    expect_close(rstd, drstd, N, TOL_F32, "layernorm rstd");
    uint16_t *d_out16 = dalloc(&pool, N * C * 2), *o16 = malloc(N * C * 2);
    dpoison(d_out16, N * C * 2);
    mt_cuda_layernorm_forward(ctx, d_out16, MT_DT_BF16, NULL, NULL, d_inp, d_w, d_b, N, C, eps);
    download(o16, d_out16, N * C * 2);
    float *of = bf16_to_f32_host(o16, N * C);
    expect_close(of, dref, N * C, TOL_BF16_OUT, "layernorm bf16 out");
    free(inp), free(w), free(b), free(ref), free(rmean), free(rrstd), free(out), free(mean);
    free(rstd), free(dref), free(dmean), free(drstd), free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_neox, layernorm_forward_fp32_and_bf16_out) {
    check_layernorm_forward(37, 96);
    check_layernorm_forward(19, 4544);
}

/* dinp +=, dw +=, db += against mt_cpu_layernorm_backward on the same
 * pre-filled values, twice for determinism. N = 601: three chunks of the
 * column sums. */
static void check_layernorm_backward(size_t N, size_t C) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const float eps = 1e-5f;
    float *inp = hrand(N * C, 41, -2, 3), *w = hrand(C, 42, 0.5f, 1.5f), *b = hrand(C, 43, -1, 1);
    float *dout = hrand(N * C, 44, -1, 1);
    float *dinp0 = hrand(N * C, 45, -1, 1), *dw0 = hrand(C, 46, -1, 1), *db0 = hrand(C, 47, -1, 1);
    float *y = malloc(N * C * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    mt_cpu_layernorm_forward(y, mean, rstd, inp, w, b, N, C, eps);
    float *rdinp = malloc(N * C * 4), *rdw = malloc(C * 4), *rdb = malloc(C * 4);
    memcpy(rdinp, dinp0, N * C * 4);
    memcpy(rdw, dw0, C * 4);
    memcpy(rdb, db0, C * 4);
    mt_cpu_layernorm_backward(rdinp, rdw, rdb, dout, inp, w, mean, rstd, N, C);
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_b = dupload(&pool, b, C * 4), *d_dout = dupload(&pool, dout, N * C * 4);
    float *d_y = dalloc(&pool, N * C * 4), *d_mean = dalloc(&pool, N * 4);
    float *d_rstd = dalloc(&pool, N * 4);
    float *d_dinp = dalloc(&pool, N * C * 4), *d_dw = dalloc(&pool, C * 4);
    float *d_db = dalloc(&pool, C * 4);
    float *scratch = dalloc(&pool, mt_cuda_colsum_scratch_floats(N, C) * 4);
    /* the GPU's own statistics, as the engine's backward reads them */
    mt_cuda_layernorm_forward(ctx, d_y, MT_DT_F32, d_mean, d_rstd, d_inp, d_w, d_b, N, C, eps);
    float *g[2][3];
    for (int run = 0; run < 2; run++) {
        CUDA_CHECK(cudaMemcpy(d_dinp, dinp0, N * C * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_dw, dw0, C * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_db, db0, C * 4, cudaMemcpyHostToDevice));
        mt_cuda_layernorm_backward(ctx, d_dinp, d_dw, d_db, scratch, d_dout, d_inp, d_w, d_mean,
                                   d_rstd, N, C);
        g[run][0] = malloc(N * C * 4), g[run][1] = malloc(C * 4), g[run][2] = malloc(C * 4);
        download(g[run][0], d_dinp, N * C * 4);
        download(g[run][1], d_dw, C * 4);
        download(g[run][2], d_db, C * 4);
    }
    double *e0 = dcopy(rdinp, N * C), *e1 = dcopy(rdw, C), *e2 = dcopy(rdb, C);
    expect_close(g[0][0], e0, N * C, TOL_F32, "layernorm dinp +=");
    expect_close(g[0][1], e1, C, TOL_F32, "layernorm dw +=");
    expect_close(g[0][2], e2, C, TOL_F32, "layernorm db +=");
    cr_assert(memcmp(g[0][0], g[1][0], N * C * 4) == 0, "layernorm dinp not deterministic");
    cr_assert(memcmp(g[0][1], g[1][1], C * 4) == 0, "layernorm dw not deterministic");
    cr_assert(memcmp(g[0][2], g[1][2], C * 4) == 0, "layernorm db not deterministic");
    for (int run = 0; run < 2; run++)
        for (int k = 0; k < 3; k++) free(g[run][k]);
    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0), free(y);
    free(mean), free(rstd), free(rdinp), free(rdw), free(rdb), free(e0), free(e1), free(e2);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_neox, layernorm_backward_accumulates_deterministically) {
    check_layernorm_backward(601, 96);
    check_layernorm_backward(67, 4544);
}

/* ---- GELU ---- */

/* Forward (fp32 and bf16 out) and backward (fp32 and its bf16 copy; the
 * bf16 copy alone) of both forms against the CPU's, from fp32 input and
 * from bf16 input (the reference fed the same rounded values); n = 1001
 * runs the scalar tail. */
static void check_gelu(int tanh_form, int bf16_in) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 1001;
    float *x = hrand(n, 51 + tanh_form, -6, 6), *dout = hrand(n, 53, -1, 1);
    if (bf16_in) { /* the reference sees the GPU's input */
        float *r = rounded(x, n);
        free(x);
        x = r;
    }
    mt_dt in_dt = bf16_in ? MT_DT_BF16 : MT_DT_F32;
    float *ref = malloc(n * 4), *rdx = malloc(n * 4);
    mt_cpu_gelu_forward(ref, x, n, tanh_form);
    mt_cpu_gelu_backward(rdx, dout, x, n, tanh_form);
    double *dref = dcopy(ref, n), *ddx = dcopy(rdx, n);
    void *d_x = dupload_op(&pool, x, n, bf16_in ? MT_PREC_BF16 : MT_PREC_FP32);
    float *d_dout = dupload(&pool, dout, n * 4);
    float *d_out = dalloc(&pool, n * 4), *d_dx = dalloc(&pool, n * 4);
    uint16_t *d_out16 = dalloc(&pool, n * 2), *d_dx16 = dalloc(&pool, n * 2);
    dpoison(d_out, n * 4);
    dpoison(d_out16, n * 2);
    dpoison(d_dx, n * 4);
    dpoison(d_dx16, n * 2);
    mt_cuda_gelu_forward(ctx, d_out, MT_DT_F32, d_x, in_dt, n, tanh_form);
    mt_cuda_gelu_forward(ctx, d_out16, MT_DT_BF16, d_x, in_dt, n, tanh_form);
    mt_cuda_gelu_backward(ctx, d_dx, d_dx16, d_dout, d_x, in_dt, n, tanh_form);
    float *out = malloc(n * 4), *dx = malloc(n * 4);
    uint16_t *o16 = malloc(n * 2), *dx16 = malloc(n * 2);
    download(out, d_out, n * 4);
    download(o16, d_out16, n * 2);
    download(dx, d_dx, n * 4);
    download(dx16, d_dx16, n * 2);
    expect_close(out, dref, n, TOL_F32, tanh_form ? "gelu tanh out" : "gelu erf out");
    float *of = bf16_to_f32_host(o16, n);
    expect_close(of, dref, n, TOL_BF16_OUT, "gelu bf16 out");
    expect_close(dx, ddx, n, TOL_F32, tanh_form ? "gelu tanh dinp" : "gelu erf dinp");
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(dx16[i], f2bf(dx[i]), "bf16 gelu dinp[%zu] is not the fp32 one rounded", i);
    /* the bf16 copy alone (no bias wants the fp32 one): the same bits */
    dpoison(d_dx16, n * 2);
    mt_cuda_gelu_backward(ctx, NULL, d_dx16, d_dout, d_x, in_dt, n, tanh_form);
    uint16_t *alone = malloc(n * 2);
    download(alone, d_dx16, n * 2);
    cr_assert(!memcmp(alone, dx16, n * 2), "gelu backward without its fp32 output differs");
    free(alone);
    free(x), free(dout), free(ref), free(rdx), free(dref), free(ddx), free(out), free(dx);
    free(o16), free(dx16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_neox, gelu_erf_forward_backward) {
    check_gelu(0, 0);
    check_gelu(0, 1);
}
Test(cuda_ops_neox, gelu_tanh_forward_backward) {
    check_gelu(1, 0);
    check_gelu(1, 1);
}

/* ---- the fused qkv with partial rotary ---- */

/* The CPU's reading of the fused layout (backend/cpu/neox.c): per token,
 * NKV groups of G query heads, k, v. */
static void cpu_split(float *q, float *k, float *v, const float *qkv, size_t N, size_t NH,
                      size_t NKV, size_t HD) {
    size_t G = NH / NKV;
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < NKV; g++) {
            const float *src = qkv + (n * NKV + g) * (G + 2) * HD;
            memcpy(q + (n * NH + g * G) * HD, src, G * HD * 4);
            memcpy(k + (n * NKV + g) * HD, src + G * HD, HD * 4);
            memcpy(v + (n * NKV + g) * HD, src + (G + 1) * HD, HD * 4);
        }
}

static void cpu_join(float *qkv, const float *q, const float *k, const float *v, size_t N,
                     size_t NH, size_t NKV, size_t HD) {
    size_t G = NH / NKV;
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < NKV; g++) {
            float *dst = qkv + (n * NKV + g) * (G + 2) * HD;
            memcpy(dst, q + (n * NH + g * G) * HD, G * HD * 4);
            memcpy(dst + G * HD, k + (n * NKV + g) * HD, HD * 4);
            memcpy(dst + (G + 1) * HD, v + (n * NKV + g) * HD, HD * 4);
        }
}

/* Split + rotation and join + inverse rotation against the CPU's split,
 * mt_cpu_rope_partial_forward/backward and join, for B rows of T tokens
 * with or without packed positions; the split also from bf16 qkv (the
 * reference fed the same rounded values) into fp32 and into bf16. */
static void check_qkv_rope(size_t NH, size_t NKV, size_t HD, size_t R, int packed) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t B = 2, T = 13, N = B * T, Q = NH * HD, KV = NKV * HD, W = Q + 2 * KV;
    float *qkv = hrand(N * W, 61, -1, 1), *cs = hrand(T * R / 2, 62, -1, 1);
    float *sn = hrand(T * R / 2, 63, -1, 1);
    int32_t pos[2 * 13];
    for (size_t b = 0; b < B; b++) /* row 0: documents of 5 and 8 tokens; row 1: one */
        for (size_t t = 0; t < T; t++) pos[b * T + t] = (int32_t)(b == 0 && t >= 5 ? t - 5 : t);
    const int32_t *p = packed ? pos : NULL;
    float *rq = malloc(N * Q * 4), *rk = malloc(N * KV * 4), *rv = malloc(N * KV * 4);
    cpu_split(rq, rk, rv, qkv, N, NH, NKV, HD);
    mt_cpu_rope_partial_forward(rq, cs, sn, p, B, T, NH, HD, R);
    mt_cpu_rope_partial_forward(rk, cs, sn, p, B, T, NKV, HD, R);
    float *d_qkv = dupload(&pool, qkv, N * W * 4), *d_cos = dupload(&pool, cs, T * R / 2 * 4);
    float *d_sin = dupload(&pool, sn, T * R / 2 * 4);
    int32_t *d_pos = packed ? dupload(&pool, pos, sizeof pos) : NULL;
    float *d_q = dalloc(&pool, N * Q * 4), *d_k = dalloc(&pool, N * KV * 4);
    float *d_v = dalloc(&pool, N * KV * 4);
    dpoison(d_q, N * Q * 4);
    dpoison(d_k, N * KV * 4);
    dpoison(d_v, N * KV * 4);
    mt_cuda_qkv_split_rope(ctx, d_q, d_k, d_v, MT_DT_F32, d_qkv, MT_DT_F32, d_cos, d_sin, d_pos, B,
                           T, NH, NKV, HD, R);
    float *q = malloc(N * Q * 4), *k = malloc(N * KV * 4), *v = malloc(N * KV * 4);
    download(q, d_q, N * Q * 4);
    download(k, d_k, N * KV * 4);
    download(v, d_v, N * KV * 4);
    double *eq = dcopy(rq, N * Q), *ek = dcopy(rk, N * KV), *ev = dcopy(rv, N * KV);
    expect_close(q, eq, N * Q, TOL_F32, "split q");
    expect_close(k, ek, N * KV, TOL_F32, "split k");
    expect_close(v, ev, N * KV, TOL_F32, "split v (not rotated)");
    { /* bf16 qkv into fp32 and into bf16 q, k, v */
        float *qkv_r = rounded(qkv, N * W);
        cpu_split(rq, rk, rv, qkv_r, N, NH, NKV, HD);
        mt_cpu_rope_partial_forward(rq, cs, sn, p, B, T, NH, HD, R);
        mt_cpu_rope_partial_forward(rk, cs, sn, p, B, T, NKV, HD, R);
        double *fq = dcopy(rq, N * Q), *fk = dcopy(rk, N * KV), *fv = dcopy(rv, N * KV);
        void *d_qkv16 = dupload_op(&pool, qkv, N * W, MT_PREC_BF16);
        dpoison(d_q, N * Q * 4);
        dpoison(d_k, N * KV * 4);
        dpoison(d_v, N * KV * 4);
        mt_cuda_qkv_split_rope(ctx, d_q, d_k, d_v, MT_DT_F32, d_qkv16, MT_DT_BF16, d_cos, d_sin,
                               d_pos, B, T, NH, NKV, HD, R);
        download(q, d_q, N * Q * 4);
        download(k, d_k, N * KV * 4);
        download(v, d_v, N * KV * 4);
        expect_close(q, fq, N * Q, TOL_F32, "split of bf16 qkv: q");
        expect_close(k, fk, N * KV, TOL_F32, "split of bf16 qkv: k");
        expect_close(v, fv, N * KV, TOL_F32, "split of bf16 qkv: v");
        uint16_t *d_q16 = dalloc(&pool, N * Q * 2), *d_k16 = dalloc(&pool, N * KV * 2);
        uint16_t *d_v16 = dalloc(&pool, N * KV * 2);
        dpoison(d_q16, N * Q * 2);
        dpoison(d_k16, N * KV * 2);
        dpoison(d_v16, N * KV * 2);
        mt_cuda_qkv_split_rope(ctx, d_q16, d_k16, d_v16, MT_DT_BF16, d_qkv16, MT_DT_BF16, d_cos,
                               d_sin, d_pos, B, T, NH, NKV, HD, R);
        uint16_t *h16 = malloc(N * Q * 2);
        struct { uint16_t *d; const double *ref; size_t n; const char *what; } outs[] = {
            {d_q16, fq, N * Q, "bf16 split q"}, {d_k16, fk, N * KV, "bf16 split k"},
            {d_v16, fv, N * KV, "bf16 split v"}};
        for (int i = 0; i < 3; i++) {
            download(h16, outs[i].d, outs[i].n * 2);
            float *f = bf16_to_f32_host(h16, outs[i].n);
            expect_close(f, outs[i].ref, outs[i].n, TOL_BF16_OUT, outs[i].what);
            free(f);
        }
        free(qkv_r), free(fq), free(fk), free(fv), free(h16);
    }
    /* the backward: gradients of q, k, v into the fused layout */
    float *dq = hrand(N * Q, 64, -1, 1), *dk = hrand(N * KV, 65, -1, 1);
    float *dv = hrand(N * KV, 66, -1, 1), *rdqkv = malloc(N * W * 4);
    float *dq_r = malloc(N * Q * 4), *dk_r = malloc(N * KV * 4);
    memcpy(dq_r, dq, N * Q * 4);
    memcpy(dk_r, dk, N * KV * 4);
    mt_cpu_rope_partial_backward(dq_r, cs, sn, p, B, T, NH, HD, R);
    mt_cpu_rope_partial_backward(dk_r, cs, sn, p, B, T, NKV, HD, R);
    cpu_join(rdqkv, dq_r, dk_r, dv, N, NH, NKV, HD);
    float *d_dq = dupload(&pool, dq, N * Q * 4), *d_dk = dupload(&pool, dk, N * KV * 4);
    float *d_dv = dupload(&pool, dv, N * KV * 4), *d_dqkv = dalloc(&pool, N * W * 4);
    uint16_t *d_dqkv16 = dalloc(&pool, N * W * 2);
    dpoison(d_dqkv, N * W * 4);
    dpoison(d_dqkv16, N * W * 2);
    mt_cuda_qkv_join_rope_backward(ctx, d_dqkv, d_dqkv16, d_dq, d_dk, d_dv, d_cos, d_sin, d_pos,
                                   B, T, NH, NKV, HD, R);
    float *dqkv = malloc(N * W * 4);
    uint16_t *dqkv16 = malloc(N * W * 2);
    download(dqkv, d_dqkv, N * W * 4);
    download(dqkv16, d_dqkv16, N * W * 2);
    double *edqkv = dcopy(rdqkv, N * W);
    expect_close(dqkv, edqkv, N * W, TOL_F32, "join dqkv");
    for (size_t i = 0; i < N * W; i++)
        cr_assert_eq(dqkv16[i], f2bf(dqkv[i]), "bf16 dqkv[%zu] is not the fp32 one rounded", i);
    { /* the bf16 copy alone (no bias wants the fp32 one): the same bits */
        uint16_t *alone = malloc(N * W * 2);
        dpoison(d_dqkv16, N * W * 2);
        mt_cuda_qkv_join_rope_backward(ctx, NULL, d_dqkv16, d_dq, d_dk, d_dv, d_cos, d_sin,
                                       d_pos, B, T, NH, NKV, HD, R);
        download(alone, d_dqkv16, N * W * 2);
        cr_assert(!memcmp(alone, dqkv16, N * W * 2), "join without its fp32 output differs");
        free(alone);
    }
    free(qkv), free(cs), free(sn), free(rq), free(rk), free(rv), free(q), free(k), free(v);
    free(eq), free(ek), free(ev), free(dq), free(dk), free(dv), free(rdqkv), free(dq_r);
    free(dk_r), free(dqkv), free(dqkv16), free(edqkv);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_neox, qkv_split_partial_rotary) {
    check_qkv_rope(4, 4, 16, 4, 0);  /* gpt_neox: rotary_pct 0.25 */
    check_qkv_rope(4, 4, 16, 4, 1);  /* packed documents */
    check_qkv_rope(4, 4, 16, 16, 0); /* full rotary */
}

Test(cuda_ops_neox, qkv_split_grouped_and_multi_query) {
    check_qkv_rope(4, 2, 8, 8, 1);  /* falcon's new decoder: grouped kv heads */
    check_qkv_rope(6, 1, 8, 8, 0);  /* Falcon-7B: one kv head */
    check_qkv_rope(6, 1, 12, 6, 1); /* rotated dims not a multiple of 4 */
}
