/* What the attention kernels of both precisions share: launch checks,
 * the shared-memory opt-in, and the backward's first pass D =
 * rowsum(dout * out) (see attention.cu for the design). */
#include "backend/cuda/attention_internal.cuh"

int mt_attn_check_launch(mt_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: launching %s failed: %s", what, cudaGetErrorString(e));
    return 0;
}

int mt_attn_set_smem(const void *kernel, size_t bytes, mt_error *err) {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: cannot give a kernel %zu bytes of shared memory: %s",
                         bytes, cudaGetErrorString(e));
    return 0;
}

/* D[b,h,t] = sum_d dout*out: one warp per row; shared by both precisions. */
template <typename TIN>
__global__ void mt_attn_dsum_kernel(mt_attn_args a, int rows) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; // row = (b*T + t)*NH + h
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const TIN *dout = (const TIN *)a.dout + (int64_t)row * a.HD;
    const TIN *out = (const TIN *)a.out + (int64_t)row * a.HD;
    float s = 0.f;
    for (int d = lane; d < a.HD; d += 32) s += (float)dout[d] * (float)out[d];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        int h = row % a.NH, bt = row / a.NH, t = bt % a.T, b = bt / a.T;
        a.dsum[((int64_t)b * a.NH + h) * a.T + t] = s;
    }
}

int mt_attn_launch_dsum(const mt_attn_args &a, int B, int is_bf16, cudaStream_t stream,
                        mt_error *err) {
    int rows = B * a.T * a.NH, warps = 8;
    dim3 grid((rows + warps - 1) / warps);
    if (is_bf16) mt_attn_dsum_kernel<bf16><<<grid, warps * 32, 0, stream>>>(a, rows);
    else mt_attn_dsum_kernel<float><<<grid, warps * 32, 0, stream>>>(a, rows);
    return mt_attn_check_launch(err, "attention dsum");
}
