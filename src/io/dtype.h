/* Element types of tensors on disk and the fp32 <-> bf16/f16 conversions.
 *
 * megatrain computes in fp32; checkpoints arrive as F32, BF16 or F16 and the
 * GPU upload, checkpoint save and safetensors writer all narrow fp32 to
 * bf16/f16. The scalar converters are inline, pure bit manipulation (no
 * hardware half type), so they give the same bits on every machine and can
 * be used from host code compiled by nvcc. Rounding is round-to-nearest-even
 * as in PyTorch's .to(torch.bfloat16) / .to(torch.float16); NaN stays NaN. */
#ifndef MT_IO_DTYPE_H
#define MT_IO_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Every dtype of the safetensors format. megatrain reads the first five;
 * the others can be listed (their sizes are known) but not converted. */
typedef enum mt_dtype {
    MT_DTYPE_F32,
    MT_DTYPE_BF16,
    MT_DTYPE_F16,
    MT_DTYPE_I32,
    MT_DTYPE_I64,
    MT_DTYPE_F64,
    MT_DTYPE_I8,
    MT_DTYPE_U8,
    MT_DTYPE_I16,
    MT_DTYPE_U16,
    MT_DTYPE_U32,
    MT_DTYPE_U64,
    MT_DTYPE_BOOL,
    MT_DTYPE_F8_E4M3,
    MT_DTYPE_F8_E5M2,
    MT_DTYPE_F8_E8M0,
    MT_DTYPE_C64,
    MT_DTYPE_F4,        /* sub-byte: 4 bits per element */
    MT_DTYPE_F6_E2M3,   /* sub-byte: 6 bits per element */
    MT_DTYPE_F6_E3M2,
    MT_DTYPE_COUNT
} mt_dtype;

/* Name as written in a safetensors header ("F32", "BF16", ...). */
const char *mt_dtype_name(mt_dtype dt);

/* Parses a header dtype name; false if it is not a safetensors dtype. */
bool mt_dtype_from_name(const char *name, mt_dtype *out);

/* Bits per element (4 and 6 for the sub-byte float formats). */
int mt_dtype_bits(mt_dtype dt);

/* True for F32, BF16, F16: the dtypes megatrain converts to fp32. */
static inline bool mt_dtype_is_float(mt_dtype dt) {
    return dt == MT_DTYPE_F32 || dt == MT_DTYPE_BF16 || dt == MT_DTYPE_F16;
}

static inline uint32_t mt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float mt_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of an fp32: widening is exact. */
static inline float mt_bf16_to_f32(uint16_t h) {
    return mt_f32_from_bits((uint32_t)h << 16);
}

/* Round-to-nearest-even; overflow rounds to inf as IEEE requires; a NaN
 * keeps its sign and top payload bits and is forced quiet, so it can never
 * turn into inf by truncation. */
static inline uint16_t mt_f32_to_bf16(float f) {
    uint32_t u = mt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Exact: every f16 (subnormals, inf, NaN payloads included) is an fp32. */
static inline float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return mt_f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return mt_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return mt_f32_from_bits(sign);
    /* Subnormal mant * 2^-24: shift the leading 1 up to the implicit bit,
     * lowering the exponent once per shift (113 = bias 127 - 14). */
    uint32_t e = 113;
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return mt_f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

/* Round-to-nearest-even to f16: |x| >= 65520 (halfway past the largest f16,
 * 65504) becomes inf, values below 2^-14 become subnormals or zero. */
static inline uint16_t mt_f32_to_f16(float f) {
    uint32_t u = mt_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                       /* normal f16 */
        uint32_t h = (a >> 13) - (112u << 10);    /* rebias exponent 127 -> 15 */
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (a < 0x33000000u) return sign;             /* below 2^-25: rounds to 0 */
    /* Subnormal: result = round(x * 2^24) = round(m * 2^(e - 126)). */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t s = 126u - e;                        /* 14..24 */
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* Array forms of the above (multi-threaded for large n). */
void mt_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);
void mt_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
void mt_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);
void mt_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);

#endif
