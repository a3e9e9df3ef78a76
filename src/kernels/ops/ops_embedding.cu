/* Token embedding on the GPU, forward and a deterministic backward.
 *
 * Backward: several rows of a micro-batch may carry the same token, and
 * summing them with float atomics would make the gradient depend on
 * scheduling. Instead the host (which holds the tokens anyway, before it
 * copies them over) groups the rows by token with one sort
 * (mt_embedding_backward_plan), and one thread block per distinct token
 * sums that token's rows in row order and adds the sum into its row of
 * dwte. Each dwte row is written by exactly one block: no atomics, same
 * bits every run. The rows of the padding index (nn.Embedding's
 * padding_idx) are left out of the groups: its row gets nothing. */
#include <stdlib.h>

#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"

template <typename W>
__global__ void embedding_fwd_kernel(float *out, const int32_t *tokens, const W *wte, size_t N,
                                     size_t C) {
    size_t stride = (size_t)gridDim.x * blockDim.x, n = N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t row = i / C, c = i % C;
        out[i] = (float)wte[(size_t)tokens[row] * C + c];
    }
}

/* fp32 rows with C % 4 == 0: one float4 per thread. */
__global__ void embedding_fwd_vec_kernel(float4 *out, const int32_t *tokens, const float4 *wte,
                                         size_t N, size_t C4) {
    size_t stride = (size_t)gridDim.x * blockDim.x, n = N * C4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t row = i / C4, c = i % C4;
        out[i] = wte[(size_t)tokens[row] * C4 + c];
    }
}

extern "C" void mt_cuda_embedding_forward(mt_cuda_ctx *ctx, float *out, const int32_t *tokens,
                                          const void *wte, mt_dt wte_dt, size_t N, size_t C) {
    if (N * C == 0) return;
    const unsigned threads = 256;
    bool vec = wte_dt == MT_DT_F32 && C % 4 == 0 && ((uintptr_t)out & 15) == 0 &&
               ((uintptr_t)wte & 15) == 0;
    size_t work = vec ? N * C / 4 : N * C;
    size_t blocks = MT_CEIL_DIV(work, (size_t)threads);
    unsigned g = (unsigned)(blocks > 65536 ? 65536 : blocks);
    if (vec)
        embedding_fwd_vec_kernel<<<g, threads, 0, ctx->stream>>>(
            (float4 *)out, tokens, (const float4 *)wte, N, C / 4);
    else if (wte_dt == MT_DT_BF16)
        embedding_fwd_kernel<__nv_bfloat16><<<g, threads, 0, ctx->stream>>>(
            out, tokens, (const __nv_bfloat16 *)wte, N, C);
    else
        embedding_fwd_kernel<float><<<g, threads, 0, ctx->stream>>>(out, tokens,
                                                                   (const float *)wte, N, C);
    CUDA_LAUNCH_CHECK();
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

extern "C" int mt_embedding_backward_plan(int32_t *order, int32_t *bounds, size_t *n_groups,
                                          const int32_t *tokens, size_t N, size_t V,
                                          int64_t pad, mt_error *err) {
    *n_groups = 0;
    if (N > INT32_MAX) return mt_errorf(err, "embedding backward: %zu rows exceed 2^31", N);
    uint64_t *keys = (uint64_t *)malloc((N ? N : 1) * sizeof *keys);
    if (!keys) return mt_errorf(err, "embedding backward plan: out of host memory (%zu rows)", N);
    size_t kept = 0;
    for (size_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || (size_t)tokens[i] >= V) {
            free(keys);
            return mt_errorf(err, "token %d at row %zu is outside the vocabulary [0, %zu): "
                                  "check the tokenizer matches the model",
                             tokens[i], i, V);
        }
        if (tokens[i] == pad) continue;
        keys[kept++] = (uint64_t)(uint32_t)tokens[i] << 32 | (uint64_t)i; /* by (token, row) */
    }
    qsort(keys, kept, sizeof *keys, cmp_u64);
    size_t g = 0;
    for (size_t i = 0; i < kept; i++) {
        order[i] = (int32_t)(keys[i] & 0xffffffffu);
        if (i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32)) bounds[g++] = (int32_t)i;
    }
    bounds[g] = (int32_t)kept;
    *n_groups = g;
    free(keys);
    return 0;
}

/* Block g owns token tokens[order[bounds[g]]]: sums its rows in row order. */
__global__ void embedding_bwd_kernel(float *dwte, const float *dout, const int32_t *tokens,
                                     const int32_t *order, const int32_t *bounds, size_t C) {
    int32_t begin = bounds[blockIdx.x], end = bounds[blockIdx.x + 1];
    size_t tok = (size_t)tokens[order[begin]];
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int32_t j = begin; j < end; j++) acc += dout[(size_t)order[j] * C + c];
        dwte[tok * C + c] += acc;
    }
}

extern "C" void mt_cuda_embedding_backward(mt_cuda_ctx *ctx, float *dwte, const float *dout,
                                           const int32_t *tokens, const int32_t *order,
                                           const int32_t *bounds, size_t n_groups, size_t C) {
    if (n_groups == 0 || C == 0) return;
    MT_ASSERT(n_groups <= INT32_MAX);
    embedding_bwd_kernel<<<(unsigned)n_groups, 256, 0, ctx->stream>>>(dwte, dout, tokens, order,
                                                                      bounds, C);
    CUDA_LAUNCH_CHECK();
}
