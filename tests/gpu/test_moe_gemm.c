/* Tests of the grouped expert products (kernels/moe/moe_gemm.h) against a
 * double-precision reference computed expert by expert here, in both
 * precisions, on the tensor-core path (both kernels on a Hopper GPU: the
 * wgmma one the products take, and the mma.sync one of other GPUs) and on
 * the plain path.
 *
 * Every case routes uneven segments: experts with no rows, a segment
 * smaller than a tile, segments that are not multiples of the tile, and
 * rows past start[E] (R > start[E]). Those rows of x and dy, the padding
 * between experts' weights and the inputs past R are NaN, so reading them
 * poisons a result; the rows of y and dx past start[E], the padding between
 * experts' gradients, a guard past every output and the gradients of
 * experts with no rows must keep their bytes. Each product runs twice from
 * the same state and must give the same bits. Without a GPU every test
 * reports itself skipped.
 *
 * Tolerances (relative error in the 2-norm), as in test_cuda_ops.c:
 *  - fp32 outputs, both precisions: 1e-5 (TOL_F32). The bf16 reference is
 *    fed the same bf16-rounded operands, so every product is exact in fp32
 *    and only the fp32 sums differ from the double ones: at most 392
 *    terms here (~1e-6 in the worst case, ~1e-7 typical).
 *  - bf16 outputs: one rounding to 8 significant bits, 2^-9 per element:
 *    4e-3 (TOL_BF16_OUT). */
#include <cuda_runtime.h>
#include <string.h>

#include "cuda_ops_util.h"
#include "gpu_train.h"
#include "kernels/moe/moe_gemm.h"
#include "megatrain.h"

#define GUARD 64 /* elements after each output that nothing may write */

typedef struct {
    int E;
    const int *counts; /* rows of each expert, in order */
    size_t R;          /* grouped rows, >= the sum of counts */
    size_t IC, OC;
    int misalign;      /* operands one element past 16-byte alignment */
} moe_case;

/* Host and device state of one case. */
typedef struct {
    moe_case c;
    mt_precision prec;
    int32_t *start; /* (E+1) */
    size_t S;       /* start[E] */
    size_t w_stride, dw_stride;
    float *x, *w, *dy;     /* what the reference reads (bf16-rounded in bf16) */
    void *d_x, *d_w, *d_dy; /* the device operands */
    int32_t *d_start;
    void *d_scratch;
} moe_state;

static size_t esize(mt_precision p) { return p == MT_PREC_BF16 ? 2 : 4; }

/* Operand n elements (+ 8 of room for the misaligned case), host values v
 * already rounded for bf16, uploaded at element offset misalign. */
static void *upload_operand(dev_pool *pool, const float *v, size_t n, mt_precision p,
                            int misalign) {
    const size_t es = esize(p);
    char *d = dalloc(pool, (n + 8) * es);
    if (p == MT_PREC_BF16) {
        uint16_t *b = to_bf16(v, n);
        CUDA_CHECK(cudaMemcpy(d + misalign * es, b, n * es, cudaMemcpyHostToDevice));
        free(b);
    } else {
        CUDA_CHECK(cudaMemcpy(d + misalign * es, v, n * es, cudaMemcpyHostToDevice));
    }
    return d + misalign * es;
}

/* Random operands in [-1, 1); rows past start[E] and the padding between
 * experts' weights NaN. */
static void state_init(moe_state *s, dev_pool *pool, const moe_case *c, mt_precision prec) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    s->prec = prec;
    s->start = malloc((c->E + 1) * sizeof *s->start);
    s->start[0] = 0;
    for (int e = 0; e < c->E; e++) s->start[e + 1] = s->start[e] + c->counts[e];
    s->S = (size_t)s->start[c->E];
    cr_assert(s->S <= c->R);
    s->w_stride = c->OC * c->IC + 8; /* keeps 16-byte alignment of every expert */
    s->dw_stride = c->OC * c->IC + 4;
    s->x = hrand(c->R * c->IC, 21, -1, 1);
    s->dy = hrand(c->R * c->OC, 22, -1, 1);
    s->w = hrand(c->E * s->w_stride, 23, -1, 1);
    for (size_t i = s->S * c->IC; i < c->R * c->IC; i++) s->x[i] = NAN;
    for (size_t i = s->S * c->OC; i < c->R * c->OC; i++) s->dy[i] = NAN;
    for (int e = 0; e < c->E; e++)
        for (size_t i = c->OC * c->IC; i < s->w_stride; i++) s->w[e * s->w_stride + i] = NAN;
    if (prec == MT_PREC_BF16) {
        float *r;
        r = rounded(s->x, c->R * c->IC), free(s->x), s->x = r;
        r = rounded(s->dy, c->R * c->OC), free(s->dy), s->dy = r;
        r = rounded(s->w, c->E * s->w_stride), free(s->w), s->w = r;
    }
    s->d_x = upload_operand(pool, s->x, c->R * c->IC, prec, c->misalign);
    s->d_dy = upload_operand(pool, s->dy, c->R * c->OC, prec, c->misalign);
    s->d_w = upload_operand(pool, s->w, c->E * s->w_stride, prec, c->misalign);
    s->d_start = dupload(pool, s->start, (c->E + 1) * sizeof *s->start);
    s->d_scratch = dalloc(pool, mt_cuda_moe_gemm_scratch_bytes(c->E));
}

