/* Tests of the CUDA operators Gemma adds (see test_cuda_ops.c for the method
 * and the tolerances): the GeGLU (tanh and erf GELU), the affine map of the
 * 1 + w norms and the embedding's scale, the post-norms with their residual
 * (forward and backward), and the LM head's loss under Gemma 2's final
 * logit soft-cap. */
#include "cuda_ops_util.h"

static int same_bits(const void *d_a, const void *d_b, size_t bytes) {
    void *a = malloc(bytes), *b = malloc(bytes);
    download(a, d_a, bytes);
    download(b, d_b, bytes);
    int same = memcmp(a, b, bytes) == 0;
    free(a), free(b);
    return same;
}

/* ---- GeGLU ---- */

static double gelu_ref(double x, int tanh_form) {
    if (tanh_form)
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

/* The derivative by central differences in double: an independent check
 * of the closed forms the kernels use (step 1e-5: error ~1e-10). */
static double gelu_grad_ref(double x, int tanh_form) {
    const double h = 1e-5;
    return (gelu_ref(x + h, tanh_form) - gelu_ref(x - h, tanh_form)) / (2 * h);
}

static void check_geglu(int tanh_form) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, F = 101, n = N * F;
    float *g = hrand(n, 41, -5, 5), *u = hrand(n, 42, -2, 2), *d = hrand(n, 43, -1, 1);
    double *ro = malloc(n * 8), *rdg = malloc(n * 8), *rdu = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        ro[i] = gelu_ref(g[i], tanh_form) * u[i];
        rdu[i] = (double)d[i] * gelu_ref(g[i], tanh_form);
        rdg[i] = (double)d[i] * u[i] * gelu_grad_ref(g[i], tanh_form);
    }
    float *d_g = dupload(&pool, g, n * 4), *d_u = dupload(&pool, u, n * 4);
    float *d_d = dupload(&pool, d, n * 4), *d_out = dalloc(&pool, n * 4);
    float *d_dg = dalloc(&pool, n * 4), *d_du = dalloc(&pool, n * 4);
    float *out = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4);
    mt_cuda_geglu_forward(ctx, d_out, MT_DT_F32, d_g, d_u, MT_DT_F32, N, F, tanh_form);
    download(out, d_out, n * 4);
    expect_close(out, ro, n, TOL_F32, "geglu out");
    dpoison(d_out, n * 4);
    mt_cuda_geglu_forward(ctx, d_out, MT_DT_BF16, d_g, d_u, MT_DT_F32, N, F, tanh_form);
    uint16_t *o16 = malloc(n * 2);
    download(o16, d_out, n * 2);
    float *of = bf16_to_f32_host(o16, n);
    expect_close(of, ro, n, TOL_BF16_OUT, "geglu bf16 out");
    dpoison(d_dg, n * 4);
    dpoison(d_du, n * 4);
    mt_cuda_geglu_backward(ctx, d_dg, d_du, d_d, MT_DT_F32, d_g, d_u, MT_DT_F32, N, F,
                           tanh_form);
    download(dg, d_dg, n * 4);
    download(du, d_du, n * 4);
    expect_close(dg, rdg, n, TOL_F32, "geglu dgate");
    expect_close(du, rdu, n, TOL_F32, "geglu dup");
    free(g), free(u), free(d), free(ro), free(rdg), free(rdu), free(out), free(dg), free(du);
    free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_gemma, geglu_tanh) { check_geglu(1); }
Test(cuda_ops_gemma, geglu_erf) { check_geglu(0); }

/* The bf16 fast path's GeGLU: bf16 gate and up in, bf16 out and bf16
 * gradients, fp32 arithmetic; the reference in double from the same
 * bf16-rounded inputs, so only the outputs' rounding separates them
 * (TOL_BF16_OUT: one bf16 rounding of the result). */
