/* GEMM throughput benchmark (a program, never a unit test): times the
 * matrix products of one Llama-7B-like decoder layer at N = 16384 tokens,
 * forward and both backward products, through the same entry points the
 * trainer uses, and prints TFLOP/s (2*N*IC*OC flops per product). */
#include <stdlib.h>

#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"

#define BENCH_WARMUP 3
#define BENCH_ITERS 20

/* Deterministic pseudo-random fill in [-1, 1): random operands, because
 * zeros run measurably faster on these GPUs (less switching power). */
template <typename T>
__global__ void bench_fill_kernel(T *x, size_t n, uint32_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = (T)((float)(h & 0xffffff) / 8388608.0f - 1.0f);
    }
}

typedef enum { OP_FWD_BF16OUT, OP_FWD_F32OUT, OP_DINP, OP_DW } bench_op;

static const char *op_name(bench_op op) {
    switch (op) {
    case OP_FWD_BF16OUT: return "fwd   out=inp@W^T (bf16 out)";
    case OP_FWD_F32OUT: return "fwd   out=inp@W^T (fp32 out)";
    case OP_DINP: return "bwd   dinp=dout@W";
    default: return "bwd   dW+=dout^T@inp";
    }
}

static void run_op(mt_cuda_ctx *ctx, mt_precision prec, bench_op op, void *inp, void *w,
                   void *dout, void *out, float *grad, size_t N, size_t IC, size_t OC) {
    switch (op) {
    case OP_FWD_BF16OUT:
        mt_cuda_matmul_forward(ctx, prec, out, MT_DT_BF16, inp, w, NULL, N, IC, OC);
        break;
    case OP_FWD_F32OUT:
        mt_cuda_matmul_forward(ctx, prec, out, MT_DT_F32, inp, w, NULL, N, IC, OC);
        break;
    case OP_DINP:
        mt_cuda_matmul_backward(ctx, prec, grad, false, NULL, dout, inp, w, N, IC, OC);
        break;
    case OP_DW:
        mt_cuda_matmul_backward(ctx, prec, NULL, false, grad, dout, inp, w, N, IC, OC);
        break;
    }
}

static double time_op(mt_cuda_ctx *ctx, mt_precision prec, bench_op op, void *inp, void *w,
                      void *dout, void *out, float *grad, size_t N, size_t IC, size_t OC) {
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    for (int i = 0; i < BENCH_WARMUP; i++) run_op(ctx, prec, op, inp, w, dout, out, grad, N, IC, OC);
    CUDA_CHECK(cudaEventRecord(t0, ctx->stream));
    for (int i = 0; i < BENCH_ITERS; i++) run_op(ctx, prec, op, inp, w, dout, out, grad, N, IC, OC);
    CUDA_CHECK(cudaEventRecord(t1, ctx->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    return 2.0 * (double)N * (double)IC * (double)OC * BENCH_ITERS / (ms * 1e-3) / 1e12;
}

extern "C" int mt_cuda_gemm_bench(FILE *f, mt_error *err) {
    const size_t N = 16384, MAXD = 11008, H = 4096;
    const size_t shapes[][2] = {{H, H}, {H, MAXD}, {MAXD, H}}; /* (IC, OC) */
    cudaStream_t stream;
    if (mt_cuda_device_count() <= 0) return mt_errorf(err, "gemm bench: no CUDA device");
    CUDA_CHECK(cudaStreamCreate(&stream));
    mt_cuda_ctx *ctx;
    if (mt_cuda_ctx_create(&ctx, stream, 0, err)) return -1;
    /* fp32-sized buffers serve both precisions. */
    float *inp, *w, *dout, *out, *grad;
    CUDA_CHECK(cudaMalloc(&inp, N * MAXD * sizeof(float)));  // (N, IC)
    CUDA_CHECK(cudaMalloc(&w, MAXD * H * sizeof(float)));    // (OC, IC)
    CUDA_CHECK(cudaMalloc(&dout, N * MAXD * sizeof(float))); // (N, OC)
    CUDA_CHECK(cudaMalloc(&out, N * MAXD * sizeof(float)));  // (N, OC)
    CUDA_CHECK(cudaMalloc(&grad, N * MAXD * sizeof(float))); // dinp or dW
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fprintf(f, "GEMM bench on %s, N=%zu tokens, mean of %d runs after %d warm-ups\n",
            prop.name, N, BENCH_ITERS, BENCH_WARMUP);
    fprintf(f, "%-5s %6s %6s %6s  %-30s %8s\n", "prec", "N", "IC", "OC", "product", "TFLOP/s");
    for (int pi = 0; pi < 2; pi++) {
        mt_precision prec = pi == 0 ? MT_PREC_BF16 : MT_PREC_FP32;
        size_t n_shapes = prec == MT_PREC_BF16 ? 3 : 1; /* fp32 is slow: one shape */
        if (prec == MT_PREC_BF16) {
            bench_fill_kernel<__nv_bfloat16><<<1024, 256, 0, stream>>>((__nv_bfloat16 *)inp, N * MAXD, 1);
            bench_fill_kernel<__nv_bfloat16><<<1024, 256, 0, stream>>>((__nv_bfloat16 *)w, MAXD * H, 2);
            bench_fill_kernel<__nv_bfloat16><<<1024, 256, 0, stream>>>((__nv_bfloat16 *)dout, N * MAXD, 3);
        } else {
            bench_fill_kernel<float><<<1024, 256, 0, stream>>>(inp, N * MAXD, 1);
            bench_fill_kernel<float><<<1024, 256, 0, stream>>>(w, MAXD * H, 2);
            bench_fill_kernel<float><<<1024, 256, 0, stream>>>(dout, N * MAXD, 3);
        }
        CUDA_LAUNCH_CHECK();
        CUDA_CHECK(cudaMemsetAsync(grad, 0, N * MAXD * sizeof(float), stream));
        for (size_t s = 0; s < n_shapes; s++) {
            size_t IC = shapes[s][0], OC = shapes[s][1];
            for (int op = OP_FWD_BF16OUT; op <= OP_DW; op++) {
                if (prec == MT_PREC_FP32 && op == OP_FWD_BF16OUT) continue;
                double tf = time_op(ctx, prec, (bench_op)op, inp, w, dout, out, grad, N, IC, OC);
                fprintf(f, "%-5s %6zu %6zu %6zu  %-30s %8.1f\n",
                        prec == MT_PREC_BF16 ? "bf16" : "fp32", N, IC, OC,
                        op_name((bench_op)op), tf);
                fflush(f);
            }
        }
    }
    CUDA_CHECK(cudaFree(inp));
    CUDA_CHECK(cudaFree(w));
    CUDA_CHECK(cudaFree(dout));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(grad));
    mt_cuda_ctx_free(ctx);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
