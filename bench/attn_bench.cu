/* Benchmark of the fused attention kernels (kernels/attention/attention.h).
 *
 * Build and run (from the repository root):
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DMT_CUDA_SM90A \
 *        -DMT_HAVE_CUDA -Isrc -o build/attn_bench bench/attn_bench.cu \
 *        src/kernels/attention/attention*.cu src/kernels/scratch_sizes.c \
 *        src/util/error.c && build/attn_bench
 * (other GPUs: -arch=sm_80 and no MT_CUDA_SM90A; the mma.sync kernels only).
 *
 * For each shape: random N(0,1) inputs, 3 warm-up runs, then the median of
 * 20 timed runs (CUDA events) of the forward and of the backward (the
 * backward includes its rowsum pass); on Hopper the bf16 forward and
 * backward also through the mma.sync kernels (columns "mma"). TFLOPS count causal FLOPs: forward
 * 4*B*NH*T*T*HD/2 (QK^T and PV over the lower triangle), backward 2.5x.
 * Shapes with doc > 0 pack every row with documents of doc tokens (the
 * last one cut at T) and count each document's own triangle.
 * --softcap C runs every shape with Gemma 2's logit soft-capping at C (the
 * kernels compiled with SOFTCAP; the FLOPs counted are the same). */
#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/attention/attention.h"

#define BENCH_CK(call)                                                                    \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* Approximately N(0,1) from a hash (sum of 4 uniforms, rescaled). */
template <typename T> __global__ void bench_fill(T *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        for (int j = 0; j < 4; j++) {
            h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
            s += (h >> 8) * (1.f / 16777216.f);
        }
        x[i] = (T)((s - 2.f) * 1.7320508f);
    }
}

struct bench_shape { size_t B, T, NH, NKV, HD; int bf16; size_t doc; };

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void die(const mt_error &err) {
    fprintf(stderr, "attn_bench: %s\n", err.msg);
    exit(1);
}