static void check_geglu_bf16(int tanh_form) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 29, F = 131, n = N * F;
    float *g0 = hrand(n, 51, -5, 5), *u0 = hrand(n, 52, -2, 2), *d = hrand(n, 53, -1, 1);
    float *g = rounded(g0, n), *u = rounded(u0, n);
    uint16_t *g16 = to_bf16(g0, n), *u16 = to_bf16(u0, n), *o16 = malloc(n * 2);
    uint16_t *dg16 = malloc(n * 2), *du16 = malloc(n * 2);
    double *ro = malloc(n * 8), *rdg = malloc(n * 8), *rdu = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        ro[i] = gelu_ref(g[i], tanh_form) * u[i];
        rdu[i] = (double)d[i] * gelu_ref(g[i], tanh_form);
        rdg[i] = (double)d[i] * u[i] * gelu_grad_ref(g[i], tanh_form);
    }
    void *d_g = dupload(&pool, g16, n * 2), *d_u = dupload(&pool, u16, n * 2);
    float *d_d = dupload(&pool, d, n * 4);
    void *d_out = dalloc(&pool, n * 2), *d_dg = dalloc(&pool, n * 2), *d_du = dalloc(&pool, n * 2);
    dpoison(d_out, n * 2);
    mt_cuda_geglu_forward(ctx, d_out, MT_DT_BF16, d_g, d_u, MT_DT_BF16, N, F, tanh_form);
    download(o16, d_out, n * 2);
    dpoison(d_dg, n * 2);
    dpoison(d_du, n * 2);
    mt_cuda_geglu_backward(ctx, d_dg, d_du, d_d, MT_DT_F32, d_g, d_u, MT_DT_BF16, N, F,
                           tanh_form);
    download(dg16, d_dg, n * 2);
    download(du16, d_du, n * 2);
    float *of = bf16_to_f32_host(o16, n), *dgf = bf16_to_f32_host(dg16, n);
    float *duf = bf16_to_f32_host(du16, n);
    expect_close(of, ro, n, TOL_BF16_OUT, "geglu bf16 in, out");
    expect_close(dgf, rdg, n, TOL_BF16_OUT, "geglu bf16 dgate");
    expect_close(duf, rdu, n, TOL_BF16_OUT, "geglu bf16 dup");
    free(g0), free(u0), free(d), free(g), free(u), free(g16), free(u16), free(o16);
    free(dg16), free(du16), free(ro), free(rdg), free(rdu), free(of), free(dgf), free(duf);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_gemma, geglu_bf16_tanh) { check_geglu_bf16(1); }
Test(cuda_ops_gemma, geglu_bf16_erf) { check_geglu_bf16(0); }

/* The bf16 GeGLU on 16-byte aligned arrays (8 elements a thread) and on
 * arrays one element off (one a thread) gives the same bits, the tail of
 * the vector path included (n not a multiple of 8). */
static void check_geglu_bf16_paths(int tanh_form) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 8 * 517 + 5;
    float *g = hrand(n, 61, -6, 6), *u = hrand(n, 62, -2, 2), *d = hrand(n, 63, -1, 1);
    uint16_t *g16 = to_bf16(g, n), *u16 = to_bf16(u, n);
    uint16_t *dg = dalloc(&pool, (n + 8) * 2), *du = dalloc(&pool, (n + 8) * 2);
    uint16_t *dout = dalloc(&pool, (n + 8) * 2), *dgg = dalloc(&pool, (n + 8) * 2);
    uint16_t *dgu = dalloc(&pool, (n + 8) * 2);
    float *dd = dalloc(&pool, (n + 8) * 4);
    uint16_t *got[2][3];
    for (int off = 0; off < 2; off++) { /* off 0: the vector kernels; 1: the element ones */
        CUDA_CHECK(cudaMemcpy(dg + off, g16, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(du + off, u16, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dd + off, d, n * 4, cudaMemcpyHostToDevice));
        dpoison(dout, (n + 8) * 2), dpoison(dgg, (n + 8) * 2), dpoison(dgu, (n + 8) * 2);
        mt_cuda_geglu_forward(ctx, dout + off, MT_DT_BF16, dg + off, du + off, MT_DT_BF16, n, 1,
                              tanh_form);
        mt_cuda_geglu_backward(ctx, dgg + off, dgu + off, dd + off, MT_DT_F32, dg + off,
                               du + off, MT_DT_BF16, n, 1, tanh_form);
        uint16_t *bufs[3] = {dout, dgg, dgu};
        for (int b = 0; b < 3; b++) {
            got[off][b] = malloc(n * 2);
            download(got[off][b], bufs[b] + off, n * 2);
        }
    }
    const char *what[3] = {"out", "dgate", "dup"};
    for (int b = 0; b < 3; b++) {
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(got[0][b][i], got[1][b][i], "geglu %s at %zu: vector %04x, element %04x",
                         what[b], i, got[0][b][i], got[1][b][i]);
        free(got[0][b]), free(got[1][b]);
    }
    free(g), free(u), free(d), free(g16), free(u16);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_gemma, geglu_bf16_vector_path_is_the_element_one_tanh) {
    check_geglu_bf16_paths(1);
}
Test(cuda_ops_gemma, geglu_bf16_vector_path_is_the_element_one_erf) {
    check_geglu_bf16_paths(0);
}

