/* PTX wrappers of Hopper's warpgroup matrix products (sm_90a), for the
 * bf16 kernels: the shared-memory matrix descriptor of the 128-byte
 * swizzled layout, wgmma.mma_async m64nNk16 bf16 -> fp32 (N = 256, 128 and 64
 * from shared memory, N = 256, 128 and 64 with A from registers) and its
 * fences.
 * The callers compile them only where __CUDA_ARCH_FEAT_SM90_ALL is defined.
 *
 * The layout (CUDA's "128B swizzle"): an operand tile is stored as rows of
 * 128 bytes (64 bf16), in which 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8); 8 rows make a 1024-byte atom, and the tile's base is
 * 1024-byte aligned. A row runs along k (a "K-major" operand, e.g. x
 * [row][k]) or along m or n ("MN-major", e.g. W [k][n] read as B(k, n)).
 *   K-major:  rows are m (or n), 64 k each; the atoms of 8 rows follow one
 *             another (stride 1024). A k slice of 16 starts 32 bytes later.
 *   MN-major: rows are k, 64 m (or n) each; blocks of 64 m (or n) are
 *             lbo bytes apart, atoms of 8 k rows 1024. A k slice of 16
 *             starts 2048 bytes later. */
#ifndef MT_KERNELS_WGMMA_PTX_CUH
#define MT_KERNELS_WGMMA_PTX_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_common.h"

/* Host side: whether the current device runs this build's sm_90a code
 * (compute capability 9.0, a build with MT_CUDA_SM90A) and lets a block
 * have smem bytes of shared memory. False with no usable device (memory
 * plans are made on machines without one). */
inline bool mt_wg_device_fits(size_t smem) {
#ifdef MT_CUDA_SM90A
    int dev, major, minor, optin;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return major == 9 && minor == 0 && (size_t)optin >= smem;
#else
    (void)smem;
    return false;
#endif
}

/* Byte offset of 16-byte chunk c (0..7) of 128-byte row r in a swizzled
 * tile. */
__device__ __forceinline__ unsigned mt_wg_swz(int r, int c) {
    return (unsigned)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* The descriptor of a swizzled operand at shared address saddr (the k
 * slice's start): lbo, the bytes between MN blocks of 64 (MN-major; unused
 * K-major), and 1024 between atoms of 8 rows. */
__device__ __forceinline__ uint64_t mt_wg_desc(unsigned saddr, unsigned lbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFFu) << 16 |
           (uint64_t)(1024u >> 4) << 32 | 1ull << 62;
}

/* The descriptor d (mt_wg_desc) moved on by bytes (a multiple of 16): the
 * start address field alone changes, by a 32-bit add that cannot carry out
 * of it while the address stays inside shared memory (under 256 KB). One
 * add a product instead of building each descriptor anew. */
