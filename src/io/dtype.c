/* dtype names and sizes, and the array forms of the fp32 <-> bf16/f16
 * conversions declared in dtype.h. */
#include "io/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    int bits;
} dtype_table[MT_DTYPE_COUNT] = {
    [MT_DTYPE_F32] = {"F32", 32},         [MT_DTYPE_BF16] = {"BF16", 16},
    [MT_DTYPE_F16] = {"F16", 16},         [MT_DTYPE_I32] = {"I32", 32},
    [MT_DTYPE_I64] = {"I64", 64},         [MT_DTYPE_F64] = {"F64", 64},
    [MT_DTYPE_I8] = {"I8", 8},            [MT_DTYPE_U8] = {"U8", 8},
    [MT_DTYPE_I16] = {"I16", 16},         [MT_DTYPE_U16] = {"U16", 16},
    [MT_DTYPE_U32] = {"U32", 32},         [MT_DTYPE_U64] = {"U64", 64},
    [MT_DTYPE_BOOL] = {"BOOL", 8},        [MT_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [MT_DTYPE_F8_E5M2] = {"F8_E5M2", 8},  [MT_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [MT_DTYPE_C64] = {"C64", 64},         [MT_DTYPE_F4] = {"F4", 4},
    [MT_DTYPE_F6_E2M3] = {"F6_E2M3", 6},  [MT_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
};

const char *mt_dtype_name(mt_dtype dt) {
    return (unsigned)dt < MT_DTYPE_COUNT ? dtype_table[dt].name : "?";
}

bool mt_dtype_from_name(const char *name, mt_dtype *out) {
    for (int i = 0; i < MT_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (mt_dtype)i;
            return true;
        }
    }
    return false;
}

int mt_dtype_bits(mt_dtype dt) {
    return (unsigned)dt < MT_DTYPE_COUNT ? dtype_table[dt].bits : 0;
}

/* Below this many elements a thread team costs more than it saves. */
#define PAR_MIN ((size_t)1 << 18)

/* Each array conversion applies its scalar one, in parallel when large. */
#define CONVERT_ARRAY(name, in_t, out_t, one)                         \
    void name(const in_t *src, out_t *dst, size_t n) {                \
        _Pragma("omp parallel for schedule(static) if (n >= PAR_MIN)") \
        for (size_t i = 0; i < n; i++) dst[i] = one(src[i]);          \
    }

CONVERT_ARRAY(mt_bf16_to_f32_array, uint16_t, float, mt_bf16_to_f32)
CONVERT_ARRAY(mt_f16_to_f32_array, uint16_t, float, mt_f16_to_f32)
CONVERT_ARRAY(mt_f32_to_bf16_array, float, uint16_t, mt_f32_to_bf16)
CONVERT_ARRAY(mt_f32_to_f16_array, float, uint16_t, mt_f32_to_f16)