static void bench_one(const bench_shape &s, const mt_attn_scores *sc) {
    const size_t nq = s.B * s.T * s.NH * s.HD, nk = s.B * s.T * s.NKV * s.HD;
    const size_t es = s.bf16 ? 2 : 4;
    void *q, *k, *v, *dout, *out, *scratch;
    float *lse, *dq, *dk, *dv;
    BENCH_CK(cudaMalloc(&q, nq * es));
    BENCH_CK(cudaMalloc(&dout, nq * es));
    BENCH_CK(cudaMalloc(&out, nq * es));
    BENCH_CK(cudaMalloc(&k, nk * es));
    BENCH_CK(cudaMalloc(&v, nk * es));
    BENCH_CK(cudaMalloc(&lse, s.B * s.NH * s.T * 4));
    BENCH_CK(cudaMalloc(&dq, nq * 4));
    BENCH_CK(cudaMalloc(&dk, nk * 4));
    BENCH_CK(cudaMalloc(&dv, nk * 4));
    BENCH_CK(cudaMalloc(&scratch, mt_attn_backward_scratch_bytes(s.B, s.T, s.NH)));
    int32_t *pos = NULL;
    double pairs = (double)s.T * s.T / 2; // (query, key) pairs of one row, causal
    if (s.doc) {
        std::vector<int32_t> h(s.B * s.T);
        for (size_t i = 0; i < h.size(); i++) h[i] = (int32_t)(i % s.T % s.doc);
        BENCH_CK(cudaMalloc(&pos, h.size() * 4));
        BENCH_CK(cudaMemcpy(pos, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        pairs = 0;
        for (size_t t = 0; t < s.T; t += s.doc) {
            const double L = (double)std::min(s.doc, s.T - t);
            pairs += L * L / 2;
        }
    }
    void *bufs[] = {q, k, v, dout};
    size_t ns[] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        if (s.bf16) bench_fill<__nv_bfloat16><<<1024, 256>>>((__nv_bfloat16 *)bufs[i], ns[i], i + 1);
        else bench_fill<float><<<1024, 256>>>((float *)bufs[i], ns[i], i + 1);
    }
    BENCH_CK(cudaGetLastError());
    mt_error err;
    auto fwd = [&]() {
        int rc = s.bf16 ? mt_attn_forward_bf16((uint16_t *)out, NULL, lse, (uint16_t *)q,
                                               (uint16_t *)k, (uint16_t *)v, pos, sc, s.B, s.T,
                                               s.NH, s.NKV, s.HD, 0, &err)
                        : mt_attn_forward_f32((float *)out, lse, (float *)q, (float *)k,
                                              (float *)v, pos, sc, s.B, s.T, s.NH, s.NKV, s.HD, 0,
                                              &err);
        if (rc) die(err);
    };
    auto bwd = [&]() {
        int rc = s.bf16 ? mt_attn_backward_bf16(dq, dk, dv, scratch, (uint16_t *)dout,
                                                (uint16_t *)q, (uint16_t *)k, (uint16_t *)v,
                                                (uint16_t *)out, lse, pos, sc, s.B, s.T, s.NH,
                                                s.NKV, s.HD, 0, &err)
                        : mt_attn_backward_f32(dq, dk, dv, scratch, (float *)dout, (float *)q,
                                               (float *)k, (float *)v, (float *)out, lse, pos, sc,
                                               s.B, s.T, s.NH, s.NKV, s.HD, 0, &err);
        if (rc) die(err);
    };
    cudaEvent_t e0, e1;
    BENCH_CK(cudaEventCreate(&e0));
    BENCH_CK(cudaEventCreate(&e1));
    const int warm = 3, reps = s.bf16 ? 20 : 5;
    // passes: forward, backward, then both through the mma.sync kernels
    // where they take the head dim
    bool two = s.bf16 && strcmp(mt_attn_kernel_name(), "mma.sync") != 0;
    if (two) {
        mt_attn_use(MT_ATTN_KERNEL_MMA);
        two = mt_attn_bf16_supports(s.HD);
        mt_attn_use(MT_ATTN_KERNEL_AUTO);
    }
    float ms[4] = {0, 0, 0, 0};
    for (int pass = 0; pass < (two ? 4 : 2); pass++) {
        std::vector<float> t;
        if (pass == 2) mt_attn_use(MT_ATTN_KERNEL_MMA);
        for (int i = 0; i < warm + reps; i++) {
            BENCH_CK(cudaEventRecord(e0));
            if (pass % 2 == 0) fwd(); else bwd();
            BENCH_CK(cudaEventRecord(e1));
            BENCH_CK(cudaEventSynchronize(e1));
            float x;
            BENCH_CK(cudaEventElapsedTime(&x, e0, e1));
            if (i >= warm) t.push_back(x);
        }
        ms[pass] = median(t);
    }
    if (two) mt_attn_use(MT_ATTN_KERNEL_AUTO);
    const double fl = 4.0 * s.B * s.NH * pairs * s.HD;
    char mma_f[16] = "-", mma_b[16] = "-";
    if (two) {
        snprintf(mma_f, sizeof mma_f, "%.1f", fl / ms[2] * 1e-9);
        snprintf(mma_b, sizeof mma_b, "%.1f", 2.5 * fl / ms[3] * 1e-9);
    }
    printf("%-5s %5zu %2zu %5zu %3zu/%-3zu %4zu %5zu | %8.3f %7.1f %7s | %8.3f %7.1f %7s\n",
           s.bf16 ? "bf16" : "fp32", s.T, s.B, s.B * s.T, s.NH, s.NKV, s.HD, s.doc, ms[0],
           fl / ms[0] * 1e-9, mma_f, ms[1], 2.5 * fl / ms[1] * 1e-9, mma_b);
    fflush(stdout);
    void *all[] = {q, k, v, dout, out, scratch, lse, dq, dk, dv, pos};
    for (void *p : all) BENCH_CK(cudaFree(p));
    BENCH_CK(cudaEventDestroy(e0));
    BENCH_CK(cudaEventDestroy(e1));
}

int main(int argc, char **argv) {
    mt_attn_scores sc = {0.f, 0.f};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--softcap") && i + 1 < argc) {
            sc.softcap = (float)atof(argv[++i]);
        } else {
            fprintf(stderr, "usage: attn_bench [--softcap C]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs; bf16 kernels: %s; soft-cap %g\n", prop.name,
           prop.multiProcessorCount, mt_attn_kernel_name(), sc.softcap);
    printf("mode      T  B  B*T  NH/NKV   HD   doc |   fwd ms  TFLOPS     mma |   bwd ms  "
           "TFLOPS     mma\n");
    const bench_shape shapes[] = {
        {8, 2048, 32, 8, 128, 1, 0},   {8, 2048, 32, 32, 128, 1, 0}, {8, 2048, 32, 8, 64, 1, 0},
        {4, 4096, 32, 8, 128, 1, 0},   {16, 1024, 32, 8, 128, 1, 0}, {2, 8192, 32, 8, 128, 1, 0},
        {8, 2048, 32, 8, 96, 1, 0},    {8, 2048, 32, 8, 80, 1, 0},   {1, 2048, 32, 8, 128, 0, 0},
        // packed documents: one per row (the packed kernels on the causal problem), then shorter
        {8, 2048, 32, 8, 128, 1, 2048}, {8, 2048, 32, 8, 128, 1, 512}, {8, 2048, 32, 8, 128, 1, 128},
        {1, 2048, 32, 8, 128, 0, 512},
        // head dim 256: Gemma 2 9B's heads (16/8), Gemma 3 4B's (8/4), packed
        {8, 2048, 16, 8, 256, 1, 0},   {4, 4096, 8, 4, 256, 1, 0},   {8, 2048, 16, 8, 256, 1, 512},
    };
    for (const bench_shape &s : shapes) bench_one(s, &sc);
    return 0;
}
