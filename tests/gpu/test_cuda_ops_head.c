/* Tests of the CUDA operators, continued (see test_cuda_ops.c for the
 * method and the tolerances): RoPE, SwiGLU, the residual add, the loss and
 * the LM head. */
#include "cuda_ops_util.h"

/* ---- RoPE ---- */

/* pos: NULL, or positions of packed documents (B, T) on the host. */
static void check_rope(const int32_t *pos) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t B = 2, T = 5, H = 3, HD = 16, half = HD / 2, n = B * T * H * HD;
    float cosv[5 * 8], sinv[5 * 8];
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            double f = t * pow(10000.0, -2.0 * i / HD);
            cosv[t * half + i] = (float)cos(f);
            sinv[t * half + i] = (float)sin(f);
        }
    float *x = hrand(n, 22, -1, 1);
    double *ref = malloc(n * sizeof *ref), *refb = malloc(n * sizeof *refb);
    for (size_t row = 0; row < B * T * H; row++) {
        size_t t = pos ? (size_t)pos[row / H] : (row / H) % T;
        for (size_t i = 0; i < half; i++) {
            double c = cosv[t * half + i], s = sinv[t * half + i];
            double x1 = x[row * HD + i], x2 = x[row * HD + i + half];
            ref[row * HD + i] = x1 * c - x2 * s;
            ref[row * HD + i + half] = x2 * c + x1 * s;
            refb[row * HD + i] = x1 * c + x2 * s; /* transpose of the rotation */
            refb[row * HD + i + half] = x2 * c - x1 * s;
        }
    }
    float *d_x = dupload(&pool, x, n * 4);
    float *d_cos = dupload(&pool, cosv, sizeof cosv), *d_sin = dupload(&pool, sinv, sizeof sinv);
    int32_t *d_pos = pos ? dupload(&pool, pos, B * T * 4) : NULL;
    float *got = malloc(n * 4);
    mt_cuda_rope_forward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    expect_close(got, ref, n, TOL_F32, "rope forward");
    mt_cuda_rope_backward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    double *xd = dcopy(x, n);
    expect_close(got, xd, n, TOL_F32, "rope backward(forward(x)) == x");
    CUDA_CHECK(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
    mt_cuda_rope_backward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    expect_close(got, refb, n, TOL_F32, "rope backward");
    free(x), free(ref), free(refb), free(got), free(xd);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, rope_forward_and_inverse) { check_rope(NULL); }

/* Positions restarting at each packed document: 2, 3 | 1, 4 tokens. */
Test(cuda_ops, rope_packed_positions) {
    static const int32_t pos[10] = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3};
    check_rope(pos);
}

/* ---- SwiGLU and residual ---- */

static void check_swiglu(size_t N, size_t F) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    size_t n = N * F;
    float *g = hrand(n, 23, -4, 4), *u = hrand(n, 24, -2, 2), *d = hrand(n, 25, -1, 1);
    double *ro = malloc(n * 8), *rdg = malloc(n * 8), *rdu = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-(double)g[i]));
        ro[i] = g[i] * s * u[i];
        rdg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        rdu[i] = d[i] * g[i] * s;
    }
    float *d_g = dupload(&pool, g, n * 4), *d_u = dupload(&pool, u, n * 4);
    float *d_d = dupload(&pool, d, n * 4), *d_out = dalloc(&pool, n * 4);
    float *d_dg = dalloc(&pool, n * 4), *d_du = dalloc(&pool, n * 4);
    float *out = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4);
    mt_cuda_swiglu_forward(ctx, d_out, MT_DT_F32, d_g, d_u, N, F);
    download(out, d_out, n * 4);
    expect_close(out, ro, n, TOL_F32, "swiglu out");
    dpoison(d_out, n * 4);
    mt_cuda_swiglu_forward(ctx, d_out, MT_DT_BF16, d_g, d_u, N, F);
    uint16_t *o16 = malloc(n * 2);
    download(o16, d_out, n * 2);
    float *of = bf16_to_f32_host(o16, n);
    expect_close(of, ro, n, TOL_BF16_OUT, "swiglu bf16 out");
    mt_cuda_swiglu_backward(ctx, d_dg, d_du, d_d, d_g, d_u, N, F);
    download(dg, d_dg, n * 4);
    download(du, d_du, n * 4);
    expect_close(dg, rdg, n, TOL_F32, "swiglu dgate");
    expect_close(du, rdu, n, TOL_F32, "swiglu dup");
    free(g), free(u), free(d), free(ro), free(rdg), free(rdu), free(out), free(dg), free(du);
    free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, swiglu_vectorised) { check_swiglu(37, 100); }
Test(cuda_ops, swiglu_scalar_tail) { check_swiglu(37, 101); }