__device__ __forceinline__ uint64_t mt_wg_desc_add(uint64_t d, unsigned bytes) {
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

/* Orders this thread's register and shared-memory accesses before the
 * warpgroup's next products. */
__device__ __forceinline__ void mt_wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mt_wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Waits until at most N committed groups of products are in flight. */
template <int N> __device__ __forceinline__ void mt_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Makes shared memory written by the generic proxy (stores, cp.async)
 * visible to the products, which read through the async proxy. */
__device__ __forceinline__ void mt_wg_fence_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving reads or writes of v across the
 * asynchronous products that update it. */
__device__ __forceinline__ void mt_wg_fence_reg(float &v) { asm volatile("" : "+f"(v)::"memory"); }

/* The accumulator operands the products below share: an m64nNk16
 * product's N/2 fp32 values a thread are PTX operands %0 .. %(N/2 - 1),
 * listed in the instruction by MT_WG_REGS<N/2> and bound to d[0 .. N/2 - 1]
 * by MT_WG_ACC<N/2>; a wrapper's other operands are numbered after them. */
#define MT_WG_REGS32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, " \
    "%8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31"
#define MT_WG_REGS64 MT_WG_REGS32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63"
#define MT_WG_REGS128 MT_WG_REGS64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, " \
    "%72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, " \
    "%88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, " \
    "%104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, " \
    "%120, %121, %122, %123, %124, %125, %126, %127"
#define MT_WG_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MT_WG_ACC32 \
    MT_WG_ACC8(0), MT_WG_ACC8(8), MT_WG_ACC8(16), MT_WG_ACC8(24)
#define MT_WG_ACC64 \
    MT_WG_ACC32, MT_WG_ACC8(32), MT_WG_ACC8(40), MT_WG_ACC8(48), MT_WG_ACC8(56)
#define MT_WG_ACC128 \
    MT_WG_ACC64, MT_WG_ACC8(64), MT_WG_ACC8(72), MT_WG_ACC8(80), MT_WG_ACC8(88), \
        MT_WG_ACC8(96), MT_WG_ACC8(104), MT_WG_ACC8(112), MT_WG_ACC8(120)

/* d (64 x 256 fp32, the warpgroup's: thread t of warp w holds rows
 * 16w + t/4 and 16w + t/4 + 8, columns 8j + 2(t%4) and +1 of block j at
 * d[4j..4j+3]) += A (64 x 16) B (16 x 256), bf16, from descriptors.
 * TA, TB: 0 for a K-major operand, 1 for an MN-major one. */
template <int TA, int TB>
__device__ __forceinline__ void mt_wg_mma_64x256(float d[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %132, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MT_WG_REGS128
        "}, %128, %129, p, 1, 1, %130, %131;\n"
        "}\n"
        : MT_WG_ACC128
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(1));
}

/* d (64 x 128 fp32, 64 registers a thread, laid out as for the 64 x 256
 * product) += A (64 x 16) B (16 x 128), both from shared-memory descriptors;
 * with accumulate 0, d = A B (d's old values are not read). */
template <int TA, int TB>
__device__ __forceinline__ void mt_wg_mma_64x128_ss(float d[64], uint64_t da, uint64_t db,
                                                    int accumulate = 1) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %68, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MT_WG_REGS64
        "}, %64, %65, p, 1, 1, %66, %67;\n"
        "}\n"
        : MT_WG_ACC64
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(accumulate));
}

/* d (64 x 64 fp32, 32 registers a thread, laid out as for the 64 x 256
 * product) += A (64 x 16) B (16 x 64), both from shared-memory descriptors;
 * with accumulate 0, d = A B (d's old values are not read). */
template <int TA, int TB>
__device__ __forceinline__ void mt_wg_mma_64x64_ss(float d[32], uint64_t da, uint64_t db,
                                                    int accumulate = 1) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %36, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT_WG_REGS32
        "}, %32, %33, p, 1, 1, %34, %35;\n"
        "}\n"
        : MT_WG_ACC32
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(accumulate));
}

/* d (64 x 128 fp32, 64 registers a thread) += A (64 x 16, from registers: the
 * warp's 16 rows as an mma.sync m16n8k16 A fragment) B (16 x 128, from a
 * shared-memory descriptor). */
template <int TB>
__device__ __forceinline__ void mt_wg_mma_64x128_rs(float d[64], const unsigned a[4], uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %70, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MT_WG_REGS64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n"
        "}\n"
        : MT_WG_ACC64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}

/* d (64 x 64 fp32, 32 registers a thread) += A (64 x 16, from registers: the
 * warp's 16 rows as an mma.sync m16n8k16 A fragment) B (16 x 64, from a
 * shared-memory descriptor). */
template <int TB>
__device__ __forceinline__ void mt_wg_mma_64x64_rs(float d[32], const unsigned a[4], uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT_WG_REGS32
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
        "}\n"
        : MT_WG_ACC32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}

/* d (64 x 256 fp32, 128 registers a thread, laid out as for mt_wg_mma_64x256)
 * += A (64 x 16, from registers: the warp's 16 rows as an mma.sync m16n8k16
 * A fragment) B (16 x 256, from a shared-memory descriptor). */
template <int TB>
__device__ __forceinline__ void mt_wg_mma_64x256_rs(float d[128], const unsigned a[4], uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %134, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MT_WG_REGS128
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, %133;\n"
        "}\n"
        : MT_WG_ACC128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}

#endif
