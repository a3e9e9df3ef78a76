/* Tests of the error and allocation helpers. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "util/error.h"
#include "util/mem.h"

Test(util, errorf_formats_and_returns_minus_one) {
    mt_error err;
    cr_assert_eq(mt_errorf(&err, "bad %s at %d", "x", 3), -1);
    cr_assert_str_eq(err.msg, "bad x at 3");
    mt_error_prefix(&err, "loading %s: ", "f");
    cr_assert_str_eq(err.msg, "loading f: bad x at 3");
}

Test(util, mul_size_detects_overflow) {
    size_t out;
    cr_assert(mt_mul_size(1u << 20, 1u << 20, &out));
    cr_assert_eq(out, (size_t)1 << 40);
    cr_assert_not(mt_mul_size(SIZE_MAX / 2, 3, &out));
}
