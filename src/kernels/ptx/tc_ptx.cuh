/* PTX wrappers of the bf16 tensor-core kernels (attention, grouped expert
 * products) for sm_80 and later: shared-memory addresses, cp.async copies,
 * ldmatrix and mma.sync m16n8k16 bf16 -> fp32. Included by .cu files only. */
#ifndef MT_KERNELS_TC_PTX_CUH
#define MT_KERNELS_TC_PTX_CUH

#include <cuda_bf16.h>

__device__ __forceinline__ unsigned mt_tc_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; when !valid the destination is zero-filled. */
__device__ __forceinline__ void mt_tc_cp16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mt_tc_smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
/* 4-byte async copy (zero-filled when !valid). */
__device__ __forceinline__ void mt_tc_cp4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mt_tc_smem_addr(dst)),
                 "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void mt_tc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void mt_tc_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mt_tc_ldsm(unsigned r[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt_tc_smem_addr(p)));
}
__device__ __forceinline__ void mt_tc_ldsm_t(unsigned r[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt_tc_smem_addr(p)));
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). */
__device__ __forceinline__ void mt_tc_mma(float c[4], const unsigned a[4], unsigned b0,
                                            unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c (16x16 fp32 as two 16x8 fragments c[0], c[1]) += a (16x16 bf16, row) *
 * b (16x16 bf16, col; b[0..1] its columns 0-7, b[2..3] 8-15, as one x4
 * ldmatrix loads them). */
__device__ __forceinline__ void mt_tc_mma_n16(float c[2][4], const unsigned a[4],
                                              const unsigned b[4]) {
    mt_tc_mma(c[0], a, b[0], b[1]);
    mt_tc_mma(c[1], a, b[2], b[3]);
}

#endif
