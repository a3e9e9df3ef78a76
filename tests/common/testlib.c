/* Shared test helpers: fixture locations, error norms, random fills. */

#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *mt_test_fixtures_dir(void) {
    const char *env = getenv("MT_FIXTURES");
    return env && *env ? env : "tests/fixtures";
}

const char *mt_test_shared_dir(void) {
    static char buf[4096];
    const char *env = getenv("MEGATRAIN_SHARED");
    const char *cand = env && *env ? env : "../shared/data";
    struct stat st;
    if (stat(cand, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    snprintf(buf, sizeof buf, "%s", cand);
    return buf;
}

double mt_test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double mt_test_max_abs_err(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

void mt_test_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 40) / 16777216.0);
    }
}

char *mt_test_tmpdir(void) {
    char *p = strdup("/tmp/megatrain-test-XXXXXX");
    if (!p || !mkdtemp(p)) { perror("mkdtemp"); abort(); }
    return p;
}

void mt_test_rmtree(const char *path) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

pid_t mt_test_cli_start(char *const argv[]) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    if (n <= 0) return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    strcpy(slash ? slash + 1 : exe, "megatrain");
    char *args[64];
    size_t argc = 0;
    args[argc++] = exe;
    for (size_t i = 0; argv[i] && argc < 63; i++) args[argc++] = argv[i];
    args[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execv(exe, args);
        _exit(127);
    }
    return pid;
}

int mt_test_cli(char *const argv[]) {
    pid_t pid = mt_test_cli_start(argv);
    if (pid < 0) return -1;
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}
