/* megatrain plan: a run that fits is planned, one that does not is refused
 * (exit 1), before anything is allocated. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "testlib.h"

static void quiet(void) { cr_redirect_stdout(); }

/* The plan sizes the CUDA backend with its own allocation plan: a build
 * without CUDA cannot plan, and says so. */
#ifdef MT_HAVE_CUDA
Test(plan, a_30b_model_fits_512_gib_with_host_gradients, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "6656", "--layers", "60", "--heads", "52", "--ffn", "17920",
                    "--vocab", "32000", "--host-ram-gb", "549", "--gpu-gb", "141", NULL};
    cr_assert_eq(mt_test_cli(argv), 0);
    fflush(stdout);
    cr_assert_stdout_neq_str("");
}
#else
Test(plan, a_build_without_cuda_refuses_to_plan, .init = quiet) {
    char *argv[] = {"plan", "--preset", "8b", NULL};
    cr_assert_eq(mt_test_cli(argv), 1);
}
#endif

Test(plan, the_same_model_on_128_gib_is_refused, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "6656", "--layers", "60", "--heads", "52", "--ffn", "17920",
                    "--vocab", "32000", "--host-ram-gb", "134", "--gpu-gb", "141", NULL};
    cr_assert_eq(mt_test_cli(argv), 1);
}

Test(plan, missing_shape_is_a_usage_error, .init = quiet) {
    char *argv[] = {"plan", "--hidden", "4096", NULL};
    cr_assert_eq(mt_test_cli(argv), 2);
}
