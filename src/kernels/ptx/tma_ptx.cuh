/* PTX wrappers of Hopper's asynchronous machinery (sm_90a), for the
 * warp-specialised kernels: shared-memory barriers (mbarrier) with
 * transaction counts, tensor-memory-accelerator loads (TMA) that complete
 * on them, named barriers between warpgroups, and the per-warpgroup
 * register budget. Compiled only where __CUDA_ARCH_FEAT_SM90_ALL is defined.
 * Barrier and buffer arguments are shared-state-space addresses
 * (mt_tc_smem_addr). */
#ifndef MT_KERNELS_TMA_PTX_CUH
#define MT_KERNELS_TMA_PTX_CUH

#include <cuda.h> /* CUtensorMap */
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* A barrier that completes a phase when count threads have arrived (and
 * the expected transaction bytes have landed). One thread initialises;
 * mt_mb_fence_init and a block barrier publish it. */
__device__ __forceinline__ void mt_mb_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mt_mb_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* Arrives, and adds bytes to the transactions the current phase waits for. */
__device__ __forceinline__ void mt_mb_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mt_mb_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of the given parity (0 for the first, 1 for the
 * second, ...) has completed. */
__device__ __forceinline__ void mt_mb_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* Starts the TMA copy of the box at coordinates (c0..c3) of the tensor that
 * map describes into shared memory at dst; its bytes complete on bar. */
__device__ __forceinline__ void mt_tma_load4(unsigned dst, const CUtensorMap *map, int c0, int c1,
                                             int c2, int c3, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

/* Starts the TMA copy of the box at src in shared memory to coordinates
 * (c0..c3) of the tensor that map describes (the parts of the box outside
 * the tensor are not written), in this thread's current bulk group. The
 * threads that wrote src make it visible to the copy first: each a
 * fence.proxy.async (mt_wg_fence_smem), then a barrier among them. */
__device__ __forceinline__ void mt_tma_store4(const CUtensorMap *map, unsigned src, int c0, int c1,
                                              int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"((uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* Closes this thread's current bulk group of stores. */
__device__ __forceinline__ void mt_tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Waits until this thread's bulk groups have read their shared memory
 * (READ: the buffers may be written again) or have completed. */
template <bool READ> __device__ __forceinline__ void mt_tma_store_wait() {
    if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* Named barrier id (1..15; 0 is __syncthreads) of n threads: sync waits for
 * n arrivals including its own, arrive only counts. */
__device__ __forceinline__ void mt_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void mt_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The warpgroup's registers a thread: raised for the consumers, lowered for
 * a producer (all four warps execute it). */
template <int N> __device__ __forceinline__ void mt_wg_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void mt_wg_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

#endif