Test(cuda_ops, residual_add_in_place) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 1003;
    float *a = hrand(n, 26, -1, 1), *b = hrand(n, 27, -1, 1), *got = malloc(n * 4);
    float *d_a = dupload(&pool, a, n * 4), *d_b = dupload(&pool, b, n * 4);
    mt_cuda_residual_add(ctx, d_a, d_a, d_b, n);
    download(got, d_a, n * 4);
    for (size_t i = 0; i < n; i++) cr_assert_eq(got[i], a[i] + b[i], "at %zu", i);
    free(a), free(b), free(got);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- loss ---- */

/* Reference cross-entropy: row losses, dlogits; returns the loss sum. */
static double ref_ce(double *row_loss, double *dlogits, const double *logits,
                     const int32_t *targets, size_t N, size_t V, double dscale) {
    double total = 0;
    for (size_t n = 0; n < N; n++) {
        const double *x = logits + n * V;
        if (targets[n] == IGNORE) {
            row_loss[n] = 0;
            for (size_t v = 0; v < V; v++) dlogits[n * V + v] = 0;
            continue;
        }
        double m = -INFINITY, s = 0;
        for (size_t v = 0; v < V; v++) m = fmax(m, x[v]);
        for (size_t v = 0; v < V; v++) s += exp(x[v] - m);
        double lse = m + log(s);
        row_loss[n] = lse - x[targets[n]];
        total += row_loss[n];
        for (size_t v = 0; v < V; v++)
            dlogits[n * V + v] = (exp(x[v] - lse) - (v == (size_t)targets[n])) * dscale;
    }
    return total;
}

static void make_targets(int32_t *t, size_t N, size_t V) {
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((i * 577 + 11) % V);
    t[2] = IGNORE;
    t[N - 1] = IGNORE;
}

/* V: two rounds of the kernel's grouped loads (4 x 512 threads) and a tail. */
Test(cuda_ops, cross_entropy_rows_and_sum) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, V = 4500;
    float *logits = hrand(N * V, 28, -6, 6);
    int32_t targets[37];
    make_targets(targets, N, V);
    const float dscale = 1.0f / 35.0f;
    double *lg = dcopy(logits, N * V), *rdl = malloc(N * V * 8), rloss[37];
    double rsum = ref_ce(rloss, rdl, lg, targets, N, V, dscale);
    float *d_logits = dupload(&pool, logits, N * V * 4), *d_dl = dalloc(&pool, N * V * 4);
    uint16_t *d_dl16 = dalloc(&pool, N * V * 2);
    float *d_loss = dalloc(&pool, N * 4);
    int32_t *d_t = dupload(&pool, targets, sizeof targets);
    double *d_sum = dalloc(&pool, sizeof(double)), start = 2.5, sum;
    CUDA_CHECK(cudaMemcpy(d_sum, &start, sizeof start, cudaMemcpyHostToDevice));
    mt_cuda_cross_entropy(ctx, d_dl, d_dl16, d_loss, d_logits, d_t, N, V, dscale);
    mt_cuda_sum_to_double(ctx, d_sum, d_loss, N);
    float *dl = malloc(N * V * 4), loss[37];
    uint16_t *dl16 = malloc(N * V * 2);
    download(dl, d_dl, N * V * 4);
    download(dl16, d_dl16, N * V * 2);
    download(loss, d_loss, N * 4);
    download(&sum, d_sum, sizeof sum);
    expect_close(loss, rloss, N, TOL_F32, "row losses");
    expect_close(dl, rdl, N * V, TOL_F32, "dlogits");
    float *dlf = bf16_to_f32_host(dl16, N * V);
    expect_close(dlf, rdl, N * V, TOL_BF16_OUT, "dlogits bf16");
    cr_expect(fabs(sum - (start + rsum)) <= TOL_F32 * rsum, "loss sum %.9g vs %.9g", sum,
              start + rsum);
    cr_assert_eq(loss[2], 0.0f);
    for (size_t v = 0; v < V; v++) cr_assert_eq(dl[2 * V + v], 0.0f); /* ignored row */

    /* in place: dlogits over the logits */
    mt_cuda_cross_entropy(ctx, d_logits, NULL, d_loss, d_logits, d_t, N, V, dscale);
    download(dl, d_logits, N * V * 4);
    expect_close(dl, rdl, N * V, TOL_F32, "dlogits in place");
    free(logits), free(lg), free(rdl), free(dl), free(dl16), free(dlf);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

