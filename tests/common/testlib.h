/* Helpers shared by the CPU and GPU test binaries: where fixtures live and
 * how arrays are compared. */
#ifndef MT_TESTLIB_H
#define MT_TESTLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* A test's time limit in seconds (criterion's .timeout): s, or three times
 * s under AddressSanitizer, which runs these tests 3 to 5 times slower, two
 * at a time on the machines CI has (a disk test of 25 s alone ran past
 * 120 s there beside another). */
#if defined(__SANITIZE_ADDRESS__)
#define MT_TEST_LIMIT(s) (3.0 * (s))
#else
#define MT_TEST_LIMIT(s) (s)
#endif

/* Directory of the committed fixtures (tests/fixtures, or $MT_FIXTURES). */
const char *mt_test_fixtures_dir(void);

/* Directory of the shared data (../shared/data or $MEGATRAIN_SHARED), or
 * NULL when absent: tests that need it are then skipped, saying so. */
const char *mt_test_shared_dir(void);

/* ||a - b|| / ||b|| in double. */
double mt_test_rel_err(const float *a, const float *b, size_t n);

/* max |a - b|. */
double mt_test_max_abs_err(const float *a, const float *b, size_t n);

/* Fills x with uniform values in [lo, hi) from a fixed seed. */
void mt_test_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi);

/* A fresh temporary directory (removed by the caller with mt_test_rmtree). */
char *mt_test_tmpdir(void);
void mt_test_rmtree(const char *path);

/* Runs the megatrain binary built beside this test binary with the
 * arguments argv (NULL-terminated, argv[0] the command: "plot", ...), its
 * output going where this process's goes; returns its exit status, -1 if it
 * did not exit (a signal) or could not be started. */
int mt_test_cli(char *const argv[]);

/* The same without waiting: the child's pid (-1 if it could not start). */
pid_t mt_test_cli_start(char *const argv[]);

/* mt_test_cli with the command's stdout and stderr read back into *out and
 * *err (NUL-terminated; the caller frees both). */
int mt_test_cli_output(char *const argv[], char **out, char **err);

/* A `train` command line (printf format, words split at spaces, at most
 * 63) parsed into *tc, as the command does (mt_train_config_parse_args):
 * 0, or -1 with the reason in *err. The config keeps copies of the words. */
struct mt_train_config;
struct mt_error;
int mt_test_train_args(struct mt_train_config *tc, struct mt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
