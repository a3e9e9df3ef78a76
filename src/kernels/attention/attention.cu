/* Fused causal GQA attention, forward and backward (see attention.h for
 * the contract): the API and shape checks. The kernels live in
 * attention_mma_fwd.cu, attention_mma_bwd.cu, attention_wgmma_*.cu (Hopper),
 * attention_f32.cu and, the backward's first pass and launch helpers,
 * attention_common.cu (attention_internal.cuh lists them).
 *
 * bf16 path (FlashAttention-2 style): a thread block owns a tile of rows and
 * streams the other side's tiles through double-buffered shared memory with
 * cp.async; each warp owns 16 rows (32 in the forward) and does its
 * products with mma.sync.m16n8k16 (bf16 in, fp32 accumulate), fed by
 * ldmatrix. Softmax runs online in fp32 in the log2 domain (one FFMA and one
 * ex2.approx per score).
 *   forward : blocks over (query tile of 128, head, batch).
 *   backward: D = rowsum(dout * out) first; then dK,dV over (key tile of
 *             64, kv head, batch), looping over the group's query heads and
 *             the query tiles at or after the key tile; then dQ over (query
 *             tile of 128, head, batch), recomputing P. Two passes instead of
 *             fp32 atomics on dq: 7 instead of 5 tile products, but the
 *             result is bitwise reproducible and dq needs no zeroing pass.
 * f32 path: plain fp32 FMA, one warp per row, a lane per key of a 32-key
 * tile for scores, a lane per output column for the weighted sums.
 *
 * Soft-capped scores (a.softcap > 0) take kernels compiled with SOFTCAP
 * (the plain ones' code unchanged): the bf16 kernels turn each raw q.k into
 * t = tanh(q.k scale / c) right after its product and run the same softmax
 * with c log2e as its log2 factor (mt_attn_sl2); the backward takes P and
 * dS = P (dP - D) (1 - t^2) from t. Head dim 256 (bf16) runs the mma.sync
 * kernels on every GPU, Hopper included: forward 8 warps of 16 rows, dK and
 * dV in two launches of 4 warps (their fp32 accumulators would not fit one
 * thread's registers together), dQ 4 warps. */
#include "kernels/attention/attention_internal.cuh"

/* Whether the current device lets a block have the shared memory of the
 * mma.sync kernels at HD 256 (Hopper's 227 KB does; an A100's 163 KB does
 * not); true when no device can be asked. */
static bool mt_attn_mma_fits_256(void) {
    const size_t need = mt_attn_fwd_mma_smem_256() > mt_attn_bwd_mma_smem_256()
                            ? mt_attn_fwd_mma_smem_256()
                            : mt_attn_bwd_mma_smem_256();
    int dev, optin;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return true; // no device to ask: a plan made for the Hopper GPUs we train on
    }
    return (size_t)optin >= need;
}

static int mt_attn_check_shape(size_t B, size_t T, size_t NH, size_t NKV, size_t HD, int is_bf16,
                               mt_error *err) {
    if (NH == 0 || NKV == 0 || NH % NKV != 0)
        return mt_errorf(err, "attention: NH=%zu is not a multiple of NKV=%zu; use a model "
                         "whose query heads split evenly over its kv heads", NH, NKV);
    if (is_bf16 && !mt_attn_bf16_supports(HD))
        return mt_errorf(err, "attention: the bf16 kernels (%s) take head_dim 64, 128%s or "
                         "256, got %zu%s; use --precision fp32", mt_attn_kernel_name(),
                         mt_attn_takes_wgmma() ? ", 80, 96" : "", HD,
                         mt_attn_mma_fits_256() ? "" : " (256 not on this GPU, whose blocks "
                         "lack the 199 KB of shared memory it takes)");
    if (!is_bf16 && (HD == 0 || HD > 256))
        return mt_errorf(err, "attention: fp32 kernels support head_dim 1..256, got %zu", HD);
    if (B > 65535 || NH > 65535 || T > (size_t)INT32_MAX / 2 || T * NH * HD > (size_t)INT32_MAX)
        return mt_errorf(err, "attention: shape B=%zu T=%zu NH=%zu HD=%zu too large for one "
                         "launch; split the micro-batch", B, T, NH, HD);
    return 0;
}

