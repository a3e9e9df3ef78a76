/* Shared test helpers: fixture locations, error norms, random fills. */

#include "testlib.h"

#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/train_config.h"

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

/* The whole of the file at path, NUL-terminated (an empty string if it
 * cannot be read). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    for (int c; f && (c = fgetc(f)) != EOF;) fputc(c, m);
    fclose(m);
    if (f) fclose(f);
    return text;
}

int mt_test_cli_output(char *const argv[], char **out, char **err) {
    char *dir = mt_test_tmpdir(), paths[2][4200];
    int saved[2];
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < 2; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/%s", dir, k ? "stderr" : "stdout");
        int fd = open(paths[k], O_WRONLY | O_CREAT | O_TRUNC, 0600);
        saved[k] = dup(1 + k);
        if (fd >= 0) dup2(fd, 1 + k), close(fd);
    }
    int rc = mt_test_cli(argv);
    for (int k = 0; k < 2; k++) dup2(saved[k], 1 + k), close(saved[k]);
    *out = slurp(paths[0]);
    *err = slurp(paths[1]);
    mt_test_rmtree(dir);
    free(dir);
    return rc;
}

int mt_test_train_args(struct mt_train_config *tc, struct mt_error *err, const char *fmt, ...) {
    char buf[4096], *argv[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    int argc = 0;
    for (char *tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    return mt_train_config_parse_args(tc, argc, argv, err);
}
