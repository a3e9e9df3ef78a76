/* Tests of the fused causal GQA attention kernels (kernels/attention/attention.h)
 * against a double-precision reference that materialises the whole masked
 * score matrix of each (batch, head). Ragged T (not a multiple of any tile),
 * GQA, MHA (NH == NKV) and MQA (NKV == 1), packed documents, sliding
 * windows, both precisions, poisoned outputs, bitwise determinism and shape
 * errors; the scores' custom scale and Gemma 2's logit soft-capping (each
 * test asserting that the reference with them differs clearly from the one
 * without, so that a kernel ignoring them fails); head dim 256 in bf16. On a
 * Hopper GPU the bf16 tests run the wgmma kernels, and again the mma.sync
 * ones of other GPUs (attention_bf16_mma.*); head dim 256 runs on the
 * mma.sync kernels everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/attention/attention.h"
#include "kernels/cuda_ops.h"
#include "megatrain.h"
#include "testlib.h"

#define CK(call)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

static void skip_without_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        cr_skip("no CUDA device: attention GPU tests skipped");
}

/* N(0,1) samples (Box-Muller over a xorshift stream): real q, k, v after
 * RMSNorm and projection have entries of about this size. */
static void fill_normal(float *x, size_t n, unsigned long long seed) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        double u[2];
        for (int j = 0; j < 2; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            u[j] = ((s >> 11) + 0.5) / 9007199254740992.0;
        }
        x[i] = (float)(sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]));
    }
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); // round to nearest even
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct shape { size_t B, T, NH, NKV, HD; } shape;

/* How a test forms its scores: the kernels' mt_attn_scores, and a factor on
 * q (N(0,1) entries give scores of about N(0,1); a factor makes a large
 * cap bite). NULL everywhere: the defaults, factor 1. */
typedef struct scores_case {
    mt_attn_scores sc;
    float qmul;
} scores_case;

/* The score of a dot product d: d * scale, soft-capped to cap tanh(d scale
 * / cap) when cap > 0; *g: d score / d(d scale), 1 - tanh^2 or 1. */
static double ref_score(double d, double scale, double cap, double *g) {
    if (cap <= 0) {
        *g = 1;
        return d * scale;
    }
    const double t = tanh(d * scale / cap);
    *g = 1 - t * t;
    return cap * t;
}

/* Double-precision reference: out, lse, dq, dk, dv (all overwritten).
 * pos (B,T) or NULL: with positions, query t sees keys t - pos[t] .. t.
 * cs: the scores' scale and soft-cap, or NULL (1/sqrt(HD), none). */
static void ref_attention(const shape *s, const int32_t *pos, const scores_case *cs,
                          const float *q, const float *k, const float *v, const float *dout,
                          double *out, double *lse, double *dq, double *dk, double *dv) {
    const size_t B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, HD = s->HD;
    const double scale = cs && cs->sc.scale > 0 ? cs->sc.scale : 1.0 / sqrt((double)HD);
    const double cap = cs ? cs->sc.softcap : 0;
    double *P = malloc(T * T * sizeof *P), *dP = malloc(T * T * sizeof *dP);
    double *G = malloc(T * T * sizeof *G); // d score / d(q.k scale)
    memset(dk, 0, B * T * NKV * HD * sizeof *dk);
    memset(dv, 0, B * T * NKV * HD * sizeof *dv);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < NH; h++) {
            size_t kh = h / (NH / NKV);
#define Q(t) (q + ((b * T + (t)) * NH + h) * HD)
#define DO(t) (dout + ((b * T + (t)) * NH + h) * HD)
#define KV(x, t) (x + ((b * T + (t)) * NKV + kh) * HD)
            for (size_t t = 0; t < T; t++) {
                double m = -INFINITY, l = 0;
                const size_t u0 = pos ? t - (size_t)pos[b * T + t] : 0; // first key seen
                for (size_t u = u0; u <= t; u++) {
                    double d = 0;
                    for (size_t i = 0; i < HD; i++) d += (double)Q(t)[i] * KV(k, u)[i];
                    P[t * T + u] = ref_score(d, scale, cap, &G[t * T + u]);
                    if (P[t * T + u] > m) m = P[t * T + u];
                }
                for (size_t u = u0; u <= t; u++) l += exp(P[t * T + u] - m);
                lse[(b * NH + h) * T + t] = m + log(l);
                double *o = out + ((b * T + t) * NH + h) * HD;
                for (size_t i = 0; i < HD; i++) o[i] = 0;
                for (size_t u = u0; u <= t; u++) {
                    P[t * T + u] = exp(P[t * T + u] - m) / l;
                    for (size_t i = 0; i < HD; i++) o[i] += P[t * T + u] * KV(v, u)[i];
                }
                double D = 0;
                for (size_t i = 0; i < HD; i++) D += (double)DO(t)[i] * o[i];
                double *g = dq + ((b * T + t) * NH + h) * HD;
                for (size_t i = 0; i < HD; i++) g[i] = 0;
                for (size_t u = u0; u <= t; u++) {
                    double dp = 0;
                    for (size_t i = 0; i < HD; i++) dp += (double)DO(t)[i] * KV(v, u)[i];
                    double ds = P[t * T + u] * (dp - D) * G[t * T + u];
                    dP[t * T + u] = ds;
                    double *gk = dk + ((b * T + u) * NKV + kh) * HD;
                    double *gv = dv + ((b * T + u) * NKV + kh) * HD;
                    for (size_t i = 0; i < HD; i++) {
                        g[i] += scale * ds * KV(k, u)[i];
                        gk[i] += scale * ds * Q(t)[i];
                        gv[i] += P[t * T + u] * DO(t)[i];
                    }
                }
            }
#undef Q
#undef DO
#undef KV
        }
    free(P);
    free(dP);
    free(G);
}

