/* File helpers: whole-file read, write-all, atomic replace. */
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/mem.h"

/* fsync, or the injected failure of util/fault.h */
static int fsync_fault(int fd) {
    if (mt_fault_hit(MT_FAULT_FSYNC)) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

int mt_rename(const char *from, const char *to) {
    if (mt_fault_hit(MT_FAULT_RENAME)) {
        errno = EIO;
        return -1;
    }
    return rename(from, to);
}

int mt_read_file(const char *path, char **buf, size_t *len, mt_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *p = mt_malloc_or_die(cap);
    for (;;) {
        if (n + 1 >= cap) p = mt_realloc_or_die(p, cap *= 2);
        size_t got = fread(p + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(p);
        return mt_errorf(err, "%s: read error", path);
    }
    p[n] = '\0';
    *buf = p;
    *len = n;
    return 0;
}

int mt_write_all(int fd, const void *buf, size_t n, const char *path, mt_error *err) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = mt_fault_hit(MT_FAULT_WRITE) ? (errno = ENOSPC, -1)
                                                 : write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0)
            return mt_errorf(err, "%s: write failed: %s (disk full?)", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

bool mt_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

char *mt_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = mt_malloc_or_die(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int mt_atomic_open(mt_atomic_file *f, const char *path, mt_error *err) {
    f->path = mt_strdup_or_die(path);
    f->tmp = mt_malloc_or_die(strlen(path) + 16);
    sprintf(f->tmp, "%s.tmp-XXXXXX", path);
    f->fd = mkstemp(f->tmp);
    if (f->fd < 0) {
        int e = errno;
        free(f->path);
        free(f->tmp);
        return mt_errorf(err, "%s: cannot create a file next to it: %s", path, strerror(e));
    }
    fchmod(f->fd, 0644);  /* mkstemp makes 0600; checkpoints are meant to be shared */
    return 0;
}

static int fsync_parent_dir(const char *path, mt_error *err) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    MT_ASSERT(dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    int rc = 0;
    if (fd < 0 || fsync_fault(fd) != 0)
        rc = mt_errorf(err, "%s: cannot sync directory: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int mt_atomic_commit(mt_atomic_file *f, mt_error *err) {
    int rc = 0;
    if (fsync_fault(f->fd) != 0)
        rc = mt_errorf(err, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && rc == 0)
        rc = mt_errorf(err, "%s: close failed: %s", f->tmp, strerror(errno));
    if (rc == 0 && mt_rename(f->tmp, f->path) != 0)
        rc = mt_errorf(err, "%s: cannot rename %s over it: %s", f->path, f->tmp, strerror(errno));
    if (rc != 0) unlink(f->tmp);
    else rc = fsync_parent_dir(f->path, err);
    free(f->path);
    free(f->tmp);
    return rc;
}

void mt_atomic_abort(mt_atomic_file *f) {
    close(f->fd);
    unlink(f->tmp);
    free(f->path);
    free(f->tmp);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    if (mt_fault_hit(MT_FAULT_REMOVE)) {
        errno = EIO;
        return 1;
    }
    return remove(path) != 0 && errno != ENOENT;
}

int mt_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

int mt_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mt_fsync_dir(const char *path, mt_error *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    int rc = 0;
    if (fd < 0 || fsync_fault(fd) != 0)
        rc = mt_errorf(err, "%s: cannot sync directory: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
}

int mt_mkdirs(const char *path, mt_error *err) {
    if (mt_is_dir(path)) return 0;
    char *p = mt_strdup_or_die(path);
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) == 0) {
            char *parent = mt_strdup_or_die(p);
            char *slash = strrchr(parent, '/');
            if (slash) slash[slash == parent] = '\0';
            rc = mt_fsync_dir(slash ? parent : ".", err);
            free(parent);
        } else if (errno != EEXIST || !mt_is_dir(p)) {
            rc = mt_errorf(err, "%s: cannot create directory: %s", p,
                           errno == EEXIST ? "it exists but is not a directory" : strerror(errno));
        }
        *s = c;
        if (c == '\0') break;
    }
    free(p);
    return rc;
}


int mt_copy_file(const char *from, const char *to, mt_error *err) {
    FILE *a = fopen(from, "rb");
    if (!a) return mt_errorf(err, "%s: cannot open: %s", from, strerror(errno));
    FILE *b = fopen(to, "wb");
    if (!b) {
        fclose(a);
        return mt_errorf(err, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = mt_errorf(err, "%s: write failed (disk full?)", to);
    if (rc == 0 && ferror(a)) rc = mt_errorf(err, "%s: read error", from);
    fclose(a);
    if (fclose(b) && rc == 0) rc = mt_errorf(err, "%s: write failed (disk full?)", to);
    return rc;
}
