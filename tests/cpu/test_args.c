/* Command-line numbers: the whole argument must be the number. */
#include <criterion/criterion.h>

#include "util/args.h"

Test(args, whole_numbers_only) {
    int bad = 0;
    cr_assert_eq(mt_arg_ll("2048", &bad), 2048);
    cr_assert_eq(mt_arg_ll("-3", &bad), -3);
    cr_assert_float_eq(mt_arg_d("1e-5", &bad), 1e-5, 0);
    cr_assert_eq(bad, 0);
    const char *ints[] = {"", "12x", "1e3", " ", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        bad = 0;
        mt_arg_ll(ints[i], &bad);
        cr_assert_eq(bad, 1, "'%s' accepted as an integer", ints[i]);
    }
    const char *nums[] = {"", "fast", "0.1.2", "1e99999"};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        bad = 0;
        mt_arg_d(nums[i], &bad);
        cr_assert_eq(bad, 1, "'%s' accepted as a number", nums[i]);
    }
}