/* ||a - b|| / ||b|| of two references. */
static double rel_diff(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* ||got - ref|| / ||ref||, infinite when got holds a NaN (an unwritten,
 * poisoned element). */
static double rel_err_d(const float *got, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

typedef struct run_result {
    float *out, *lse, *dq, *dk, *dv; // host copies
} run_result;

static void free_result(run_result *r) {
    free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv);
}

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* A device buffer filled with 0xFF bytes: NaN in fp32 and in bf16. */
static void *dev_poison(size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 0xFF, bytes));
    return d;
}
static float *host_copy(const void *d, size_t bytes) {
    float *h = malloc(bytes);
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* Runs forward + backward on the GPU, with positions pos (B,T) on the host
 * or NULL, and the scores of cs (NULL: the defaults; its qmul is the
 * caller's to apply). bf16 mode rounds q, k, v, dout to bf16 in place first
 * (so the reference sees exactly the kernel's inputs) and returns out as
 * read back through the fp32 copy. */
static run_result run_gpu(const shape *s, const int32_t *pos, const scores_case *cs, int bf16,
                          float *q, float *k, float *v, float *dout) {
    const mt_attn_scores *sc = cs ? &cs->sc : NULL;
    const size_t nq = s->B * s->T * s->NH * s->HD, nk = s->B * s->T * s->NKV * s->HD;
    const size_t nl = s->B * s->NH * s->T;
    mt_error err = {{0}};
    run_result r;
    void *dq_ = dev_poison(nq * 4), *dk_ = dev_poison(nk * 4), *dv_ = dev_poison(nk * 4);
    void *lse = dev_poison(nl * 4), *out32 = dev_poison(nq * 4);
    void *scratch = dev_poison(mt_attn_backward_scratch_bytes(s->B, s->T, s->NH));
    int32_t *dpos = pos ? dev_copy(pos, s->B * s->T * sizeof *pos) : NULL;
    void *iq, *ik, *iv, *ido, *out;
    if (bf16) {
        uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hv = malloc(nk * 2),
                 *hdo = malloc(nq * 2);
        for (size_t i = 0; i < nq; i++) {
            hq[i] = to_bf16(q[i]); q[i] = from_bf16(hq[i]);
            hdo[i] = to_bf16(dout[i]); dout[i] = from_bf16(hdo[i]);
        }
        for (size_t i = 0; i < nk; i++) {
            hk[i] = to_bf16(k[i]); k[i] = from_bf16(hk[i]);
            hv[i] = to_bf16(v[i]); v[i] = from_bf16(hv[i]);
        }
        iq = dev_copy(hq, nq * 2); ik = dev_copy(hk, nk * 2); iv = dev_copy(hv, nk * 2);
        ido = dev_copy(hdo, nq * 2);
        free(hq); free(hk); free(hv); free(hdo);
        out = dev_poison(nq * 2);
        int rc = mt_attn_forward_bf16(out, out32, lse, iq, ik, iv, dpos, sc, s->B, s->T, s->NH,
                                      s->NKV, s->HD, 0, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        rc = mt_attn_backward_bf16(dq_, dk_, dv_, scratch, ido, iq, ik, iv, out, lse, dpos, sc,
                                   s->B, s->T, s->NH, s->NKV, s->HD, 0, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        // The bf16 output must be the fp32 one rounded, every element written.
        uint16_t *ob = malloc(nq * 2);
        float *of = host_copy(out32, nq * 4);
        CK(cudaMemcpy(ob, out, nq * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nq; i++)
            cr_assert_eq(ob[i], to_bf16(of[i]), "bf16 out[%zu] is not fp32 out rounded", i);
        free(ob); free(of);
    } else {
        iq = dev_copy(q, nq * 4); ik = dev_copy(k, nk * 4); iv = dev_copy(v, nk * 4);
        ido = dev_copy(dout, nq * 4);
        out = out32;
        int rc = mt_attn_forward_f32(out32, lse, iq, ik, iv, dpos, sc, s->B, s->T, s->NH, s->NKV,
                                     s->HD, 0, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        rc = mt_attn_backward_f32(dq_, dk_, dv_, scratch, ido, iq, ik, iv, out32, lse, dpos, sc,
                                  s->B, s->T, s->NH, s->NKV, s->HD, 0, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
    }
    CK(cudaDeviceSynchronize());
    r.out = host_copy(out32, nq * 4);
    r.lse = host_copy(lse, nl * 4);
    r.dq = host_copy(dq_, nq * 4);
    r.dk = host_copy(dk_, nk * 4);
    r.dv = host_copy(dv_, nk * 4);
    if (out != out32) CK(cudaFree(out));
    if (dpos) CK(cudaFree(dpos));
    void *bufs[] = {dq_, dk_, dv_, lse, out32, scratch, iq, ik, iv, ido};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CK(cudaFree(bufs[i]));
    return r;
}

/* With scores cs, the reference must differ from the plain one (default
 * scale, no cap) by SCORES_MARGIN times the kernels' tolerance in out, dq
 * and dk, so that a kernel that ignored cs would fail its checks by that
 * much. (The tests' caps and scales give 0.05 to 0.5, numpy on like
 * inputs; lse moves less and is left out.) */
#define SCORES_MARGIN 3.0
static void check_scores_bite(const shape *s, const int32_t *pos, const scores_case *cs,
                              const float *q, const float *k, const float *v, const float *dout,
                              const double *out, const double *dq, const double *dk,
                              double tol_fwd, double tol_bwd) {
    const size_t nq = s->B * s->T * s->NH * s->HD, nk = s->B * s->T * s->NKV * s->HD;
    double *o0 = malloc(nq * 8), *l0 = malloc(s->B * s->NH * s->T * 8), *dq0 = malloc(nq * 8),
           *dk0 = malloc(nk * 8), *dv0 = malloc(nk * 8);
    ref_attention(s, pos, NULL, q, k, v, dout, o0, l0, dq0, dk0, dv0);
    const double d_out = rel_diff(out, o0, nq), d_dq = rel_diff(dq, dq0, nq),
                 d_dk = rel_diff(dk, dk0, nk);
    cr_log_info("scale %g cap %g: the reference moves out %.3g, dq %.3g, dk %.3g",
                cs->sc.scale, cs->sc.softcap, d_out, d_dq, d_dk);
    cr_assert(d_out >= SCORES_MARGIN * tol_fwd && d_dq >= SCORES_MARGIN * tol_bwd &&
                  d_dk >= SCORES_MARGIN * tol_bwd,
              "scale %g cap %g barely move the reference (out %.3g, dq %.3g, dk %.3g): the "
              "test could pass with them ignored", cs->sc.scale, cs->sc.softcap, d_out, d_dq,
              d_dk);
    free(o0); free(l0); free(dq0); free(dk0); free(dv0);
}

/* Checks one shape in one precision, with positions pos (B,T) or NULL and
 * scores cs (or NULL); tol_fwd bounds out and lse, tol_bwd the gradients
 * (relative L2 errors). */
static void check_case(shape s, const int32_t *pos, const scores_case *cs, int bf16,
                       double tol_fwd, double tol_bwd) {
    skip_without_gpu();
    const size_t nq = s.B * s.T * s.NH * s.HD, nk = s.B * s.T * s.NKV * s.HD;
    const size_t nl = s.B * s.NH * s.T;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    fill_normal(q, nq, 1 + s.HD);
    fill_normal(k, nk, 2 + s.NKV);
    fill_normal(v, nk, 3 + s.T);
    fill_normal(dout, nq, 4 + s.NH);
    if (cs && cs->qmul != 0)
        for (size_t i = 0; i < nq; i++) q[i] *= cs->qmul;
    run_result r = run_gpu(&s, pos, cs, bf16, q, k, v, dout);
    double *out = malloc(nq * 8), *lse = malloc(nl * 8), *dq = malloc(nq * 8),
           *dk = malloc(nk * 8), *dv = malloc(nk * 8);
    ref_attention(&s, pos, cs, q, k, v, dout, out, lse, dq, dk, dv);
    if (cs) check_scores_bite(&s, pos, cs, q, k, v, dout, out, dq, dk, tol_fwd, tol_bwd);
    char mode[96];
    snprintf(mode, sizeof mode, "%s%s%s (scale %g cap %g)", bf16 ? "bf16" : "fp32",
             bf16 ? (strcmp(mt_attn_kernel_name(), "wgmma") ? " mma.sync" : " wgmma") : "",
             pos ? " packed" : "", cs ? cs->sc.scale : 0.0, cs ? cs->sc.softcap : 0.0);
    double e;
#define CHECK(name, got, ref, n, tol)                                                     \
    e = rel_err_d(got, ref, n);                                                           \
    cr_log_info("%s %s: rel err %.3g (T=%zu NH=%zu NKV=%zu HD=%zu)", mode, name, e, s.T,  \
                s.NH, s.NKV, s.HD);                                                       \
    cr_expect(e <= tol, "%s %s: rel err %.3g > %.3g (B=%zu T=%zu NH=%zu NKV=%zu HD=%zu)", \
              mode, name, e, tol, s.B, s.T, s.NH, s.NKV, s.HD)
    CHECK("out", r.out, out, nq, tol_fwd);
    CHECK("lse", r.lse, lse, nl, tol_fwd);
    CHECK("dq", r.dq, dq, nq, tol_bwd);
    CHECK("dk", r.dk, dk, nk, tol_bwd);
    CHECK("dv", r.dv, dv, nk, tol_bwd);
#undef CHECK
    free_result(&r);
    free(q); free(k); free(v); free(dout);
    free(out); free(lse); free(dq); free(dk); free(dv);
}

static void check_packed(shape s, const int32_t *pos, int bf16, double tol_fwd,
                         double tol_bwd) {
    check_case(s, pos, NULL, bf16, tol_fwd, tol_bwd);
}

static void check_shape(shape s, int bf16, double tol_fwd, double tol_bwd) {
    check_packed(s, NULL, bf16, tol_fwd, tol_bwd);
}

/* Positions (B,T) of rows packed with documents whose lengths cycle through
 * DOC_LENS, row b starting at its b-th entry; the last row is one document
 * when B > 1 (mixed rows in one launch). The lengths give one-token
 * documents, documents ending inside and exactly at 64- and 128-row tiles,
 * and documents spanning several tiles. malloc'd. */
static const int DOC_LENS[] = {1, 7, 56, 130, 3, 45, 200, 2, 90, 17, 64};
static int32_t *packed_pos(size_t B, size_t T) {
    int32_t *pos = malloc(B * T * sizeof *pos);
    const size_t n = sizeof DOC_LENS / sizeof *DOC_LENS;
    for (size_t b = 0; b < B; b++) {
        size_t k = b, t = 0;
        while (t < T) {
            const size_t len = B > 1 && b == B - 1 ? T : (size_t)DOC_LENS[k++ % n];
            for (size_t i = 0; i < len && t < T; i++, t++) pos[b * T + t] = (int32_t)i;
        }
    }
    return pos;
}

/* bf16 tolerances. The inputs are exactly bf16 (the reference sees the same
 * values), so the error comes from rounding P (forward and backward) and dS
 * to bf16 before their tensor-core products: each rounding is at most 2^-9
 * = 2e-3 relative, independent across elements, so the L2 error lands at a
 * few 1e-3. out/lse: 1e-2. Gradients add the bf16-rounded `out` inside
 * D = rowsum(dout*out) and the cancellation in dP - D: 2e-2. */
#define BF16_TOL_FWD 1e-2
#define BF16_TOL_BWD 2e-2
/* fp32 tolerances: sums of <= 300 products of O(1) terms in fp32 (unit
 * roundoff 6e-8, error growing ~sqrt(n)) and expf's few-ulp error give
 * ~1e-6; 1e-5 leaves room for the cancellation in dP - D. */
#define F32_TOL 1e-5

Test(attention_bf16, gqa_hd64_ragged) { check_shape((shape){2, 67, 4, 2, 64}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }
Test(attention_bf16, gqa_hd128_ragged) { check_shape((shape){2, 67, 4, 2, 128}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }
Test(attention_bf16, mha_hd128) { check_shape((shape){2, 67, 4, 4, 128}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }
Test(attention_bf16, mqa_hd64) { check_shape((shape){2, 67, 4, 1, 64}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }
/* Several query and key tiles, a ragged last tile, GQA ratio 8. */
Test(attention_bf16, gqa8_hd128_multi_tile) { check_shape((shape){1, 300, 8, 1, 128}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }
Test(attention_bf16, gqa4_hd64_multi_tile) { check_shape((shape){2, 193, 8, 2, 64}, 1, BF16_TOL_FWD, BF16_TOL_BWD); }

Test(attention_f32, gqa_hd64_ragged) { check_shape((shape){2, 67, 4, 2, 64}, 0, F32_TOL, F32_TOL); }
Test(attention_f32, gqa_hd128_ragged) { check_shape((shape){2, 67, 4, 2, 128}, 0, F32_TOL, F32_TOL); }
Test(attention_f32, mha_hd128) { check_shape((shape){2, 67, 4, 4, 128}, 0, F32_TOL, F32_TOL); }
Test(attention_f32, mqa_hd64) { check_shape((shape){2, 67, 4, 1, 64}, 0, F32_TOL, F32_TOL); }
/* Head dims that are not a multiple of the 32-lane split, and the largest. */
Test(attention_f32, hd80_and_hd256) {
    check_shape((shape){1, 45, 2, 1, 80}, 0, F32_TOL, F32_TOL);
    check_shape((shape){1, 70, 2, 2, 256}, 0, F32_TOL, F32_TOL);
}
Test(attention_f32, gqa8_multi_tile) { check_shape((shape){1, 300, 8, 1, 64}, 0, F32_TOL, F32_TOL); }

/* Packed documents: every key of another document must get no weight and
 * no gradient; tiles wholly before a row's document are skipped and the
 * rest masked. Same tolerances: each row's arithmetic is that of a shorter
 * causal sequence. */
static void check_docs_case(shape s, const scores_case *cs, int bf16) {
    int32_t *pos = packed_pos(s.B, s.T);
    if (bf16) check_case(s, pos, cs, 1, BF16_TOL_FWD, BF16_TOL_BWD);
    else check_case(s, pos, cs, 0, F32_TOL, F32_TOL);
    free(pos);
}
static void check_docs(shape s, int bf16) { check_docs_case(s, NULL, bf16); }
/* The same through the mma.sync kernels, which a Hopper GPU does not
 * otherwise take (elsewhere these repeat the tests above). */
static void with_mma(void (*check)(shape, int), shape s) {
    mt_attn_use(MT_ATTN_KERNEL_MMA);
    cr_assert_str_eq(mt_attn_kernel_name(), "mma.sync");
    check(s, 1);
    mt_attn_use(MT_ATTN_KERNEL_AUTO);
}
static void check_bf16(shape s, int bf16) { check_shape(s, bf16, BF16_TOL_FWD, BF16_TOL_BWD); }
Test(attention_bf16_mma, gqa_hd64_ragged) { with_mma(check_bf16, (shape){2, 67, 4, 2, 64}); }
Test(attention_bf16_mma, gqa8_hd128_multi_tile) { with_mma(check_bf16, (shape){1, 300, 8, 1, 128}); }
Test(attention_bf16_mma, packed_mqa_hd128) { with_mma(check_docs, (shape){2, 300, 4, 1, 128}); }

/* Sliding windows: the CUDA backend clamps the attention's positions to
 * window - 1 on the GPU (mt_cuda_window_positions), so that query t sees
 * keys from max(its document's start, t - window + 1): a first key that
 * never decreases, as the kernels' tile skipping and masking need. The
 * positions it makes, then every kernel against the reference with them,
 * one sequence a row and packed documents; windows of 37 and 130 keys
 * cross the 64- and 128-row tiles. */
static int32_t *window_pos(const int32_t *pos, size_t B, size_t T, int64_t window) {
    const size_t n = B * T;
    int32_t *d_out = dev_poison(n * 4), *d_pos = pos ? dev_copy(pos, n * 4) : NULL;
    mt_cuda_window_positions(0, d_out, d_pos, n, (int64_t)T, window);
    CK(cudaDeviceSynchronize());
    int32_t *out = (int32_t *)host_copy(d_out, n * 4);
    for (size_t i = 0; i < n; i++) {
        int32_t p = pos ? pos[i] : (int32_t)(i % T), want = p < window - 1 ? p : window - 1;
        cr_assert_eq(out[i], want, "position %zu: %d, want %d", i, out[i], want);
    }
    CK(cudaFree(d_out));
    if (d_pos) CK(cudaFree(d_pos));
    return out;
}
static void check_window_case(shape s, const scores_case *cs, int bf16) {
    skip_without_gpu();
    const int64_t windows[] = {37, 130};
    for (int w = 0; w < 2; w++)
        for (int packed = 0; packed < 2; packed++) {
            int32_t *pos = packed ? packed_pos(s.B, s.T) : NULL;
            int32_t *wp = window_pos(pos, s.B, s.T, windows[w]);
            if (bf16) check_case(s, wp, cs, 1, BF16_TOL_FWD, BF16_TOL_BWD);
            else check_case(s, wp, cs, 0, F32_TOL, F32_TOL);
            free(wp);
            free(pos);
        }
}
static void check_window(shape s, int bf16) { check_window_case(s, NULL, bf16); }
Test(attention_bf16, sliding_window) { check_window((shape){2, 300, 4, 2, 128}, 1); }
Test(attention_bf16_mma, sliding_window) { with_mma(check_window, (shape){2, 300, 4, 1, 64}); }
Test(attention_f32, sliding_window) { check_window((shape){2, 300, 4, 2, 64}, 0); }

/* Scores of other forms (attention.h's mt_attn_scores), each case checked
 * to move the reference (check_scores_bite):
 *  CAP2: Gemma 2's soft-capping with a cap of 2, which bites on N(0,1)
 *        scores (x = 2 becomes 1.52);
 *  GEMMA2: its real cap, 50, and scale (query_pre_attn_scalar 144: 144^-0.5
 *        at head dim 128), on q scaled by 16 so that the scores (std ~15)
 *        reach the cap's curve; the kernels' exp and tanh then work on
 *        arguments of tens, and the mma.sync/wgmma log2 factor is 72;
 *  SCALE144: the scale alone. */
static const scores_case CAP2 = {{0.f, 2.f}, 1.f};
static const scores_case GEMMA2 = {{0.083333333f, 50.f}, 16.f};
static const scores_case SCALE144 = {{0.083333333f, 0.f}, 1.f};
/* fp32 tolerance of GEMMA2: q scaled by 16 gives scores of up to ~40, whose
 * fp32 dot products (128 products of ~16: ~1e-5 before the scale) and
 * tanhf (2 ulp, times c = 50: ~6e-6 |t|) move P by a few 1e-6 relative;
 * the peaked rows leave out and the gradients to few keys, without the
 * averaging of F32_TOL's cases: 5e-5. (bf16 keeps its tolerances: the
 * rounding of P to bf16, 2e-3, still dominates.) */
#define F32_TOL_Q16 5e-5

/* Soft-capping on every path of a kernel family: one sequence a row
 * (ragged T, GQA, several tiles), packed documents, sliding windows
 * (plain and packed), and Gemma 2's own cap and scale. */
static void check_softcap(shape s, int bf16) {
    const double tf = bf16 ? BF16_TOL_FWD : F32_TOL, tb = bf16 ? BF16_TOL_BWD : F32_TOL;
    check_case((shape){2, 67, 4, 2, s.HD}, NULL, &CAP2, bf16, tf, tb);
    check_case(s, NULL, &CAP2, bf16, tf, tb);
    check_docs_case(s, &CAP2, bf16);
    check_window_case(s, &CAP2, bf16);
    if (s.HD == 128)
        check_case(s, NULL, &GEMMA2, bf16, bf16 ? tf : F32_TOL_Q16, bf16 ? tb : F32_TOL_Q16);
}
Test(attention_bf16, softcap_hd64) { check_softcap((shape){2, 300, 8, 2, 64}, 1); }
Test(attention_bf16, softcap_hd128) { check_softcap((shape){2, 300, 4, 1, 128}, 1); }
Test(attention_bf16_mma, softcap_hd64) { with_mma(check_softcap, (shape){2, 300, 8, 2, 64}); }
Test(attention_bf16_mma, softcap_hd128) { with_mma(check_softcap, (shape){2, 300, 4, 1, 128}); }
Test(attention_f32, softcap_hd64) { check_softcap((shape){2, 300, 8, 2, 64}, 0); }
Test(attention_f32, softcap_hd128) { check_softcap((shape){1, 300, 4, 1, 128}, 0); }

static void check_scale(shape s, int bf16) {
    if (bf16) check_case(s, NULL, &SCALE144, 1, BF16_TOL_FWD, BF16_TOL_BWD);
    else check_case(s, NULL, &SCALE144, 0, F32_TOL, F32_TOL);
}
Test(attention_bf16, custom_scale_hd128) { check_scale((shape){2, 300, 8, 2, 128}, 1); }
Test(attention_bf16_mma, custom_scale_hd128) { with_mma(check_scale, (shape){2, 300, 8, 2, 128}); }
Test(attention_f32, custom_scale_hd128) { check_scale((shape){1, 300, 4, 2, 128}, 0); }

/* Head dim 256 (every Gemma 2/3 size but 27B): Hopper's wgmma kernels of
 * its own (attention_bf16), or the mma.sync ones (attention_bf16_mma; on
 * every GPU whose blocks have their shared memory: the forward 198 KB,
 * dK/dV 199 KB, dQ 198 KB). Ragged T, GQA and MQA, several tiles of every
 * pass (forward 128 rows, dK/dV 64 keys, dQ 64 rows), packed documents,
 * soft-capping with windows, and
 * more work items than a GPU has blocks (the persistent wgmma passes'
 * blocks take several each, their buffers running on). */
static void check_hd256(shape s, int bf16) {
    skip_without_gpu();
    cr_assert(mt_attn_bf16_supports(256), "the bf16 kernels (%s) refuse head dim 256",
              mt_attn_kernel_name());
    check_case((shape){2, 67, 4, 2, 256}, NULL, NULL, bf16, BF16_TOL_FWD, BF16_TOL_BWD);
    check_case((shape){3, 1100, 8, 4, 256}, NULL, &CAP2, bf16, BF16_TOL_FWD, BF16_TOL_BWD);
    check_case(s, NULL, NULL, bf16, BF16_TOL_FWD, BF16_TOL_BWD);
    check_docs(s, bf16);
    check_case(s, NULL, &CAP2, bf16, BF16_TOL_FWD, BF16_TOL_BWD);
    check_window_case(s, &CAP2, bf16);
}
Test(attention_bf16, hd256) { check_hd256((shape){2, 300, 4, 1, 256}, 1); }
Test(attention_bf16_mma, hd256) { with_mma(check_hd256, (shape){1, 333, 8, 2, 256}); }

/* A Hopper GPU (compute capability 9.0) takes the wgmma kernels when the
 * build has sm_90a code, so that the bf16 tests above cover them; every
 * other GPU the mma.sync ones. */
Test(attention_bf16, the_kernels_follow_the_device) {
    skip_without_gpu();
    int dev, major, minor;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const int hopper = major == 9 && minor == 0 && strstr(mt_cuda_archs(), "sm_90a");
    cr_assert_str_eq(mt_attn_kernel_name(), hopper ? "wgmma" : "mma.sync",
                     "compute capability %d.%d, archs %s", major, minor, mt_cuda_archs());
}

/* Head dims 80 and 96: the wgmma kernels compute them as 128, the TMA
 * reading the columns past HD as zeros and the stores leaving them out;
 * the mma.sync kernels refuse them. Ragged tiles, GQA, several tiles and
 * packed documents, against the same reference and tolerances. */
static void check_padded_head_dims(void) {
    skip_without_gpu();
    const size_t hds[] = {80, 96};
    for (int i = 0; i < 2; i++) {
        const size_t hd = hds[i];
        if (strcmp(mt_attn_kernel_name(), "wgmma")) {
            cr_assert(!mt_attn_bf16_supports(hd), "mma.sync claims head dim %zu", hd);
            continue;
        }
        cr_assert(mt_attn_bf16_supports(hd), "wgmma refuses head dim %zu", hd);
        check_shape((shape){2, 67, 4, 2, hd}, 1, BF16_TOL_FWD, BF16_TOL_BWD);
        check_shape((shape){1, 300, 8, 1, hd}, 1, BF16_TOL_FWD, BF16_TOL_BWD);
        check_docs((shape){2, 193, 4, 4, hd}, 1);
    }
}
Test(attention_bf16, padded_head_dims_80_96) { check_padded_head_dims(); }
Test(attention_bf16_mma, padded_head_dims_are_refused) {
    mt_attn_use(MT_ATTN_KERNEL_MMA);
    check_padded_head_dims();
    mt_error err = {{0}};
    cr_assert_eq(mt_attn_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 4, 4,
                                      96, 0, &err), -1);
    cr_assert(strstr(err.msg, "head_dim 64, 128 or 256, got 96"), "message: %s", err.msg);
    mt_attn_use(MT_ATTN_KERNEL_AUTO);
}

/* More (batch row, kv head) groups than the Hopper dK/dV pass puts in
 * one chunk of its block order (an eighth of the SMs: 16 on an H200), the
 * last chunk partial; packed too. */
Test(attention_bf16, chunks_of_kv_groups) {
    check_shape((shape){3, 200, 12, 12, 64}, 1, BF16_TOL_FWD, BF16_TOL_BWD);
    check_docs((shape){3, 200, 12, 12, 128}, 1);
}

Test(attention_bf16, packed_gqa4_hd64) { check_docs((shape){3, 300, 8, 2, 64}, 1); }
Test(attention_bf16, packed_mqa_hd128) { check_docs((shape){2, 300, 4, 1, 128}, 1); }
Test(attention_bf16, packed_mha_hd128_ragged) { check_docs((shape){2, 193, 4, 4, 128}, 1); }
Test(attention_f32, packed_gqa4_hd64) { check_docs((shape){3, 300, 8, 2, 64}, 0); }
Test(attention_f32, packed_hd80_and_hd256) {
    check_docs((shape){2, 150, 2, 1, 80}, 0);
    check_docs((shape){1, 260, 2, 2, 256}, 0);
}

/* Asserts that two runs of shape s gave the same bits in every output; what
 * names the second run in the message. */
static void assert_same_bits(const run_result *a, const run_result *b, const shape *s,
                             const char *what) {
    const size_t nq = s->B * s->T * s->NH * s->HD, nk = s->B * s->T * s->NKV * s->HD;
    const size_t nl = s->B * s->NH * s->T;
    cr_assert(!memcmp(a->out, b->out, nq * 4), "out differs %s", what);
    cr_assert(!memcmp(a->lse, b->lse, nl * 4), "lse differs %s", what);
    cr_assert(!memcmp(a->dq, b->dq, nq * 4), "dq differs %s", what);
    cr_assert(!memcmp(a->dk, b->dk, nk * 4), "dk differs %s", what);
    cr_assert(!memcmp(a->dv, b->dv, nk * 4), "dv differs %s", what);
}

/* Random inputs of shape s (seeds seed .. seed + 3), malloc'd. */
static void random_inputs(const shape *s, unsigned long long seed, float **q, float **k,
                          float **v, float **dout) {
    const size_t nq = s->B * s->T * s->NH * s->HD, nk = s->B * s->T * s->NKV * s->HD;
    *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    fill_normal(*q, nq, seed);
    fill_normal(*k, nk, seed + 1);
    fill_normal(*v, nk, seed + 2);
    fill_normal(*dout, nq, seed + 3);
}

/* Positions 0..T-1 in every row (one document per row) run the packed
 * kernels on the unpacked problem: the same bits as no positions. */
static void check_one_document_per_row(int bf16) {
    skip_without_gpu();
    shape s = {2, 333, 8, 2, bf16 ? 128 : 64};
    float *q, *k, *v, *dout;
    random_inputs(&s, 21, &q, &k, &v, &dout);
    int32_t *pos = malloc(s.B * s.T * sizeof *pos);
    for (size_t i = 0; i < s.B * s.T; i++) pos[i] = (int32_t)(i % s.T);
    run_result a = run_gpu(&s, NULL, NULL, bf16, q, k, v, dout);
    run_result b = run_gpu(&s, pos, NULL, bf16, q, k, v, dout);
    assert_same_bits(&a, &b, &s, "with one document per row");
    free_result(&a);
    free_result(&b);
    free(q); free(k); free(v); free(dout); free(pos);
}
Test(attention_bf16, one_document_per_row_equals_no_positions) { check_one_document_per_row(1); }
Test(attention_f32, one_document_per_row_equals_no_positions) { check_one_document_per_row(0); }

/* Both precisions claim bitwise reproducible forward and backward (no
 * atomics), packed or not, soft-capped or not (cs), head dim 256 too: two
 * runs on the same inputs must agree to the bit. HD 0: 128 in bf16, 64 in
 * fp32. */
static void check_deterministic_case(int bf16, int packed, const scores_case *cs, size_t HD) {
    skip_without_gpu();
    shape s = {2, 333, 8, 2, HD ? HD : bf16 ? 128 : 64};
    float *q, *k, *v, *dout;
    random_inputs(&s, 11, &q, &k, &v, &dout);
    int32_t *pos = packed ? packed_pos(s.B, s.T) : NULL;
    run_result a = run_gpu(&s, pos, cs, bf16, q, k, v, dout);
    run_result b = run_gpu(&s, pos, cs, bf16, q, k, v, dout);
    assert_same_bits(&a, &b, &s, "between runs");
    free_result(&a);
    free_result(&b);
    free(q); free(k); free(v); free(dout); free(pos);
}
static void check_deterministic(int bf16, int packed) {
    check_deterministic_case(bf16, packed, NULL, 0);
}
Test(attention_bf16, deterministic) { check_deterministic(1, 0); }
Test(attention_f32, deterministic) { check_deterministic(0, 0); }
Test(attention_bf16, packed_deterministic) { check_deterministic(1, 1); }
Test(attention_f32, packed_deterministic) { check_deterministic(0, 1); }
Test(attention_bf16, softcap_deterministic) {
    check_deterministic_case(1, 0, &CAP2, 0);
    check_deterministic_case(1, 1, &CAP2, 64);
}
static void check_mma_deterministic(shape s, int bf16) {
    (void)s;
    check_deterministic_case(bf16, 1, &CAP2, 128);
}
Test(attention_bf16_mma, softcap_deterministic) {
    with_mma(check_mma_deterministic, (shape){0});
}
Test(attention_f32, softcap_deterministic) { check_deterministic_case(0, 1, &CAP2, 0); }
Test(attention_bf16, hd256_deterministic) {
    check_deterministic_case(1, 0, NULL, 256);
    check_deterministic_case(1, 1, &CAP2, 256);
}

/* The persistent forward's blocks claim query tiles from a device counter;
 * with its grid capped each block claims many (a ring of key tiles running
 * on across them, the claim slots in turn), and five launches in a row
 * check that each leaves the counter at zero for the next: every cap must
 * give the bits of the uncapped launch. Packed and not, HD 64 and 128. */
static void check_grid_caps(shape s, int packed) {
    skip_without_gpu();
    float *q, *k, *v, *dout;
    random_inputs(&s, 31, &q, &k, &v, &dout);
    int32_t *pos = packed ? packed_pos(s.B, s.T) : NULL;
    run_result a = run_gpu(&s, pos, NULL, 1, q, k, v, dout);
    const int caps[] = {1, 2, 5, 13};
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
        cr_assert_eq(mt_attn_set_grid_cap(caps[c]), 0);
        run_result b = run_gpu(&s, pos, NULL, 1, q, k, v, dout);
        mt_attn_set_grid_cap(0);
        char what[32];
        snprintf(what, sizeof what, "with %d blocks", caps[c]);
        assert_same_bits(&a, &b, &s, what);
        free_result(&b);
    }
    free_result(&a);
    free(q); free(k); free(v); free(dout); free(pos);
}
/* 17 query tiles of 128 a head: the Hopper forward's items are eight pairs
 * of tiles and the middle tile alone; a long row for the backward too. */
Test(attention_bf16, long_sequence_odd_tile_count) {
    check_shape((shape){1, 2100, 2, 1, 64}, 1, BF16_TOL_FWD, BF16_TOL_BWD);
}
Test(attention_bf16, capped_grids_give_the_same_bits) {
    check_grid_caps((shape){2, 333, 8, 2, 128}, 0);
    check_grid_caps((shape){2, 333, 8, 2, 128}, 1);
    check_grid_caps((shape){3, 300, 4, 1, 64}, 1);
}

Test(attention, rejects_bad_shapes) {
    mt_error err = {{0}};
    // Shape checks come before any device work, so NULL pointers are fine.
    cr_assert_eq(mt_attn_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 6, 4,
                                      64, 0, &err), -1);
    cr_assert(strstr(err.msg, "NKV=4"), "message: %s", err.msg);
    cr_assert_eq(mt_attn_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 4, 4,
                                      72, 0, &err), -1);
    cr_assert(strstr(err.msg, "head_dim") && strstr(err.msg, "got 72"), "message: %s", err.msg);
    cr_assert(strstr(err.msg, "256"), "message: %s", err.msg);
    cr_assert_eq(mt_attn_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 4, 4,
                                      512, 0, &err), -1);
    cr_assert(strstr(err.msg, "got 512"), "message: %s", err.msg);
    cr_assert_eq(mt_attn_forward_f32(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 4, 4, 512, 0,
                                     &err), -1);
    cr_assert(strstr(err.msg, "512"), "message: %s", err.msg);
    // A soft-cap must be 0 (none) or a finite positive number, before any device work too.
    const mt_attn_scores bad[] = {{0.f, -1.f}, {0.f, NAN}, {0.f, INFINITY}, {NAN, 0.f}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(mt_attn_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, NULL, &bad[i], 1,
                                          8, 4, 4, 64, 0, &err), -1, "scores %zu", i);
        cr_assert(strstr(err.msg, "not a finite number"), "message: %s", err.msg);
        cr_assert_eq(mt_attn_backward_f32(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                          NULL, NULL, &bad[i], 1, 8, 4, 4, 64, 0, &err), -1);
    }
}