static void state_free(moe_state *s) {
    free(s->start), free(s->x), free(s->w), free(s->dy);
}

/* ---- the reference, expert by expert (double) ---- */

/* y (S, OC) = x_e @ W_e^T */
static double *ref_forward(const moe_state *s) {
    const size_t IC = s->c.IC, OC = s->c.OC;
    double *y = calloc(s->S * OC + 1, sizeof *y);
    for (int e = 0; e < s->c.E; e++) {
        const float *we = s->w + e * s->w_stride;
        for (size_t r = s->start[e]; r < (size_t)s->start[e + 1]; r++)
            for (size_t o = 0; o < OC; o++) {
                double acc = 0;
                for (size_t i = 0; i < IC; i++) acc += (double)s->x[r * IC + i] * we[o * IC + i];
                y[r * OC + o] = acc;
            }
    }
    return y;
}

/* dx (S, IC) += dy_e @ W_e */
static void ref_dinp(const moe_state *s, double *dx) {
    const size_t IC = s->c.IC, OC = s->c.OC;
    for (int e = 0; e < s->c.E; e++) {
        const float *we = s->w + e * s->w_stride;
        for (size_t r = s->start[e]; r < (size_t)s->start[e + 1]; r++)
            for (size_t o = 0; o < OC; o++) {
                const double d = s->dy[r * OC + o];
                for (size_t i = 0; i < IC; i++) dx[r * IC + i] += d * we[o * IC + i];
            }
    }
}

/* dW_e (OC, IC) += dy_e^T @ x_e, at e * OC * IC (compact) */
static void ref_dw(const moe_state *s, double *dw) {
    const size_t IC = s->c.IC, OC = s->c.OC;
    for (int e = 0; e < s->c.E; e++) {
        double *g = dw + e * OC * IC;
        for (size_t r = s->start[e]; r < (size_t)s->start[e + 1]; r++)
            for (size_t o = 0; o < OC; o++) {
                const double d = s->dy[r * OC + o];
                for (size_t i = 0; i < IC; i++) g[o * IC + i] += d * s->x[r * IC + i];
            }
    }
}

/* ---- checks ---- */

/* Bytes [from, to) of a downloaded buffer still all-ones (the poison). */
static void expect_untouched(const void *h, size_t from, size_t to, const char *what) {
    const unsigned char *b = h;
    for (size_t i = from; i < to; i++)
        if (b[i] != 0xff) {
            cr_expect(0, "%s: byte %zu was written", what, i);
            return;
        }
}

/* Runs `run` twice from the state init puts in d (n bytes): the two
 * results must be the same bits. Returns the first result (malloc'd). */
typedef void (*run_fn)(const moe_state *s, mt_cuda_ctx *ctx, void *d, int variant);
static void *run_twice(const moe_state *s, mt_cuda_ctx *ctx, void *d, const void *init,
                       size_t n, run_fn run, int variant, const char *what) {
    void *a = malloc(n), *b = malloc(n);
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMemcpy(d, init, n, cudaMemcpyHostToDevice));
        run(s, ctx, d, variant);
        download(k ? b : a, d, n);
    }
    cr_expect(memcmp(a, b, n) == 0, "%s: two runs differ", what);
    free(b);
    return a;
}

static void run_forward(const moe_state *s, mt_cuda_ctx *ctx, void *d, int bf16_out) {
    mt_cuda_moe_gemm_forward(ctx, s->prec, d, bf16_out ? MT_DT_BF16 : MT_DT_F32, s->d_x,
                             s->d_w, s->w_stride, s->d_start, s->c.E, s->c.R, s->c.IC,
                             s->c.OC, s->d_scratch);
}

static void run_dinp(const moe_state *s, mt_cuda_ctx *ctx, void *d, int accumulate) {
    mt_cuda_moe_gemm_dinp(ctx, s->prec, d, accumulate, s->d_dy, s->d_w, s->w_stride,
                          s->d_start, s->c.E, s->c.R, s->c.IC, s->c.OC, s->d_scratch);
}

