/* Grouped expert product benchmark (a program, never a unit test; reached
 * through `megatrain bench moe-gemm`): the three products of moe_gemm.h in
 * bf16 on the expert shapes of Qwen3-30B-A3B and Mixtral-8x7B, 65536
 * tokens routed at random (each token to K distinct experts drawn
 * uniformly: balanced up to sampling noise), next to cuBLAS running the
 * same per-expert products one call per expert from a host loop that knows
 * the sizes. TFLOP/s count 2 * rows * IC * OC per product; each row also
 * gives the largest difference to cuBLAS relative to cuBLAS's largest
 * magnitude (the two sum in different orders: ~1e-6 expected). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "kernels/moe/moe_gemm_internal.cuh"

#define MB_WARMUP 2
#define MB_ITERS 10

#define MB_CUBLAS(stmt)                                                                   \
    do {                                                                                  \
        cublasStatus_t st_ = (stmt);                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                 \
            mt_die(__FILE__, __LINE__, "cuBLAS error in '%s': %d", #stmt, (int)st_);      \
    } while (0)

/* Deterministic pseudo-random bf16 in [-1, 1): random operands, because
 * zeros run measurably faster (less switching power). */
__global__ void mb_fill_kernel(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed ^ (uint32_t)(i >> 32) * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16((float)(h & 0xffffff) / 8388608.0f - 1.0f);
    }
}

/* out[0] = max |a - b| (+inf when either is not finite), out[1] = max |b|,
 * as float bits (non-negative floats order like their bits). */
__global__ void mb_diff_kernel(const float *a, const float *b, size_t n, unsigned *out) {
    float d = 0.f, m = 0.f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float di = fabsf(a[i] - b[i]);
        d = di <= 3.0e38f ? fmaxf(d, di) : INFINITY;
        m = fmaxf(m, fabsf(b[i]));
    }
    for (int o = 16; o > 0; o >>= 1) {
        d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, o));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(out, __float_as_uint(d));
        atomicMax(out + 1, __float_as_uint(m));
    }
}

