/* What the attention kernels share: launch checks, the shared-memory
 * opt-in, the backward's first pass D = rowsum(dout * out) (see
 * attention.cu for the design), and the Hopper kernels' TMA maps. */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include "backend/cuda/attention_wgmma.cuh"

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

/* The driver's tensor-map encoder, through the runtime (no link to the
 * driver library); NULL where the driver has none. */
static PFN_cuTensorMapEncodeTiled_v12000 encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        (void)cudaGetLastError();
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

int mt_attn_tma_map(CUtensorMap *map, const void *p, int B, int T, int H, int HD, int rows,
                    mt_error *err) {
    const cuuint64_t dim[4] = {(cuuint64_t)HD, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t stride[3] = {(cuuint64_t)HD * 2, (cuuint64_t)H * HD * 2,
                                  (cuuint64_t)T * H * HD * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, estride[4] = {1, 1, 1, 1};
    const CUresult r = encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)p, dim, stride,
                                 box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return mt_errorf(err, "attention (bf16, wgmma): the driver cannot describe q, k, v "
                              "or dout to the TMA (error %d; device pointers must be 16-byte "
                              "aligned)", (int)r);
    return 0;
}

bool mt_attn_tma_available(void) { return encoder() != nullptr; }
