/* What the attention kernels share: launch checks, the shared-memory
 * opt-in, the backward's first pass D = rowsum(dout * out) (see
 * attention.cu for the design), and the Hopper kernels' TMA maps. */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include <mutex>

#include "kernels/attention/attention_wgmma.cuh"

int mt_attn_check_launch(mt_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: launching %s failed: %s", what, cudaGetErrorString(e));
    return 0;
}

static int grid_cap; // mt_attn_set_grid_cap's n; 0: one block an SM

extern "C" int mt_attn_set_grid_cap(int n) {
    const int prev = grid_cap;
    grid_cap = n > 0 ? n : 0;
    return prev;
}

int mt_attn_launch_layout(int tiles, mt_attn_layout *l, mt_error *err) {
    int dev, sms;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: cannot count the device's SMs: %s",
                         cudaGetErrorString(e));
    l->grid = grid_cap ? min(grid_cap, tiles) : min(sms, tiles);
    l->chunk = sms / 8 > 1 ? sms / 8 : 1;
    return 0;
}

int mt_attn_qtiles_init(mt_attn_qtiles *tl, const mt_attn_args &a, int B, int BR,
                        mt_attn_layout *lay, mt_error *err) {
    tl->nqb = (a.T + BR - 1) / BR;
    tl->NH = a.NH;
    tl->B = B;
    tl->n = tl->nqb * a.NH * B;
    if (mt_attn_launch_layout(tl->n, lay, err)) return -1;
    tl->chunk = lay->chunk;
    return 0;
}

int mt_attn_tile_counter(unsigned **ctr, cudaStream_t st, mt_error *err) {
    static std::mutex mu;
    static unsigned *by_device[64];
    int dev;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: no current device: %s", cudaGetErrorString(e));
    if (dev >= 64) return mt_errorf(err, "attention: device %d: at most 64 devices", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!by_device[dev]) {
        unsigned *p;
        e = cudaMalloc(&p, 4 * sizeof *p);
        if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, 4 * sizeof *p, st);
        if (e != cudaSuccess)
            return mt_errorf(err, "attention: cannot allocate the tile counter: %s",
                             cudaGetErrorString(e));
        by_device[dev] = p;
    }
    *ctr = by_device[dev];
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

/* Stores D of row (b*T + t)*NH + h at a.dsum[b, h, t]. */
__device__ __forceinline__ void mt_attn_dsum_store(const mt_attn_args &a, int row, float s) {
    int h = row % a.NH, bt = row / a.NH, t = bt % a.T, b = bt / a.T;
    a.dsum[((int64_t)b * a.NH + h) * a.T + t] = s;
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
    if (lane == 0) mt_attn_dsum_store(a, row, s);
}

/* The same for bf16 rows of HD <= 128 columns, a multiple of 8, at 16-byte
 * aligned addresses: half a warp a row, 8 columns (one 16-byte load of
 * each input) a lane. */
__global__ void mt_attn_dsum_bf16x8_kernel(mt_attn_args a, int rows) {
    const int row = (int)((blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 4);
    const int c = (threadIdx.x & 15) * 8;
    float s = 0.f;
    if (row < rows && c < a.HD) {
        const uint4 x = *(const uint4 *)((const bf16 *)a.dout + (int64_t)row * a.HD + c);
        const uint4 y = *(const uint4 *)((const bf16 *)a.out + (int64_t)row * a.HD + c);
        const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&x, *yp = (const __nv_bfloat162 *)&y;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 fx = __bfloat1622float2(xp[i]), fy = __bfloat1622float2(yp[i]);
            s += fx.x * fy.x + fx.y * fy.y;
        }
    }
    for (int o = 8; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (row < rows && c == 0) mt_attn_dsum_store(a, row, s);
}

int mt_attn_launch_dsum(const mt_attn_args &a, int B, int is_bf16, cudaStream_t stream,
                        mt_error *err) {
    int rows = B * a.T * a.NH, warps = 8;
    const bool x8 = is_bf16 && a.HD % 8 == 0 && a.HD <= 128 &&
                    ((uintptr_t)a.dout | (uintptr_t)a.out) % 16 == 0;
    const int grid = (rows + warps - 1) / warps;
    if (x8) mt_attn_dsum_bf16x8_kernel<<<(grid + 1) / 2, warps * 32, 0, stream>>>(a, rows);
    else if (is_bf16) mt_attn_dsum_kernel<bf16><<<grid, warps * 32, 0, stream>>>(a, rows);
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
        return mt_errorf(err, "attention (bf16, wgmma): the driver cannot describe q, k, v, "
                              "out or dout to the TMA (error %d; device pointers must be 16-byte "
                              "aligned)", (int)r);
    return 0;
}

bool mt_attn_tma_available(void) { return encoder() != nullptr; }
