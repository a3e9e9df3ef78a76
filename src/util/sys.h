/* What the process asks of the system: a monotonic clock, its memory. */
#ifndef MT_UTIL_SYS_H
#define MT_UTIL_SYS_H

#include <stddef.h>

/* Seconds on a monotonic clock (for durations). */
double mt_now_s(void);

/* Resident set size of this process in bytes (0 if unknown). */
size_t mt_host_rss_bytes(void);

/* MemTotal of /proc/meminfo in bytes (0 if unknown). */
size_t mt_host_ram_total_bytes(void);

/* The host RAM a run takes by default: MemTotal less max(4 GB, 4%), left
 * to the system and the CUDA driver. */
double mt_host_ram_budget_bytes(void);

/* Host RAM this process may still take, in bytes: MemAvailable of
 * /proc/meminfo, lowered to the cgroup's memory.max and to what RLIMIT_AS
 * (ulimit -v) leaves of the address space when those are smaller. 0 if
 * unknown (callers then check nothing). */
size_t mt_host_ram_available_bytes(void);

#endif
