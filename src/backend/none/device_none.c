/* The GPU side of a build without CUDA: there is no GPU (device.h). */
#include "backend/device.h"

int mt_device_count(void) { return 0; }

int mt_device_select(int index, mt_error *err) {
    return mt_errorf(err, "GPU %d: this build has no CUDA support; rebuild with nvcc on the "
                     "PATH, or use --device cpu", index);
}

int mt_device_comm_id(unsigned char id[MT_DEVICE_COMM_ID_BYTES], mt_error *err) {
    (void)id;
    return mt_errorf(err, "several GPUs: this build has no CUDA support; rebuild with nvcc on "
                     "the PATH");
}

mt_device_comm *mt_device_comm_open(const unsigned char id[MT_DEVICE_COMM_ID_BYTES], int rank,
                                    int world, mt_error *err) {
    (void)id, (void)rank, (void)world;
    mt_errorf(err, "several GPUs: this build has no CUDA support; rebuild with nvcc on the PATH");
    return NULL;
}

void mt_device_comm_close(mt_device_comm *c) { (void)c; }