/* The backward from a bf16 output gradient is the one from that gradient
 * widened to fp32, bit for bit, on both paths (the vector kernels on
 * 16-byte aligned arrays, the element ones one element off); the fp32
 * one is checked against double above. */
static void check_geglu_bf16_dout(int tanh_form) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 8 * 389 + 3, bytes = (n + 8) * 2;
    float *g = hrand(n, 64, -6, 6), *u = hrand(n, 65, -2, 2), *d0 = hrand(n, 66, -1, 1);
    float *d = rounded(d0, n);
    uint16_t *g16 = to_bf16(g, n), *u16 = to_bf16(u, n), *d16 = to_bf16(d0, n);
    uint16_t *dg = dalloc(&pool, bytes), *du = dalloc(&pool, bytes), *dd16 = dalloc(&pool, bytes);
    float *dd = dalloc(&pool, (n + 8) * 4);
    uint16_t *out[2][2] = {{dalloc(&pool, bytes), dalloc(&pool, bytes)},
                           {dalloc(&pool, bytes), dalloc(&pool, bytes)}};
    for (int off = 0; off < 2; off++) {
        CUDA_CHECK(cudaMemcpy(dg + off, g16, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(du + off, u16, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dd16 + off, d16, n * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dd + off, d, n * 4, cudaMemcpyHostToDevice));
        for (int k = 0; k < 2; k++) dpoison(out[k][0], bytes), dpoison(out[k][1], bytes);
        mt_cuda_geglu_backward(ctx, out[0][0] + off, out[0][1] + off, dd + off, MT_DT_F32,
                               dg + off, du + off, MT_DT_BF16, n, 1, tanh_form);
        mt_cuda_geglu_backward(ctx, out[1][0] + off, out[1][1] + off, dd16 + off, MT_DT_BF16,
                               dg + off, du + off, MT_DT_BF16, n, 1, tanh_form);
        cr_assert(same_bits(out[0][0] + off, out[1][0] + off, n * 2),
                  "dgate from a bf16 dout differs (%s path)", off ? "element" : "vector");
        cr_assert(same_bits(out[0][1] + off, out[1][1] + off, n * 2),
                  "dup from a bf16 dout differs (%s path)", off ? "element" : "vector");
    }
    free(g), free(u), free(d0), free(d), free(g16), free(u16), free(d16);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops_gemma, geglu_backward_of_a_bf16_gradient_is_the_widened_ones_tanh) {
    check_geglu_bf16_dout(1);
}
Test(cuda_ops_gemma, geglu_backward_of_a_bf16_gradient_is_the_widened_ones_erf) {
    check_geglu_bf16_dout(0);
}

/* 1 + w and x * sqrt(C) are exact in one rounding, as on the CPU: the same
 * bits (in place for the scale). */
Test(cuda_ops_gemma, affine_is_the_cpus_one_plus_w_and_scale) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 1003;
    const float s = (float)sqrt(2304.0);
    float *w = hrand(n, 44, -1, 1), *got = malloc(n * 4);
    float *d_w = dupload(&pool, w, n * 4), *d_out = dalloc(&pool, n * 4);
    mt_cuda_affine(ctx, d_out, d_w, n, 1.0f, 1.0f);
    download(got, d_out, n * 4);
    for (size_t i = 0; i < n; i++) cr_assert_eq(got[i], 1.0f + w[i], "1 + w at %zu", i);
    mt_cuda_affine(ctx, d_w, d_w, n, s, 0.0f);
    download(got, d_w, n * 4);
    for (size_t i = 0; i < n; i++) cr_assert_eq(got[i], w[i] * s, "w * s at %zu", i);
    free(w), free(got);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- the post-norms ---- */

