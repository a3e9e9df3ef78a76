/* Prints the cuBLASLt GEMM throughput table (mt_cuda_gemm_bench,
 * bench/kernels/gemm_bench.cu) of the CUDA backend. On a machine with nvcc:
 *   make build/gemm_bench && build/gemm_bench */
#include <stdio.h>

#include "kernels/cuda_ops.h"

int main(void) {
    mt_error err;
    if (mt_cuda_gemm_bench(stdout, &err)) {
        fprintf(stderr, "gemm_bench: %s\n", err.msg);
        return 1;
    }
    return 0;
}
