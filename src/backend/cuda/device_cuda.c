/* The GPU side of a CUDA build (device.h): GPUs through the CUDA runtime,
 * the communicator through NCCL (nccl.h). */
#include "backend/device.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda_ops.h"
#include "backend/cuda/nccl.h"
#include "kernels/cuda_common.h"
#include "kernels/moe/moe_gemm.h"
#include "backend/cuda/planner_probe.h"

_Static_assert(MT_DEVICE_COMM_ID_BYTES == MT_NCCL_ID_BYTES, "one id");

int mt_device_count(void) { return mt_cuda_device_count(); }

int mt_device_memory(double *free_bytes, double *total_bytes) {
    size_t fr = 0, tot = 0;
    if (mt_cuda_device_count() <= 0 || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    if (free_bytes) *free_bytes = (double)fr;
    if (total_bytes) *total_bytes = (double)tot;
    return 0;
}

mt_backend *mt_device_backend_create(const mt_config *cfg, const mt_param_table *t,
                                     mt_host_store *store, int max_M, int64_t B, int64_t T,
                                     const mt_cuda_backend_opts *o, mt_error *err) {
    return mt_cuda_backend_create(cfg, t, store, max_M, B, T, o, err);
}

int mt_device_probe(mt_rates *r, const mt_config *cfg, int M, int64_t B, int64_t T, int fp32,
                    mt_error *err) {
    return mt_rates_probe(r, cfg, M, B, T, fp32 ? MT_GPU_FP32 : MT_GPU_BF16, err);
}

int mt_device_select(int index, mt_error *err) {
    int n = mt_cuda_device_count();
    if (index < 0 || index >= n)
        return mt_errorf(err, "GPU %d: this machine shows %d GPU%s (CUDA_VISIBLE_DEVICES may hide "
                         "some); start at most %d ranks on it", index, n, n == 1 ? "" : "s", n);
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess)
        return mt_errorf(err, "GPU %d: cannot use it: %s", index, cudaGetErrorString(e));
    return 0;
}

int mt_device_comm_id(unsigned char id[MT_DEVICE_COMM_ID_BYTES], mt_error *err) {
    return mt_nccl_unique_id(id, err);
}

mt_device_comm *mt_device_comm_open(const unsigned char id[MT_DEVICE_COMM_ID_BYTES], int rank,
                                    int world, mt_error *err) {
    return (mt_device_comm *)mt_nccl_open(id, rank, world, err);
}

void mt_device_comm_close(mt_device_comm *c) { mt_nccl_close((mt_nccl *)c); }

int mt_device_comm_probe(mt_device_comm *c, double *link_gbs, mt_error *err) {
    mt_nccl *nc = (mt_nccl *)c;
    int n = mt_nccl_world(nc);
    size_t chunk = (size_t)16 << 20; /* floats: 64 MB a rank */
    float *buf = NULL;
    if (cudaMalloc((void **)&buf, chunk * (size_t)n * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        return mt_errorf(err, "measuring the collectives: no GPU memory for %zu MB",
                         chunk * (size_t)n * 4 >> 20);
    }
    cudaStream_t s;
    cudaEvent_t a, b;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaMemsetAsync(buf, 0, chunk * (size_t)n * sizeof(float), s));
    mt_nccl_all_gather(nc, buf, chunk, s); /* the connections are made at the first one */
    CUDA_CHECK(cudaEventRecord(a, s));
    const int reps = 4;
    for (int i = 0; i < reps; i++) mt_nccl_all_gather(nc, buf, chunk, s);
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    /* bus bandwidth: (n-1)/n of the gathered bytes arrive at each GPU */
    double bytes = (double)chunk * n * sizeof(float) * (n - 1) / n * reps;
    *link_gbs = bytes / (ms / 1e3) / 1e9;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    cudaFree(buf);
    return 0;
}

int mt_device_bench_moe_gemm(FILE *out, int bk, int stages, mt_error *err) {
    return mt_cuda_moe_gemm_bench(out, bk, stages, err);
}