/* out = res + norm(inp) w with the next norm of out beside it (bf16), in
 * one pass, against a double reference and bit for bit against the plain
 * kernels one after another; out NULL: the rstd alone, the same bits.
 * C = 3584 takes the one-pass kernel (N not a multiple of its 16 rows),
 * C = 96 the plain kernels. */
static void check_residual_norm(size_t N, size_t C) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const float eps = 1e-6f;
    float *inp = hrand(N * C, 47, -3, 3), *res = hrand(N * C, 48, -2, 2);
    float *w = hrand(C, 49, 0.5f, 1.5f), *w2 = hrand(C, 50, 0.5f, 1.5f);
    double *ref = malloc(N * C * 8);
    for (size_t n = 0; n < N; n++) {
        double ss = 0;
        for (size_t c = 0; c < C; c++) ss += (double)inp[n * C + c] * inp[n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (size_t c = 0; c < C; c++) ref[n * C + c] = res[n * C + c] + inp[n * C + c] * r * w[c];
    }
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_res = dupload(&pool, res, N * C * 4);
    float *d_w = dupload(&pool, w, C * 4), *d_w2 = dupload(&pool, w2, C * 4);
    float *out[2], *rstd[2], *rstd2[2];
    uint16_t *next[2];
    for (int k = 0; k < 2; k++) {
        out[k] = dalloc(&pool, N * C * 4), next[k] = dalloc(&pool, N * C * 2);
        rstd[k] = dalloc(&pool, N * 4), rstd2[k] = dalloc(&pool, N * 4);
        dpoison(out[k], N * C * 4), dpoison(next[k], N * C * 2);
        dpoison(rstd[k], N * 4), dpoison(rstd2[k], N * 4);
    }
    mt_cuda_rmsnorm_forward(ctx, out[0], MT_DT_F32, rstd[0], d_inp, d_w, N, C, eps);
    mt_cuda_residual_add(ctx, out[0], out[0], d_res, N * C);
    mt_cuda_rmsnorm_forward(ctx, next[0], MT_DT_BF16, rstd2[0], out[0], d_w2, N, C, eps);
    mt_cuda_rmsnorm_residual_forward(ctx, out[1], rstd[1], d_inp, MT_DT_F32, d_w, d_res, next[1],
                                     MT_DT_BF16, rstd2[1], d_w2, N, C, eps);
    float *got = malloc(N * C * 4);
    download(got, out[1], N * C * 4);
    expect_close(got, ref, N * C, TOL_F32, "res + norm(inp)");
    cr_assert(same_bits(out[0], out[1], N * C * 4), "the sum differs from the plain kernels'");
    cr_assert(same_bits(rstd[0], rstd[1], N * 4), "rstd differs from the plain kernel's");
    cr_assert(same_bits(next[0], next[1], N * C * 2), "the next norm differs (C %zu)", C);
    cr_assert(same_bits(rstd2[0], rstd2[1], N * 4), "the next rstd differs");
    dpoison(rstd[1], N * 4);
    mt_cuda_rmsnorm_residual_forward(ctx, NULL, rstd[1], d_inp, MT_DT_F32, d_w, NULL, NULL,
                                     MT_DT_F32, NULL, NULL, N, C, eps);
    cr_assert(same_bits(rstd[0], rstd[1], N * 4), "rstd alone differs");
    /* bf16 input (Gemma's bf16 products): the fp32 input's bits when that
     * holds the same values */
    uint16_t *in16 = to_bf16(inp, N * C);
    float *inr = rounded(inp, N * C);
    void *d_in16 = dupload(&pool, in16, N * C * 2);
    CUDA_CHECK(cudaMemcpy(d_inp, inr, N * C * 4, cudaMemcpyHostToDevice));
    for (int k = 0; k < 2; k++) {
        dpoison(out[k], N * C * 4), dpoison(next[k], N * C * 2);
        dpoison(rstd[k], N * 4), dpoison(rstd2[k], N * 4);
        mt_cuda_rmsnorm_residual_forward(ctx, out[k], rstd[k], k ? d_in16 : (void *)d_inp,
                                         k ? MT_DT_BF16 : MT_DT_F32, d_w, d_res, next[k],
                                         MT_DT_BF16, rstd2[k], d_w2, N, C, eps);
    }
    cr_assert(same_bits(out[0], out[1], N * C * 4), "bf16 input: the sum differs (C %zu)", C);
    cr_assert(same_bits(rstd[0], rstd[1], N * 4), "bf16 input: rstd differs");
    cr_assert(same_bits(next[0], next[1], N * C * 2), "bf16 input: the next norm differs");
    cr_assert(same_bits(rstd2[0], rstd2[1], N * 4), "bf16 input: the next rstd differs");
    free(in16), free(inr);
    free(inp), free(res), free(w), free(w2), free(ref), free(got);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}