/* A soft-cap is 0 (none) or a positive finite number; the scale too. */
static int mt_attn_check_scores(const mt_attn_scores *sc, mt_error *err) {
    if (sc && (!(sc->softcap >= 0) || isinf(sc->softcap)))
        return mt_errorf(err, "attention: logit soft-cap %g is not a finite number >= 0 "
                         "(0: none); fix attn_logit_softcapping", sc->softcap);
    if (sc && (!(sc->scale >= 0) || isinf(sc->scale)))
        return mt_errorf(err, "attention: score scale %g is not a finite number >= 0 "
                         "(0: 1/sqrt(head_dim))", sc->scale);
    return 0;
}

/* HD 256 runs on the mma.sync kernels everywhere, Hopper included. */
extern "C" bool mt_attn_bf16_supports(size_t HD) {
    return HD == 64 || HD == 128 || (mt_attn_takes_wgmma() && (HD == 80 || HD == 96)) ||
           (HD == 256 && mt_attn_mma_fits_256());
}

static mt_attn_args mt_attn_make_args(const mt_attn_scores *sc, size_t T, size_t NH, size_t NKV,
                                      size_t HD) {
    mt_attn_args a = {};
    a.T = (int)T;
    a.NH = (int)NH;
    a.NKV = (int)NKV;
    a.HD = (int)HD;
    a.scale = sc && sc->scale > 0 ? sc->scale : (float)(1.0 / sqrt((double)HD));
    a.softcap = sc ? sc->softcap : 0.f;
    return a;
}

extern "C" int mt_attn_forward_bf16(uint16_t *out, float *out_f32, float *lse, const uint16_t *q,
                                    const uint16_t *k, const uint16_t *v, const int32_t *pos,
                                    const mt_attn_scores *sc, size_t B, size_t T, size_t NH,
                                    size_t NKV, size_t HD, cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 1, err) || mt_attn_check_scores(sc, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(sc, T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.o = out; a.o_f32 = out_f32; a.lse = lse; a.pos = pos;
    return mt_attn_fwd_bf16(a, (int)B, stream, err);
}

extern "C" int mt_attn_backward_bf16(float *dq, float *dk, float *dv, void *scratch,
                                     const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                                     const uint16_t *v, const uint16_t *out, const float *lse,
                                     const int32_t *pos, const mt_attn_scores *sc, size_t B,
                                     size_t T, size_t NH, size_t NKV, size_t HD,
                                     cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 1, err) || mt_attn_check_scores(sc, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(sc, T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.dout = dout; a.out = out; a.lse = (float *)lse;
    a.dsum = (float *)scratch; a.dq = dq; a.dk = dk; a.dv = dv; a.pos = pos;
    return mt_attn_bwd_bf16(a, (int)B, stream, err);
}

extern "C" int mt_attn_forward_f32(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *pos, const mt_attn_scores *sc,
                                   size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                   cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 0, err) || mt_attn_check_scores(sc, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(sc, T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.o = out; a.lse = lse; a.pos = pos;
    return mt_attn_f32(a, (int)B, 0, stream, err);
}

extern "C" int mt_attn_backward_f32(float *dq, float *dk, float *dv, void *scratch,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse,
                                    const int32_t *pos, const mt_attn_scores *sc, size_t B,
                                    size_t T, size_t NH, size_t NKV, size_t HD,
                                    cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 0, err) || mt_attn_check_scores(sc, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(sc, T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.dout = dout; a.out = out; a.lse = (float *)lse;
    a.dsum = (float *)scratch; a.dq = dq; a.dk = dk; a.dv = dv; a.pos = pos;
    return mt_attn_f32(a, (int)B, 1, stream, err);
}
