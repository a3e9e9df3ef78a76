/* The GPU side of a CUDA build (device.h): GPUs through the CUDA runtime,
 * the communicator through NCCL (nccl.h). */
#include "backend/device.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda_ops.h"
#include "backend/cuda/nccl.h"

_Static_assert(MT_DEVICE_COMM_ID_BYTES == MT_NCCL_ID_BYTES, "one id");

int mt_device_count(void) { return mt_cuda_device_count(); }

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
