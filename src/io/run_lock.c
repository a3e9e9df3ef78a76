/* The run-directory lock: flock on <out>/.megatrain.lock plus the holder's
 * pid and command, written after the lock is taken. */
#include "io/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"

/* "pid 1234 (megatrain train)" from the lock file, or a vaguer phrase when
 * the holder has not written it yet. */
static void describe_holder(int fd, char *buf, size_t cap) {
    char text[256];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    long pid = 0;
    char what[128] = "";
    if (n > 0) {
        text[n] = 0;
        if (sscanf(text, "%ld %127[^\n]", &pid, what) < 1) pid = 0;
    }
    if (pid > 0) snprintf(buf, cap, "process %ld (%s)", pid, what[0] ? what : "megatrain");
    else snprintf(buf, cap, "another process (it has not written its pid yet)");
}

int mt_run_lock_acquire(mt_run_lock *l, const char *out_dir, const char *what, mt_error *err) {
    l->fd = -1;
    if (mt_mkdirs(out_dir, err)) return -1;
    char *path = mt_path_join(out_dir, MT_RUN_LOCK_FILE);
    /* never through a link: the pid written into it would overwrite the
     * file it points to */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    int rc = 0;
    struct stat st;
    if (fd < 0 && errno == ELOOP) {
        rc = mt_errorf(err, "%s: the run lock is a symbolic link, which megatrain does not "
                       "follow (writing the pid would overwrite what it points to); remove it",
                       path);
    } else if (fd < 0) {
        rc = mt_errorf(err, "%s: cannot open the run lock: %s (is the out directory writable?)",
                       path, strerror(errno));
    } else if (fstat(fd, &st) != 0) {
        rc = mt_errorf(err, "%s: cannot stat the run lock: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
        rc = mt_errorf(err, "%s: the run lock is not a file of its own (%s); remove it",
                       path, !S_ISREG(st.st_mode) ? "not a regular file"
                                                  : "a hard link to another file");
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[200];
        if (errno == EWOULDBLOCK) {
            describe_holder(fd, holder, sizeof holder);
            rc = mt_errorf(err, "%s is in use by %s: two runs must not write one directory; "
                           "wait for it to finish, stop it, or pass another --out", out_dir,
                           holder);
        } else {
            rc = mt_errorf(err, "%s: cannot lock: %s (a file system without flock? use a "
                           "local directory for --out)", path, strerror(errno));
        }
    } else {
        char text[192];
        int n = snprintf(text, sizeof text, "%ld %s\n", (long)getpid(), what);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
            fprintf(stderr, "megatrain: warning: %s: cannot record the pid: %s\n", path,
                    strerror(errno));
        l->fd = fd;
    }
    if (rc && fd >= 0) close(fd);
    free(path);
    return rc;
}

void mt_run_lock_release(mt_run_lock *l) {
    if (l->fd < 0) return;
    close(l->fd);  /* closing the only descriptor drops the flock */
    l->fd = -1;
}
