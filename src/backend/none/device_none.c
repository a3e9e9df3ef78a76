/* The GPU side of a build without CUDA: there is no GPU (device.h). */
#include "backend/device.h"

int mt_device_count(void) { return 0; }

int mt_device_memory(double *free_bytes, double *total_bytes) {
    (void)free_bytes, (void)total_bytes;
    return -1;
}

mt_backend *mt_device_backend_create(const mt_config *cfg, const mt_param_table *t,
                                     mt_host_store *store, int max_M, int64_t B, int64_t T,
                                     const mt_cuda_backend_opts *o, mt_error *err) {
    (void)cfg, (void)t, (void)store, (void)max_M, (void)B, (void)T, (void)o;
    mt_errorf(err, "this build has no CUDA support; rebuild with nvcc on the PATH, or use "
              "--device cpu");
    return NULL;
}

int mt_device_probe(mt_rates *r, const mt_config *cfg, int M, int64_t B, int64_t T, int fp32,
                    mt_error *err) {
    (void)r, (void)cfg, (void)M, (void)B, (void)T, (void)fp32;
    return mt_errorf(err, "measuring the GPU's rates needs a CUDA build and a GPU; give the "
                     "rates of a described machine (--gpu NAME or --calibration FILE)");
}

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

int mt_device_comm_probe(mt_device_comm *c, double *link_gbs, mt_error *err) {
    (void)c, (void)link_gbs;
    return mt_errorf(err, "several GPUs: this build has no CUDA support");
}

int mt_device_bench_moe_gemm(FILE *out, int bk, int stages, mt_error *err) {
    (void)out, (void)bk, (void)stages;
    return mt_errorf(err, "this build has no CUDA support");
}
