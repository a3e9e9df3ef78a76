/* Prints the cuBLASLt GEMM throughput table (mt_cuda_gemm_bench) of the
 * CUDA backend. Build after `make build/libmegatrain.a` on a machine with
 * nvcc:
 *   cc -std=c11 -Isrc -I/usr/local/cuda/include -DMT_HAVE_CUDA bench/gemm_bench.c \
 *      build/libmegatrain.a -L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcudart \
 *      -lstdc++ -lm -o build/gemm_bench */
#include <stdio.h>

#include "backend/cuda/cuda_ops.h"

int main(void) {
    mt_error err;
    if (mt_cuda_gemm_bench(stdout, &err)) {
        fprintf(stderr, "gemm_bench: %s\n", err.msg);
        return 1;
    }
    return 0;
}
