/* Fault injection, for tests only: makes the n-th write, fsync, rename,
 * allocation, removal or disk tier stripe from now fail as the system call
 * would (ENOSPC, EIO, EIO, NULL, EIO, EIO), so that tests can prove every
 * failure path of a save leaves the previous checkpoint usable and reports
 * an error, that a removal cut short (a process killed in it) leaves no
 * incomplete checkpoint, and that a disk failure mid-run stops the run.
 *
 * Like util/signals.h this is process-global state, and has to be: the
 * call sites (mt_write_all, mt_atomic_commit, the allocators) take no
 * context, and threading one through every writer for tests would cost
 * more than the counter. Disarmed, a hit is one relaxed atomic load. */
#ifndef MT_UTIL_FAULT_H
#define MT_UTIL_FAULT_H

typedef enum mt_fault_kind {
    MT_FAULT_WRITE,   /* mt_write_all */
    MT_FAULT_FSYNC,   /* fsync of a file or a directory */
    MT_FAULT_RENAME,  /* rename of a file or a checkpoint directory */
    MT_FAULT_ALLOC,   /* mt_malloc_try, mt_aligned_alloc_try */
    MT_FAULT_REMOVE,  /* one file or directory of mt_remove_tree (a checkpoint's removal) */
    MT_FAULT_DISK,    /* one stripe of a disk tier transfer (host/disk.c): EIO */
    MT_FAULT_KINDS
} mt_fault_kind;

/* The n-th call of kind k from now fails (n >= 1); n = 0 disarms k. */
void mt_fault_arm(mt_fault_kind k, long n);

/* Called by the instrumented sites: 1 when this call must fail. */
int mt_fault_hit(mt_fault_kind k);

/* Calls of kind k left before the armed failure; 0 when disarmed or spent. */
long mt_fault_pending(mt_fault_kind k);

#endif
