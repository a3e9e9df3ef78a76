/* Tests of src/io/dtype.h: bf16/f16 conversion against known bit patterns
 * and independent oracles, every 16-bit pattern round trip, names and
 * sizes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "io/dtype.h"

static uint32_t bits_of(float f) { return mt_f32_bits(f); }

Test(dtype, bf16_known_bit_patterns) {
    cr_assert_eq(mt_f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(mt_f32_to_bf16(-2.0f), 0xC000);
    cr_assert_eq(mt_f32_to_bf16(0.0f), 0x0000);
    cr_assert_eq(mt_f32_to_bf16(-0.0f), 0x8000);
    cr_assert_eq(mt_f32_to_bf16(INFINITY), 0x7F80);
    cr_assert_eq(mt_f32_to_bf16(-INFINITY), 0xFF80);
    /* Ties go to the even mantissa: 1 + 2^-8 lies halfway between 0x3F80
     * and 0x3F81 (down to 0x3F80); 1 + 3*2^-8 between 0x3F81 and 0x3F82. */
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x3F808000)), 0x3F80);
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x3F818000)), 0x3F82);
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x3F808001)), 0x3F81);
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x3F807FFF)), 0x3F80);
    /* FLT_MAX is past the midpoint above the largest bf16: rounds to inf. */
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x7F7FFFFF)), 0x7F80);
    /* NaNs stay NaN, even a signalling one whose payload lies only in the
     * low 16 bits (plain truncation would give inf). */
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x7FC00000)), 0x7FC0);
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0xFFC00000)), 0xFFC0);
    uint16_t snan = mt_f32_to_bf16(mt_f32_from_bits(0x7F800001));
    cr_assert((snan & 0x7F80) == 0x7F80 && (snan & 0x7F) != 0, "got 0x%04x", snan);
    cr_assert_eq(mt_f32_to_bf16(mt_f32_from_bits(0x7FFFFFFF)), 0x7FFF);

    cr_assert_eq(bits_of(mt_bf16_to_f32(0x3F80)), bits_of(1.0f));
    cr_assert_eq(bits_of(mt_bf16_to_f32(0x0001)), 0x00010000u);  /* subnormal 2^-133 */
    cr_assert(isnan(mt_bf16_to_f32(0x7FC1)));
    cr_assert(isinf(mt_bf16_to_f32(0xFF80)) && mt_bf16_to_f32(0xFF80) < 0);
}

