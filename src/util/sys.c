/* Monotonic time and resident memory, for progress lines and benchmarks. */
#include "util/sys.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

double mt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t mt_host_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

/* The value of "key" in a "key value" file, in bytes (unit kB when given). */
static size_t read_kv_bytes(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    size_t v = 0, n = strlen(key);
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long x;
        char unit[8] = "";
        if (strncmp(line, key, n) == 0 && sscanf(line + n, " %llu %7s", &x, unit) >= 1) {
            v = (size_t)x * (strcmp(unit, "kB") == 0 ? 1024 : 1);
            break;
        }
    }
    if (f) fclose(f);
    return v;
}

size_t mt_host_ram_total_bytes(void) { return read_kv_bytes("/proc/meminfo", "MemTotal:"); }

double mt_host_ram_budget_bytes(void) {
    double total = (double)mt_host_ram_total_bytes();
    double keep = 0.04 * total > 4e9 ? 0.04 * total : 4e9;
    return total - keep;
}

/* What RLIMIT_AS (ulimit -v) leaves to this process: the limit less the
 * address space it holds now; SIZE_MAX without a limit. */
static size_t address_space_left(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_AS, &lim) || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0;
    if (f) {
        if (fscanf(f, "%ld", &pages) != 1) pages = 0;
        fclose(f);
    }
    size_t held = (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
    return lim.rlim_cur > held ? (size_t)lim.rlim_cur - held : 0;
}

size_t mt_host_ram_available_bytes(void) {
    size_t avail = read_kv_bytes("/proc/meminfo", "MemAvailable:");
    size_t as_left = address_space_left();
    if (as_left != SIZE_MAX && (!avail || as_left < avail)) avail = as_left ? as_left : 1;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    unsigned long long lim;
    if (f) {
        if (fscanf(f, "%llu", &lim) == 1) {  /* "max" reads as no limit */
            size_t used = read_kv_bytes("/sys/fs/cgroup/memory.current", "");
            size_t left = lim > used ? (size_t)lim - used : 0;
            if (!avail || left < avail) avail = left;
        }
        fclose(f);
    }
    return avail;
}