static void run_dw(const moe_state *s, mt_cuda_ctx *ctx, void *d, int unused) {
    mt_cuda_moe_gemm_dw(ctx, s->prec, d, s->dw_stride, s->d_dy, s->d_x, s->d_start, s->c.E,
                        s->c.R, s->c.IC, s->c.OC, s->d_scratch);
}

static void check_forward(const moe_state *s, mt_cuda_ctx *ctx, dev_pool *pool, int bf16_out) {
    const size_t n = s->c.R * s->c.OC + GUARD, es = bf16_out ? 2 : 4;
    void *d = dalloc(pool, n * es), *init = malloc(n * es);
    memset(init, 0xff, n * es);
    void *got = run_twice(s, ctx, d, init, n * es, run_forward, bf16_out, "forward");
    double *ref = ref_forward(s);
    const size_t m = s->S * s->c.OC;
    float *gf = bf16_out ? bf16_to_f32_host(got, m) : got;
    expect_close(gf, ref, m, bf16_out ? TOL_BF16_OUT : TOL_F32,
                 bf16_out ? "forward (bf16 out)" : "forward (fp32 out)");
    expect_untouched(got, m * es, n * es, "forward: rows past start[E] and the guard");
    if (bf16_out) free(gf);
    free(ref), free(got), free(init);
}

static void check_dinp(const moe_state *s, mt_cuda_ctx *ctx, dev_pool *pool, int accumulate) {
    const size_t IC = s->c.IC, n = s->c.R * IC + GUARD, m = s->S * IC;
    float *d = dalloc(pool, n * 4), *init = malloc(n * 4);
    float *dx0 = hrand(m, 24, -1, 1);
    memset(init, 0xff, n * 4);
    if (accumulate) memcpy(init, dx0, m * 4);
    float *got = run_twice(s, ctx, d, init, n * 4, run_dinp, accumulate, "dinp");
    double *ref = accumulate ? dcopy(dx0, m) : calloc(m + 1, sizeof *ref);
    ref_dinp(s, ref);
    expect_close(got, ref, m, TOL_F32, accumulate ? "dinp +=" : "dinp =");
    expect_untouched(got, m * 4, n * 4, "dinp: rows past start[E] and the guard");
    free(dx0), free(ref), free(got), free(init);
}

static void check_dw(const moe_state *s, mt_cuda_ctx *ctx, dev_pool *pool) {
    const size_t E = s->c.E, W = s->c.OC * s->c.IC, n = E * s->dw_stride + GUARD;
    float *d = dalloc(pool, n * 4), *init = malloc(n * 4);
    float *dw0 = hrand(E * W, 25, -1, 1);
    memset(init, 0xff, n * 4);
    for (size_t e = 0; e < E; e++) memcpy(init + e * s->dw_stride, dw0 + e * W, W * 4);
    float *got = run_twice(s, ctx, d, init, n * 4, run_dw, 0, "dw");
    double *ref = dcopy(dw0, E * W);
    ref_dw(s, ref);
    float *compact = malloc(E * W * 4);
    for (size_t e = 0; e < E; e++) {
        memcpy(compact + e * W, got + e * s->dw_stride, W * 4);
        expect_untouched(got + e * s->dw_stride + W, 0, (s->dw_stride - W) * 4,
                         "dw: padding between experts");
        if (s->start[e] == s->start[e + 1])
            cr_expect(memcmp(got + e * s->dw_stride, init + e * s->dw_stride, W * 4) == 0,
                      "dw: expert %zu has no rows but its gradient changed", e);
    }
    expect_close(compact, ref, E * W, TOL_F32, "dw +=");
    expect_untouched(got + E * s->dw_stride, 0, GUARD * 4, "dw: the guard");
    free(dw0), free(ref), free(compact), free(got), free(init);
}

/* Every product of case c in precision p; tensor_cores: whether the sizes
 * are meant for the tensor-core path (checked against the API; the
 * misaligned case has such sizes, its pointers send it to the plain path). */
static void check_case(const moe_case *c, mt_precision p, int tensor_cores) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    if (p == MT_PREC_BF16)
        cr_assert_eq(mt_cuda_moe_gemm_tensor_cores(p, c->IC, c->OC), (bool)tensor_cores,
                     "IC %zu OC %zu: unexpected path", c->IC, c->OC);
    moe_state s;
    state_init(&s, &pool, c, p);
    check_forward(&s, ctx, &pool, 0);
    if (p == MT_PREC_BF16) check_forward(&s, ctx, &pool, 1);
    check_dinp(&s, ctx, &pool, 0);
    check_dinp(&s, ctx, &pool, 1);
    check_dw(&s, ctx, &pool);
    state_free(&s);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- the cases ---- */