Test(dtype, f16_known_bit_patterns) {
    cr_assert_eq(bits_of(mt_f16_to_f32(0x3C00)), bits_of(1.0f));
    cr_assert_eq(mt_f16_to_f32(0x0001), ldexpf(1.0f, -24));           /* smallest subnormal */
    cr_assert_eq(mt_f16_to_f32(0x03FF), ldexpf(1023.0f, -24));        /* largest subnormal */
    cr_assert_eq(mt_f16_to_f32(0x8200), -ldexpf(1.0f, -15));
    cr_assert_eq(mt_f16_to_f32(0x0400), ldexpf(1.0f, -14));           /* smallest normal */
    cr_assert_eq(mt_f16_to_f32(0x7BFF), 65504.0f);
    cr_assert(isinf(mt_f16_to_f32(0x7C00)) && mt_f16_to_f32(0x7C00) > 0);
    cr_assert(isinf(mt_f16_to_f32(0xFC00)) && mt_f16_to_f32(0xFC00) < 0);
    cr_assert(isnan(mt_f16_to_f32(0x7E00)));
    cr_assert(isnan(mt_f16_to_f32(0x7C01)));
    cr_assert_eq(bits_of(mt_f16_to_f32(0x8000)), 0x80000000u);

    cr_assert_eq(mt_f32_to_f16(1.0f), 0x3C00);
    cr_assert_eq(mt_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(mt_f32_to_f16(65504.0f), 0x7BFF);
    cr_assert_eq(mt_f32_to_f16(65519.0f), 0x7BFF);  /* below the midpoint 65520 */
    cr_assert_eq(mt_f32_to_f16(65520.0f), 0x7C00);  /* tie, 0x7BFF is odd: to inf */
    cr_assert_eq(mt_f32_to_f16(-1e9f), 0xFC00);
    cr_assert_eq(mt_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);
    cr_assert_eq(mt_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
    cr_assert_eq(mt_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);  /* tie between 0 and 1: even */
    cr_assert_eq(mt_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);  /* tie between 1 and 2: even */
    cr_assert_eq(mt_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    cr_assert_eq(mt_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* rounds up into normals */
    cr_assert_eq(mt_f32_to_f16(1e-8f), 0x0000);
    cr_assert_eq(mt_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3C00);      /* tie: even */
    cr_assert_eq(mt_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3C02);      /* tie: even */
    cr_assert_eq(mt_f32_to_f16(INFINITY), 0x7C00);
    uint16_t nan = mt_f32_to_f16(NAN);
    cr_assert((nan & 0x7C00) == 0x7C00 && (nan & 0x3FF) != 0, "got 0x%04x", nan);
    uint16_t snan = mt_f32_to_f16(mt_f32_from_bits(0xFF800001));
    cr_assert((snan & 0xFC00) == 0xFC00 && (snan & 0x3FF) != 0, "got 0x%04x", snan);
}

/* Every 16-bit pattern survives widening and narrowing (NaNs stay NaNs). */
Test(dtype, all_16bit_patterns_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float b = mt_bf16_to_f32((uint16_t)h), f = mt_f16_to_f32((uint16_t)h);
        if (isnan(b)) cr_assert(isnan(mt_bf16_to_f32(mt_f32_to_bf16(b))));
        else cr_assert_eq(mt_f32_to_bf16(b), h, "bf16 0x%04x", h);
        if (isnan(f)) cr_assert(isnan(mt_f16_to_f32(mt_f32_to_f16(f))));
        else cr_assert_eq(mt_f32_to_f16(f), h, "f16 0x%04x", h);
    }
}

/* bf16 rounding by arithmetic instead of bit tricks: take the two bf16
 * neighbours of x and pick the nearer, the even one on a tie. */
static uint16_t bf16_oracle(float x) {
    uint32_t u = bits_of(x);
    if (isinf(x)) return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;  /* hi may be inf */
    double dlo = mt_f32_from_bits(lo), dhi;
    if ((hi & 0x7FFFFFFFu) == 0x7F800000u) {
        /* Past the largest finite bf16 the next value up is 2^128 in IEEE
         * rounding's sense: round to inf when nearer to it. */
        dhi = ldexp(x < 0 ? -1.0 : 1.0, 128);
    } else {
        dhi = mt_f32_from_bits(hi);
    }
    double dx = x, a = fabs(dx - dlo), b = fabs(dhi - dx);
    if (a < b || (a == b && ((lo >> 16) & 1) == 0)) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

/* Walks the whole fp32 range in a stride coprime to 2^32, so that every
 * exponent and many mantissa patterns (ties too, via the low-bit tweak) are
 * visited, comparing with the compiler's _Float16 and the bf16 oracle. */
Test(dtype, narrowing_matches_independent_oracles) {
    for (uint64_t k = 0; k < (1u << 22); k++) {
        uint32_t u = (uint32_t)(k * 2654435761u);
        if (k & 1) u = (u & 0xFFFF0000u) | 0x8000u;  /* exact bf16 ties */
        if (k & 2) u = (u & 0xFFFFE000u) | 0x1000u;  /* exact f16 ties */
        float x = mt_f32_from_bits(u);
        if (isnan(x)) continue;
        cr_assert_eq(mt_f32_to_bf16(x), bf16_oracle(x), "bf16 of 0x%08x", u);
#ifdef __FLT16_MAX__
        _Float16 h = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        cr_assert_eq(mt_f32_to_f16(x), hb, "f16 of 0x%08x", u);
#endif
    }
}

Test(dtype, names_and_sizes) {
    mt_dtype dt;
    cr_assert(mt_dtype_from_name("BF16", &dt) && dt == MT_DTYPE_BF16);
    cr_assert(mt_dtype_from_name("F8_E4M3", &dt) && dt == MT_DTYPE_F8_E4M3);
    cr_assert_not(mt_dtype_from_name("bf16", &dt));
    cr_assert_eq(mt_dtype_bits(MT_DTYPE_I64), 64);
    cr_assert_eq(mt_dtype_bits(MT_DTYPE_F4), 4);
    for (int i = 0; i < MT_DTYPE_COUNT; i++) {
        cr_assert(mt_dtype_from_name(mt_dtype_name((mt_dtype)i), &dt) && dt == (mt_dtype)i);
    }
}