static double mb_rel_diff(const float *a, const float *b, size_t n, unsigned *d_out,
                          cudaStream_t st) {
    unsigned h[2];
    CUDA_CHECK(cudaMemsetAsync(d_out, 0, 2 * sizeof(unsigned), st));
    mb_diff_kernel<<<1024, 256, 0, st>>>(a, b, n, d_out);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(h, d_out, sizeof h, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    float d, m;
    memcpy(&d, &h[0], 4);
    memcpy(&m, &h[1], 4);
    return m > 0 ? d / m : d;
}

/* One model's experts: routing, operands and results on the device. */
struct mb_model {
    const char *name;
    int E, K;
    size_t T, C, F; // tokens, model width, expert inner size
    size_t R;       // T * K grouped rows
    int32_t *start_h, *start_d;
    __nv_bfloat16 *x, *w, *dy; // (R, D), E x (C x F), (R, D); D = max(C, F)
    float *out, *out2;         // (R, D) grouped and cuBLAS
    float *dw, *dw2;           // E x (OC x IC)
    void *scratch;
};

/* Each token picks K distinct experts uniformly (xorshift64, fixed seed). */
static void mb_route(mb_model *m) {
    size_t *cnt = (size_t *)calloc((size_t)m->E, sizeof *cnt);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int *pick = (int *)malloc((size_t)m->K * sizeof *pick);
    for (size_t t = 0; t < m->T; t++)
        for (int j = 0; j < m->K; j++) {
            int e, dup;
            do {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                e = (int)(s % (uint64_t)m->E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= pick[i] == e;
            } while (dup);
            pick[j] = e;
            cnt[e]++;
        }
    m->start_h = (int32_t *)malloc(((size_t)m->E + 1) * sizeof(int32_t));
    m->start_h[0] = 0;
    for (int e = 0; e < m->E; e++) m->start_h[e + 1] = m->start_h[e] + (int32_t)cnt[e];
    free(cnt);
    free(pick);
}

typedef enum { MB_FWD_BF16, MB_FWD_F32, MB_DINP, MB_DW } mb_op;

static const char *mb_op_name(mb_op op) {
    switch (op) {
    case MB_FWD_BF16: return "fwd  y=x@W^T (bf16 out)";
    case MB_FWD_F32: return "fwd  y=x@W^T (fp32 out)";
    case MB_DINP: return "dinp dx=dy@W";
    default: return "dw   dW+=dy^T@x";
    }
}

/* The tensor-core kernel, and the mma.sync kernel's k step and pipeline
 * depth (0: its choice). */
typedef struct {
    mt_cuda_moe_kernel kernel;
    int bk, stages;
} mb_variant;

static int mb_kernel_op(mb_op op) {
    return op == MB_DW ? MT_MOE_DW : op == MB_DINP ? MT_MOE_DINP : MT_MOE_FWD;
}

static void mb_grouped(const mb_model *m, mb_op op, size_t IC, size_t OC, mb_variant v,
                       float *out, float *dw, cudaStream_t st) {
    mt_moe_args a;
    memset(&a, 0, sizeof a);
    a.start = m->start_d;
    a.tile_off = (int32_t *)m->scratch;
    a.E = m->E;
    a.R = (int)m->R;
    a.IC = (int)IC;
    a.OC = (int)OC;
    a.w_stride = IC * OC;
    a.out_stride = IC * OC;
    if (op == MB_DW) {
        a.a = m->dy, a.b = m->x, a.out = dw;
    } else if (op == MB_DINP) {
        a.a = m->dy, a.b = m->w, a.out = out;
    } else {
        a.a = m->x, a.b = m->w, a.out = out, a.out_bf16 = op == MB_FWD_BF16;
    }
    mt_moe_gemm_run(mb_kernel_op(op), MT_PREC_BF16, a, v.kernel, v.bk, v.stages, st);
}

/* The same products through cuBLAS, one call per expert (column-major
 * views of the row-major arrays as in gemm.cu). */
static void mb_cublas(cublasHandle_t h, const mb_model *m, mb_op op, size_t IC, size_t OC,
                      float *out, float *dw) {
    const float one = 1.f, zero = 0.f;
    for (int e = 0; e < m->E; e++) {
        const int64_t r0 = m->start_h[e], n = m->start_h[e + 1] - r0;
        if (n == 0) continue;
        const __nv_bfloat16 *we = m->w + (size_t)e * IC * OC;
        if (op == MB_DW)
            MB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)IC, (int)OC, (int)n, &one,
                                   m->x + r0 * IC, CUDA_R_16BF, (int)IC, m->dy + r0 * OC,
                                   CUDA_R_16BF, (int)OC, &one, dw + (size_t)e * IC * OC,
                                   CUDA_R_32F, (int)IC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else if (op == MB_DINP)
            MB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)IC, (int)n, (int)OC, &one,
                                   we, CUDA_R_16BF, (int)IC, m->dy + r0 * OC, CUDA_R_16BF,
                                   (int)OC, &zero, out + r0 * IC, CUDA_R_32F, (int)IC,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else if (op == MB_FWD_BF16)
            MB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)n, (int)IC, &one,
                                   we, CUDA_R_16BF, (int)IC, m->x + r0 * IC, CUDA_R_16BF,
                                   (int)IC, &zero, (__nv_bfloat16 *)out + r0 * OC, CUDA_R_16BF,
                                   (int)OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            MB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)n, (int)IC, &one,
                                   we, CUDA_R_16BF, (int)IC, m->x + r0 * IC, CUDA_R_16BF,
                                   (int)IC, &zero, out + r0 * OC, CUDA_R_32F, (int)OC,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* TFLOP/s of MB_ITERS runs of one product after MB_WARMUP. */
