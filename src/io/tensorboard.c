/* TensorBoard event files: TFRecord framing around Event messages encoded
 * with protobuf-c; see tensorboard.h. */
#include "io/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "io/file.h"
#include "io/tensorboard.pb-c.h"
#include "util/mem.h"

struct mt_tb_writer {
    int fd;  /* -1: not open */
    char *path;
};

uint32_t mt_crc32c(const void *p, size_t n) {
    /* crc32_iscsi takes an int length: feed it in pieces */
    uint32_t crc = 0xFFFFFFFFu;
    const unsigned char *b = p;
    while (n) {
        int k = n > (1u << 30) ? 1 << 30 : (int)n;
        crc = crc32_iscsi((unsigned char *)b, k, crc);
        b += k, n -= (size_t)k;
    }
    return ~crc;
}

uint32_t mt_tb_mask_crc(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* One TFRecord: length, its masked CRC, the data, its masked CRC, in one
 * write. A failed write (disk full) leaves no part of the record: a torn
 * one would end the file for every reader. */
static int write_record(mt_tb_writer *w, const void *data, size_t n, mt_error *err) {
    unsigned char *rec = mt_malloc_or_die(n + 16);
    uint64_t len = n;
    memcpy(rec, &len, 8);  // little-endian hosts (as every reader of .mtok assumes too)
    uint32_t c = mt_tb_mask_crc(mt_crc32c(rec, 8)), d = mt_tb_mask_crc(mt_crc32c(data, n));
    memcpy(rec + 8, &c, 4);
    memcpy(rec + 12, data, n);
    memcpy(rec + 12 + n, &d, 4);
    struct stat st;
    int rc = 0;
    if (fstat(w->fd, &st) != 0) {
        rc = mt_errorf(err, "tensorboard: '%s': %s", w->path, strerror(errno));
    } else if (mt_write_all(w->fd, rec, n + 16, w->path, err)) {
        if (ftruncate(w->fd, st.st_size) != 0)
            mt_error_prefix(err, "(and cutting its partial record off failed: %s) ",
                            strerror(errno));
        rc = mt_error_prefix(err, "tensorboard: ");
    }
    free(rec);
    return rc;
}

static int write_event(mt_tb_writer *w, const Tensorboard__Event *ev, mt_error *err) {
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *buf = mt_malloc_or_die(n ? n : 1);
    MT_ASSERT(tensorboard__event__pack(ev, buf) == n);
    int rc = write_record(w, buf, n, err);
    free(buf);
    return rc;
}

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* A new file events.out.tfevents.<time>.<host>[.k] in dir. */
static int create_file(mt_tb_writer *w, const char *dir, mt_error *err) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    size_t cap = strlen(dir) + strlen(host) + 64;
    w->path = mt_malloc_or_die(cap);
    for (int k = 0; k < 1000; k++) {
        int n = snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s", dir,
                         (long long)time(NULL), host);
        if (k) snprintf(w->path + n, cap - (size_t)n, ".%d", k);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (w->fd >= 0) return 0;
        if (errno != EEXIST) break;
    }
    return mt_errorf(err, "tensorboard: creating '%s': %s (is the out directory writable?)",
                     w->path, strerror(errno));
}

mt_tb_writer *mt_tb_open(const char *dir, int64_t restart_step, mt_error *err) {
    if (mt_mkdirs(dir, err)) return NULL;
    mt_tb_writer *w = mt_calloc_or_die(1, sizeof *w);
    w->fd = -1;
    if (create_file(w, dir, err)) {
        mt_tb_close(w);
        return NULL;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = now_s();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    int rc = write_event(w, &ev, err);
    if (!rc && restart_step >= 1) {
        Tensorboard__SessionLog log = TENSORBOARD__SESSION_LOG__INIT;
        log.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
        ev.step = restart_step;
        ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
        ev.session_log = &log;
        rc = write_event(w, &ev, err);
    }
    if (rc) {
        unlink(w->path);  /* a file without its version event is no event file */
        mt_tb_close(w);
        return NULL;
    }
    return w;
}

int mt_tb_write_scalars(mt_tb_writer *w, int64_t step, const mt_tb_scalar *s, size_t n,
                        mt_error *err) {
    Tensorboard__Summary__Value *vals = mt_calloc_or_die(n ? n : 1, sizeof *vals);
    Tensorboard__Summary__Value **ptrs = mt_calloc_or_die(n ? n : 1, sizeof *ptrs);
    for (size_t i = 0; i < n; i++) {
        tensorboard__summary__value__init(&vals[i]);
        vals[i].tag = (char *)s[i].tag;
        vals[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = s[i].value;
        ptrs[i] = &vals[i];
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = now_s();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = write_event(w, &ev, err);
    free(vals);
    free(ptrs);
    return rc;
}

const char *mt_tb_path(const mt_tb_writer *w) { return w->path; }

int mt_tb_finish(mt_tb_writer *w, mt_error *err) {
    int rc = 0;
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        if (err) mt_errorf(err, "tensorboard: '%s': %s (disk full?)", w->path, strerror(errno));
        rc = -1;
    }
    w->fd = -1;
    mt_tb_close(w);
    return rc;
}

void mt_tb_close(mt_tb_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w->path);
    free(w);
}
