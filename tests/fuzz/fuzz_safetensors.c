/* safetensors: header parse (mt_st_open) and reads of every tensor it accepts. */
#include "fuzz_util.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_st_file f;
    mt_error err;
    if (mt_st_open(&f, fuzz_file("model.safetensors", data, size), &err)) return 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const mt_st_tensor_info *t = &f.tensors[i];
        if (mt_st_find(&f, t->name) == NULL) abort();
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        if (n <= 4096) {
            float buf[4096];
            mt_st_read_f32(t, buf, n, &err);
        }
    }
    mt_st_meta(&f, "format");
    mt_st_close(&f);
    return 0;
}
