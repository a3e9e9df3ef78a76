/* Small file helpers shared by the readers and writers of src/io: whole-file
 * reads, complete writes, and files that appear under their final name only
 * once fully written and synced (temp name + fsync + rename + fsync dir), so
 * that a crash never leaves a half-written file where a reader looks. */
#ifndef MT_IO_FILE_H
#define MT_IO_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

/* Reads the whole file into a malloc'd buffer with a NUL after the last
 * byte (*len excludes it). Returns -1 with a message naming path. */
int mt_read_file(const char *path, char **buf, size_t *len, mt_error *err);

/* Writes all n bytes to fd, retrying short writes and EINTR; path is only
 * for the message. */
int mt_write_all(int fd, const void *buf, size_t n, const char *path, mt_error *err);

bool mt_file_exists(const char *path);

/* "dir/name" (malloc'd; aborts on out-of-memory). */
char *mt_path_join(const char *dir, const char *name);

/* A file being written under a temporary name next to its final path. */
typedef struct mt_atomic_file {
    int fd;
    char *path;   /* final name */
    char *tmp;    /* temporary name in the same directory */
} mt_atomic_file;

/* Creates path's temporary sibling (mode 0644) and opens it for writing. */
int mt_atomic_open(mt_atomic_file *f, const char *path, mt_error *err);

/* fsync, close, rename over path, fsync the directory. On failure the
 * temporary is removed and path is untouched. Frees f's names either way. */
int mt_atomic_commit(mt_atomic_file *f, mt_error *err);

/* Closes and removes the temporary; path is untouched. */
void mt_atomic_abort(mt_atomic_file *f);

/* Copies the file from to the path to (created or truncated). -1 with a
 * message naming the file that failed. */
int mt_copy_file(const char *from, const char *to, mt_error *err);

/* Removes path and everything below it, never following symlinks; an
 * instrumented site (MT_FAULT_REMOVE, util/fault.h, each file or
 * directory). Best effort: -1 (errno set) if anything stayed. */
int mt_remove_tree(const char *path);

/* Whether path is a directory. */
int mt_is_dir(const char *path);

/* rename(2), an instrumented site: an armed MT_FAULT_RENAME (util/fault.h)
 * makes it fail with EIO. */
int mt_rename(const char *from, const char *to);

/* fsync a directory, so that entries created or renamed in it survive a crash. */
int mt_fsync_dir(const char *path, mt_error *err);

/* mkdir -p path (0755), fsyncing each parent whose entry it adds. */
int mt_mkdirs(const char *path, mt_error *err);

#endif