/* Tensor-core tiles are 128 rows x 256 columns, k by 32: experts with no
 * rows, 5 and 37 rows (less than a tile), 200 and 301 (tiles plus a
 * part); IC = 328 ends k in a part-step, OC = 264 a part column tile (and
 * dw's OC, as rows of its output, a part row tile). */
static const int uneven_counts[6] = {0, 37, 200, 0, 5, 301};
static const moe_case uneven = {6, uneven_counts, 600, 328, 264, 0};
/* The same, one element off 16-byte alignment: the plain path. */
static const moe_case misaligned = {6, uneven_counts, 600, 328, 264, 1};
/* Sizes like the tiny test models' (not multiples of 8): the plain path. */
static const int small_counts[5] = {3, 0, 70, 129, 64};
static const moe_case small_dims = {5, small_counts, 300, 20, 36, 0};

Test(moe_gemm, fp32_uneven_segments) { check_case(&uneven, MT_PREC_FP32, 0); }
Test(moe_gemm, fp32_small_dims) { check_case(&small_dims, MT_PREC_FP32, 0); }
Test(moe_gemm, bf16_tensor_cores_uneven_segments) { check_case(&uneven, MT_PREC_BF16, 1); }
Test(moe_gemm, bf16_plain_misaligned) { check_case(&misaligned, MT_PREC_BF16, 1); }
Test(moe_gemm, bf16_plain_small_dims) { check_case(&small_dims, MT_PREC_BF16, 0); }

/* More tiles than an H100 or H200 has SMs (132), so that blocks of the
 * tensor-core kernel's persistent grid take several tiles each and its
 * loads run ahead across tile boundaries: 96 experts of 0..60 rows (every
 * seventh empty; 81 with rows, 2624 rows), 2 column tiles: 162 tiles for
 * forward and dinp, 81 x 4 x 2 = 648 for dw. */
Test(moe_gemm, bf16_tensor_cores_many_tiles) {
    int counts[96];
    unsigned h = 12345;
    for (int e = 0; e < 96; e++) {
        h = h * 1103515245u + 12345u;
        counts[e] = e % 7 == 3 ? 0 : (int)((h >> 16) % 61);
    }
    const moe_case many = {96, counts, 3000, 392, 392, 0};
    int sum = 0;
    for (int e = 0; e < 96; e++) sum += counts[e];
    cr_assert_eq(sum, 2624); /* the tile counts above */
    check_case(&many, MT_PREC_BF16, 1);
}

/* The same cases through the mma.sync kernel, which a Hopper GPU does not
 * otherwise take (elsewhere these repeat the tests above). */
Test(moe_gemm, bf16_mma_sync_uneven_segments) {
    mt_cuda_moe_gemm_use(MT_CUDA_MOE_KERNEL_MMA);
    cr_assert_str_eq(mt_cuda_moe_gemm_kernel_name(), "mma.sync");
    check_case(&uneven, MT_PREC_BF16, 1);
    mt_cuda_moe_gemm_use(MT_CUDA_MOE_KERNEL_AUTO);
}

Test(moe_gemm, bf16_mma_sync_many_tiles) {
    int counts[96];
    for (int e = 0; e < 96; e++) counts[e] = (e * 37) % 61; /* 0..60 rows, some empty */
    const moe_case many = {96, counts, 3000, 392, 392, 0};
    mt_cuda_moe_gemm_use(MT_CUDA_MOE_KERNEL_MMA);
    check_case(&many, MT_PREC_BF16, 1);
    mt_cuda_moe_gemm_use(MT_CUDA_MOE_KERNEL_AUTO);
}

/* A Hopper GPU (compute capability 9.0) takes the wgmma kernel when the
 * build has sm_90a code, so that the tests above cover it; every other
 * GPU the mma.sync one. */
Test(moe_gemm, the_kernel_follows_the_device) {
    mt_test_need_gpu();
    int dev, major, minor;
    cr_assert_eq(cudaGetDevice(&dev), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                 cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                 cudaSuccess);
    const bool hopper = major == 9 && minor == 0 && strstr(mt_cuda_archs(), "sm_90a");
    cr_assert_str_eq(mt_cuda_moe_gemm_kernel_name(), hopper ? "wgmma" : "mma.sync",
                     "compute capability %d.%d, archs %s", major, minor, mt_cuda_archs());
}

/* No routed rows at all (start all 0): nothing is written. */
Test(moe_gemm, no_rows_writes_nothing) {
    static const int zero[4] = {0, 0, 0, 0};
    const moe_case none = {4, zero, 40, 64, 64, 0};
    check_case(&none, MT_PREC_BF16, 1);
}

Test(moe_gemm, scratch_holds_the_tile_offsets) {
    for (int E = 0; E < 2000; E += 37)
        cr_assert_geq(mt_cuda_moe_gemm_scratch_bytes(E), ((size_t)E + 1) * 4);
}