Test(cuda_ops_gemma, post_norm_with_residual_and_next_norm) {
    check_residual_norm(37, 3584);
    check_residual_norm(29, 96);
}

/* A post-norm's backward straight to bf16 (added to nothing): the plain
 * backward into zeros, rounded, bit for bit, and the same weight gradient;
 * the plain backward is checked against double in test_cuda_ops.c. */
static void check_post_norm_backward(size_t N, size_t C) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const float eps = 1e-6f;
    float *inp = hrand(N * C, 51, -2, 2), *w = hrand(C, 52, 0.5f, 1.5f);
    float *dout = hrand(N * C, 53, -1, 1), *dw0 = hrand(C, 54, -1, 1);
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_dout = dupload(&pool, dout, N * C * 4), *d_rstd = dalloc(&pool, N * 4);
    float *d_d32 = dalloc(&pool, N * C * 4);
    float *dw[2] = {dupload(&pool, dw0, C * 4), dupload(&pool, dw0, C * 4)};
    uint16_t *op[2] = {dalloc(&pool, N * C * 2), dalloc(&pool, N * C * 2)};
    float *scratch = dalloc(&pool, mt_cuda_colsum_scratch_floats(N, C) * 4);
    mt_cuda_rmsnorm_forward(ctx, NULL, MT_DT_F32, d_rstd, d_inp, d_w, N, C, eps);
    CUDA_CHECK(cudaMemset(d_d32, 0, N * C * 4));
    dpoison(op[0], N * C * 2), dpoison(op[1], N * C * 2);
    mt_cuda_rmsnorm_backward_op(ctx, d_d32, op[0], dw[0], scratch, d_dout, d_inp, d_w, d_rstd, N,
                                C);
    mt_cuda_rmsnorm_backward_to_bf16(ctx, op[1], dw[1], scratch, d_dout, d_inp, MT_DT_F32, d_w,
                                     d_rstd, N, C);
    cr_assert(same_bits(op[0], op[1], N * C * 2), "bf16 dinp differs (C %zu)", C);
    cr_assert(same_bits(dw[0], dw[1], C * 4), "dw differs (C %zu)", C);
    /* bf16 input: the fp32 input's bits when that holds the same values */
    uint16_t *in16 = to_bf16(inp, N * C);
    float *inr = rounded(inp, N * C);
    void *d_in16 = dupload(&pool, in16, N * C * 2);
    CUDA_CHECK(cudaMemcpy(d_inp, inr, N * C * 4, cudaMemcpyHostToDevice));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMemcpy(dw[k], dw0, C * 4, cudaMemcpyHostToDevice));
        dpoison(op[k], N * C * 2);
        mt_cuda_rmsnorm_backward_to_bf16(ctx, op[k], dw[k], scratch, d_dout,
                                         k ? d_in16 : (void *)d_inp, k ? MT_DT_BF16 : MT_DT_F32,
                                         d_w, d_rstd, N, C);
    }
    cr_assert(same_bits(op[0], op[1], N * C * 2), "bf16 input: dinp differs (C %zu)", C);
    cr_assert(same_bits(dw[0], dw[1], C * 4), "bf16 input: dw differs (C %zu)", C);
    free(in16), free(inr);
    free(inp), free(w), free(dout), free(dw0);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}
Test(cuda_ops_gemma, post_norm_backward_straight_to_bf16) {
    check_post_norm_backward(601, 3584);
    check_post_norm_backward(601, 96);
}

/* ---- the soft-capped LM head ---- */

/* The reference in double: logits = cap * tanh(hid w^T / cap), the
 * cross-entropy's gradient taken back through the cap, then into dhidden
 * and dw. Returns the loss sum. */