static double mb_time(const mb_model *m, mb_op op, size_t IC, size_t OC, mb_variant v,
                      cublasHandle_t h, cudaStream_t st) {
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    for (int i = 0; i < MB_WARMUP + MB_ITERS; i++) {
        if (i == MB_WARMUP) CUDA_CHECK(cudaEventRecord(t0, st));
        if (h) mb_cublas(h, m, op, IC, OC, m->out2, m->dw2);
        else mb_grouped(m, op, IC, OC, v, m->out, m->dw, st);
    }
    CUDA_CHECK(cudaEventRecord(t1, st));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    const double rows = (double)m->start_h[m->E];
    return 2.0 * rows * (double)IC * (double)OC * MB_ITERS / (ms * 1e-3) / 1e12;
}

static void mb_model_run(FILE *f, mb_model *m, mb_variant v, cublasHandle_t h, unsigned *d_diff,
                         cudaStream_t st) {
    mb_route(m);
    const size_t R = m->R, C = m->C, F = m->F, WN = (size_t)m->E * C * F;
    const size_t D = C > F ? C : F; // the widest row of x, dy, y and dx
    int32_t lo = INT32_MAX, hi = 0;
    for (int e = 0; e < m->E; e++) {
        const int32_t n = m->start_h[e + 1] - m->start_h[e];
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
    }
    CUDA_CHECK(cudaMalloc(&m->start_d, ((size_t)m->E + 1) * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(m->start_d, m->start_h, ((size_t)m->E + 1) * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&m->scratch, mt_cuda_moe_gemm_scratch_bytes(m->E)));
    CUDA_CHECK(cudaMalloc(&m->x, R * D * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&m->dy, R * D * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&m->w, WN * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&m->out, R * D * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->out2, R * D * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->dw, WN * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->dw2, WN * sizeof(float)));
    mb_fill_kernel<<<2048, 256, 0, st>>>(m->x, R * D, 1);
    mb_fill_kernel<<<2048, 256, 0, st>>>(m->dy, R * D, 2);
    mb_fill_kernel<<<2048, 256, 0, st>>>(m->w, WN, 3);
    CUDA_LAUNCH_CHECK();
    fprintf(f, "\n%s: E=%d experts, top-%d of %zu tokens = %zu rows, %d..%d rows per expert\n",
            m->name, m->E, m->K, m->T, R, lo, hi);
    fprintf(f, "%-8s %6s %6s  %-24s %9s %5s %9s %9s %9s\n", "matrix", "IC", "OC", "product",
            mt_cuda_moe_gemm_kernel_name(), "bk/st", "mma.sync", "cuBLAS", "rel.diff");
    mb_variant mma = v;
    mma.kernel = MT_CUDA_MOE_KERNEL_MMA;
    const bool two = strcmp(mt_cuda_moe_gemm_kernel_name(), "mma.sync") != 0;
    const size_t shapes[2][2] = {{C, F}, {F, C}}; // gate/up, down
    for (int s = 0; s < 2; s++) {
        const size_t IC = shapes[s][0], OC = shapes[s][1];
        for (int op = MB_FWD_BF16; op <= MB_DW; op++) {
            const mb_op o = (mb_op)op;
            const double tg = mb_time(m, o, IC, OC, v, NULL, st);
            const double tm = two ? mb_time(m, o, IC, OC, mma, NULL, st) : tg;
            const double tc = mb_time(m, o, IC, OC, v, h, st);
            /* the check: one run of each from the same state */
            double diff = NAN;
            if (o != MB_FWD_BF16) {
                const size_t n = o == MB_DW ? (size_t)m->E * IC * OC
                                            : R * (o == MB_DINP ? IC : OC);
                CUDA_CHECK(cudaMemsetAsync(m->dw, 0, WN * sizeof(float), st));
                CUDA_CHECK(cudaMemsetAsync(m->dw2, 0, WN * sizeof(float), st));
                mb_grouped(m, o, IC, OC, v, m->out, m->dw, st);
                mb_cublas(h, m, o, IC, OC, m->out2, m->dw2);
                diff = o == MB_DW ? mb_rel_diff(m->dw, m->dw2, n, d_diff, st)
                                  : mb_rel_diff(m->out, m->out2, n, d_diff, st);
            }
            mb_variant used = v;
            mt_moe_mma_pick(mb_kernel_op(o), &used.bk, &used.stages);
            char dtxt[32] = "-"; /* bf16 outputs: the fp32 row checks the same kernel */
            if (!isnan(diff)) snprintf(dtxt, sizeof dtxt, "%.2g", diff);
            fprintf(f, "%-8s %6zu %6zu  %-24s %9.1f %2d/%-2d %9.1f %9.1f %9s\n",
                    s == 0 ? "gate/up" : "down", IC, OC, mb_op_name(o), tg, used.bk, used.stages,
                    tm, tc, dtxt);
            fflush(f);
        }
    }
    CUDA_CHECK(cudaFree(m->start_d));
    CUDA_CHECK(cudaFree(m->scratch));
    CUDA_CHECK(cudaFree(m->x));
    CUDA_CHECK(cudaFree(m->dy));
    CUDA_CHECK(cudaFree(m->w));
    CUDA_CHECK(cudaFree(m->out));
    CUDA_CHECK(cudaFree(m->out2));
    CUDA_CHECK(cudaFree(m->dw));
    CUDA_CHECK(cudaFree(m->dw2));
    free(m->start_h);
}

extern "C" int mt_cuda_moe_gemm_bench(FILE *f, int bk, int stages, mt_error *err) {
    if (mt_cuda_device_count() <= 0) return mt_errorf(err, "moe-gemm bench: no CUDA device");
    if (stages != 0 && (stages < 2 || stages > 5))
        return mt_errorf(err, "moe-gemm bench: --stages must be 2..5 (or 0: automatic)");
    if (bk != 0 && bk != 32 && bk != 64)
        return mt_errorf(err, "moe-gemm bench: --bk must be 32 or 64 (or 0: automatic)");
    const mb_variant v = {MT_CUDA_MOE_KERNEL_AUTO, bk, stages};
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    cublasHandle_t h;
    MB_CUBLAS(cublasCreate(&h));
    MB_CUBLAS(cublasSetStream(h, st));
    unsigned *d_diff;
    CUDA_CHECK(cudaMalloc(&d_diff, 2 * sizeof(unsigned)));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fprintf(f, "grouped expert products (bf16 operands, fp32 accumulation) on %s, %d SMs; "
               "TFLOP/s, mean of %d runs after %d warm-ups; first column: the kernel the "
               "products take; bk/st: the mma.sync kernel's k step and pipeline depth; "
               "rel.diff: the first column's against cuBLAS\n",
            prop.name, prop.multiProcessorCount, MB_ITERS, MB_WARMUP);
    /* name, E, K, T, C, F */
    const struct { const char *name; int E, K; size_t T, C, F; } shapes[2] = {
        {"Qwen3-30B-A3B", 128, 8, 65536, 2048, 768},
        {"Mixtral-8x7B", 8, 2, 65536, 4096, 14336},
    };
    for (int i = 0; i < 2; i++) {
        mb_model m;
        memset(&m, 0, sizeof m);
        m.name = shapes[i].name;
        m.E = shapes[i].E;
        m.K = shapes[i].K;
        m.T = shapes[i].T;
        m.C = shapes[i].C;
        m.F = shapes[i].F;
        m.R = m.T * (size_t)m.K;
        mb_model_run(f, &m, v, h, d_diff, st);
    }
    CUDA_CHECK(cudaFree(d_diff));
    MB_CUBLAS(cublasDestroy(h));
    CUDA_CHECK(cudaStreamDestroy(st));
    return 0;
}