static void check_lm_head(mt_precision prec) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, C = 96, V = 1000, R = 16; /* chunks of 16, 16, 5 rows */
    bool bf = prec == MT_PREC_BF16;
    float *hid = hrand(N * C, 29, -1, 1), *w = hrand(V * C, 30, -1, 1);
    /* Pre-fills smaller than the gradients (|dlogits| <= dscale), so that
     * an error in the increment cannot hide under them. */
    float *dh0 = hrand(N * C, 31, -0.05f, 0.05f), *dw0 = hrand(V * C, 32, -0.05f, 0.05f);
    int32_t targets[37];
    make_targets(targets, N, V);
    const float dscale = 0.5f;
    float *hid_r = bf ? rounded(hid, N * C) : hid, *w_r = bf ? rounded(w, V * C) : w;
    double *logits = malloc(N * V * 8), *dl = malloc(N * V * 8), rloss[37];
    ref_matmul(logits, hid_r, w_r, NULL, N, C, V);
    double rsum = ref_ce(rloss, dl, logits, targets, N, V, dscale);
    float *dlf = to_float(dl, N * V);
    double *rdh = dcopy(dh0, N * C), *rdw = dcopy(dw0, V * C);
    ref_matmul_bwd(rdh, rdw, dlf, hid_r, w_r, N, C, V);
    void *d_hid = dupload_op(&pool, hid, N * C, prec), *d_w = dupload_op(&pool, w, V * C, prec);
    float *d_dh = dupload(&pool, dh0, N * C * 4), *d_dw = dupload(&pool, dw0, V * C * 4);
    float *d_loss = dalloc(&pool, N * 4);
    int32_t *d_t = dupload(&pool, targets, sizeof targets);
    void *scratch = dalloc(&pool, mt_cuda_lm_head_scratch_bytes(prec, R, V));
    double *d_sum = dalloc(&pool, 8), start = 1.5, sum;
    CUDA_CHECK(cudaMemcpy(d_sum, &start, 8, cudaMemcpyHostToDevice));
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, true, d_dw, scratch, d_hid, d_w,
                         d_t, N, C, V, R, dscale, 0.0f);
    float *gdh = malloc(N * C * 4), *gdw = malloc(V * C * 4), loss[37];
    download(gdh, d_dh, N * C * 4);
    download(gdw, d_dw, V * C * 4);
    download(loss, d_loss, N * 4);
    download(&sum, d_sum, 8);
    /* Logits come from exact products of the same operands (fp32 sums):
     * the loss is fp32-accurate in both precisions. In bf16 the gradient
     * products read dlogits rounded to bf16: TOL_BF16_OUT. */
    double gtol = bf ? TOL_BF16_OUT : TOL_F32;
    expect_close(loss, rloss, N, TOL_F32, "lm_head row losses");
    cr_expect(fabs(sum - (start + rsum)) <= TOL_F32 * rsum, "loss sum %.9g vs %.9g", sum,
              start + rsum);
    expect_close(gdh, rdh, N * C, gtol, "lm_head dhidden +=");
    expect_close(gdw, rdw, V * C, gtol, "lm_head dw +=");

    /* Deterministic: the same call again from the same state, same bits. */
    float *gdh2 = malloc(N * C * 4), *gdw2 = malloc(V * C * 4);
    CUDA_CHECK(cudaMemcpy(d_dh, dh0, N * C * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0, V * C * 4, cudaMemcpyHostToDevice));
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, true, d_dw, scratch, d_hid, d_w, d_t,
                         N, C, V, R, dscale, 0.0f);
    download(gdh2, d_dh, N * C * 4);
    download(gdw2, d_dw, V * C * 4);
    cr_assert(memcmp(gdh, gdh2, N * C * 4) == 0, "lm_head dhidden not deterministic");
    cr_assert(memcmp(gdw, gdw2, V * C * 4) == 0, "lm_head dw not deterministic");

    /* "=" mode overwrites a poisoned dhidden; no dw */
    double *rdh2 = calloc(N * C, 8);
    ref_matmul_bwd(rdh2, NULL, dlf, hid_r, w_r, N, C, V);
    dpoison(d_dh, N * C * 4);
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, false, NULL, scratch, d_hid, d_w, d_t,
                         N, C, V, R, dscale, 0.0f);
    download(gdh, d_dh, N * C * 4);
    expect_close(gdh, rdh2, N * C, gtol, "lm_head dhidden =");
    if (bf) free(hid_r), free(w_r);
    free(hid), free(w), free(dh0), free(dw0), free(logits), free(dl), free(dlf), free(rdh);
    free(rdw), free(rdh2), free(gdh), free(gdw), free(gdh2), free(gdw2);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, lm_head_loss_fp32) { check_lm_head(MT_PREC_FP32); }
Test(cuda_ops, lm_head_loss_bf16) { check_lm_head(MT_PREC_BF16); }