static double ref_capped_head(double *loss, double *dh, double *dw, const float *hid,
                              const float *w, const int32_t *tgt, size_t N, size_t C, size_t V,
                              double dscale, double cap) {
    double *l = malloc(V * 8), *dl = malloc(V * 8), total = 0;
    for (size_t n = 0; n < N; n++) {
        if (tgt[n] == IGNORE) {
            loss[n] = 0;
            continue;
        }
        double m = -INFINITY, s = 0;
        for (size_t v = 0; v < V; v++) {
            double x = 0;
            for (size_t c = 0; c < C; c++) x += (double)hid[n * C + c] * w[v * C + c];
            l[v] = cap * tanh(x / cap);
            dl[v] = 1.0 - tanh(x / cap) * tanh(x / cap); /* the cap's derivative, for now */
            m = fmax(m, l[v]);
        }
        for (size_t v = 0; v < V; v++) s += exp(l[v] - m);
        double lse = m + log(s);
        loss[n] = lse - l[tgt[n]];
        total += loss[n];
        for (size_t v = 0; v < V; v++) {
            double d = (exp(l[v] - lse) - (v == (size_t)tgt[n])) * dscale * dl[v];
            for (size_t c = 0; c < C; c++) {
                dh[n * C + c] += d * w[v * C + c];
                dw[v * C + c] += d * hid[n * C + c];
            }
        }
    }
    free(l), free(dl);
    return total;
}

/* fp32, chunks of 16 rows, a cap the logits (|x| up to ~6) bend under; a
 * vocabulary past one round of the loss kernel's grouped loads (4 x 512),
 * so that the groups and the tail both run. */
Test(cuda_ops_gemma, lm_head_loss_under_the_final_softcap) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, C = 96, V = 2600, R = 16;
    const float dscale = 0.5f, cap = 3.0f;
    float *hid = hrand(N * C, 45, -0.5f, 0.5f), *w = hrand(V * C, 46, -0.5f, 0.5f);
    int32_t tgt[37];
    for (size_t i = 0; i < N; i++) tgt[i] = (int32_t)((i * 577 + 11) % V);
    tgt[2] = IGNORE;
    double rloss[37], *rdh = calloc(N * C, 8), *rdw = calloc(V * C, 8);
    double rsum = ref_capped_head(rloss, rdh, rdw, hid, w, tgt, N, C, V, dscale, cap);
    float *d_hid = dupload(&pool, hid, N * C * 4), *d_w = dupload(&pool, w, V * C * 4);
    float *d_dh = dalloc(&pool, N * C * 4), *d_dw = dalloc(&pool, V * C * 4);
    float *d_loss = dalloc(&pool, N * 4);
    int32_t *d_t = dupload(&pool, tgt, sizeof tgt);
    void *scratch = dalloc(&pool, mt_cuda_lm_head_scratch_bytes(MT_PREC_FP32, R, V));
    double *d_sum = dalloc(&pool, 8), zero = 0, sum;
    CUDA_CHECK(cudaMemcpy(d_sum, &zero, 8, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_dw, 0, V * C * 4));
    mt_cuda_lm_head_loss(ctx, MT_PREC_FP32, d_sum, d_loss, d_dh, false, d_dw, scratch, d_hid,
                         d_w, d_t, N, C, V, R, dscale, cap);
    float *gdh = malloc(N * C * 4), *gdw = malloc(V * C * 4), loss[37];
    download(gdh, d_dh, N * C * 4);
    download(gdw, d_dw, V * C * 4);
    download(loss, d_loss, N * 4);
    download(&sum, d_sum, 8);
    expect_close(loss, rloss, N, TOL_F32, "capped head row losses");
    cr_expect(fabs(sum - rsum) <= TOL_F32 * rsum, "loss sum %.9g vs %.9g", sum, rsum);
    expect_close(gdh, rdh, N * C, TOL_F32, "capped head dhidden");
    expect_close(gdw, rdw, V * C, TOL_F32, "capped head dw");
    /* the weighted form's forward: each row's -log p of its target */
    dpoison(d_loss, N * 4);
    mt_cuda_lm_head_loss_weighted(ctx, MT_PREC_FP32, d_loss, NULL, false, NULL, scratch, d_hid,
                                  d_w, d_t, NULL, N, C, V, R, cap);
    download(loss, d_loss, N * 4);
    expect_close(loss, rloss, N, TOL_F32, "capped head -log p");
    free(hid), free(w), free(rdh), free(rdw), free(gdh), free(gdw);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}
