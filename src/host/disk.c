/* The disk tier (see disk.h): striped, unlinked files; io_uring, O_DIRECT. */
#include "host/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/mem.h"

#define MAX_DIRS 16
#define QUEUE_DEPTH 64

typedef struct dir_file {
    char path[1024];  /* the directory, for messages */
    int fd;
    int direct;       /* O_DIRECT took (a file system without it: buffered) */
} dir_file;

/* One stripe in flight. */
typedef struct op {
    int ticket, file;
    char *buf;
    size_t len;
    off_t off;
    int write;
} op;

/* One block's transfer: its stripes queued in turn with the other
 * transfers' (round robin), so that a read and a write move together. */
typedef struct ticket {
    int used;
    int block;
    char *buf;
    int write;
    size_t stripes;   /* of the block */
    size_t next;      /* stripes not queued yet start here */
    size_t pending;   /* stripes not done */
    int failed;       /* errno of the first failure, 0 none */
    int file;         /* where it failed */
    off_t off;
} ticket;

/* The ring belongs to the transfer thread (io_loop); callers hand it
 * tickets under mu and wait on `done`. */
struct mt_disk {
    struct io_uring ring;
    int ring_ok;
    dir_file dir[MAX_DIRS];
    int n_dirs;
    int n;
    size_t *bytes;    /* (n) each block, rounded up */
    off_t *base;      /* (n) where each block starts in every file */
    size_t total;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t io;
    int io_ok, quit;
    ticket *tickets;
    int n_tickets;
    int turn;         /* the ticket whose stripe is queued next */
    int in_flight;    /* SQEs submitted, not reaped */
};

static void *io_loop(void *arg);

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* An unnamed file in dir: O_TMPFILE where the file system has it, else a
 * named one unlinked at once. O_DIRECT where it is supported. */
static int open_unnamed(dir_file *f, mt_error *err) {
    f->direct = 1;
    f->fd = open(f->path, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (f->fd < 0) f->fd = open(f->path, O_TMPFILE | O_RDWR, 0600), f->direct = 0;
    if (f->fd < 0) {
        char tmpl[1100];
        snprintf(tmpl, sizeof tmpl, "%s/.megatrain-state-XXXXXX", f->path);
        f->fd = mkstemp(tmpl);
        if (f->fd >= 0) unlink(tmpl);
    }
    if (f->fd < 0)
        return mt_errorf(err, "%s: cannot create the disk tier's file there: %s; give a "
                         "writable directory", f->path, strerror(errno));
    if (!f->direct) {
        int fl = fcntl(f->fd, F_GETFL);
        f->direct = fl >= 0 && fcntl(f->fd, F_SETFL, fl | O_DIRECT) == 0;
    }
    return 0;
}

static int split_dirs(mt_disk *d, const char *dirs, mt_error *err) {
    const char *p = dirs;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof d->dir[0].path)
            return mt_errorf(err, "disk directories '%s': an empty or too long name; give "
                             "DIR[,DIR...]", dirs);
        if (d->n_dirs == MAX_DIRS)
            return mt_errorf(err, "disk directories '%s': more than %d; stripe over at most %d",
                             dirs, MAX_DIRS, MAX_DIRS);
        dir_file *f = &d->dir[d->n_dirs++];
        memcpy(f->path, p, len);
        f->path[len] = 0;
        f->fd = -1;
        struct stat sb;
        if (stat(f->path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return mt_errorf(err, "disk directory '%s': %s; give an existing directory",
                             f->path, stat(f->path, &sb) ? strerror(errno) : "not a directory");
        p = comma ? comma + 1 : NULL;
    }
    if (d->n_dirs == 0) return mt_errorf(err, "no disk directory given");
    return 0;
}

int mt_disk_free_bytes(const char *dirs, double *bytes, mt_error *err) {
    mt_disk d = {0};
    if (split_dirs(&d, dirs, err)) return -1;
    double least = -1;
    for (int k = 0; k < d.n_dirs; k++) {
        struct statvfs v;
        if (statvfs(d.dir[k].path, &v) != 0)
            return mt_errorf(err, "disk directory '%s': %s", d.dir[k].path, strerror(errno));
        double free_b = (double)v.f_bavail * (double)v.f_frsize;
        if (least < 0 || free_b < least) least = free_b;
    }
    *bytes = least * d.n_dirs;
    return 0;
}

/* Bytes of a block that land in file k. */
static size_t share_of(size_t bytes, int dirs, int k) {
    size_t stripes = (bytes + MT_DISK_STRIPE - 1) / MT_DISK_STRIPE;
    size_t mine = stripes / (size_t)dirs + ((size_t)k < stripes % (size_t)dirs);
    return mine * MT_DISK_STRIPE;
}

int mt_disk_open(mt_disk **out, const char *dirs, const size_t *bytes, int n, mt_error *err) {
    *out = NULL;
    mt_disk *d = mt_calloc_or_die(1, sizeof *d);
    d->n = n;
    d->bytes = mt_calloc_or_die((size_t)(n ? n : 1), sizeof *d->bytes);
    d->base = mt_calloc_or_die((size_t)(n ? n : 1), sizeof *d->base);
    if (split_dirs(d, dirs, err)) goto fail;
    size_t per_file = 0; /* every file holds the same stripes' room per block */
    for (int i = 0; i < n; i++) {
        d->bytes[i] = round_up(bytes[i], MT_DISK_ALIGN);
        d->base[i] = (off_t)per_file;
        per_file += share_of(d->bytes[i], d->n_dirs, 0);
        d->total += d->bytes[i];
    }
    for (int k = 0; k < d->n_dirs; k++) {
        dir_file *f = &d->dir[k];
        if (open_unnamed(f, err)) goto fail;
        int rc = per_file ? posix_fallocate(f->fd, 0, (off_t)per_file) : 0;
        if (rc)
            mt_errorf(err, "disk directory '%s': cannot reserve %.2f GB for the optimizer "
                      "state there: %s; free space, add directories (--nvme-dir A,B) or keep "
                      "more layers in RAM (--host-mem)", f->path, per_file / 1e9, strerror(rc));
        if (rc) goto fail;
    }
    int rc = io_uring_queue_init(QUEUE_DEPTH, &d->ring, 0);
    if (rc < 0) {
        mt_errorf(err, "io_uring: %s (the kernel refuses it: a container's seccomp profile "
                  "may block it); the disk tier needs it", strerror(-rc));
        goto fail;
    }
    d->ring_ok = 1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->done, NULL);
    if (pthread_create(&d->io, NULL, io_loop, d) != 0) {
        mt_errorf(err, "the disk tier's transfer thread: cannot start it");
        goto fail;
    }
    d->io_ok = 1;
    *out = d;
    return 0;
fail:
    mt_disk_close(d);
    return -1;
}

void mt_disk_close(mt_disk *d) {
    if (!d) return;
    if (d->io_ok) { /* the thread lands what is in flight, then ends */
        pthread_mutex_lock(&d->mu);
        d->quit = 1;
        pthread_cond_signal(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->io, NULL);
    }
    if (d->ring_ok) {
        io_uring_queue_exit(&d->ring);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->work);
        pthread_cond_destroy(&d->done);
    }
    for (int k = 0; k < d->n_dirs; k++)
        if (d->dir[k].fd >= 0) close(d->dir[k].fd);
    free(d->bytes);
    free(d->base);
    free(d->tickets);
    free(d);
}

size_t mt_disk_block_bytes(const mt_disk *d, int i) { return d->bytes[i]; }
size_t mt_disk_total_bytes(const mt_disk *d) { return d->total; }
int mt_disk_dirs(const mt_disk *d) { return d->n_dirs; }

void *mt_disk_buffer(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, MT_DISK_ALIGN, round_up(bytes ? bytes : 1, MT_DISK_ALIGN))) return NULL;
    return p;
}

/* ---- the transfer thread: it alone touches the ring ---- */

static void queue(mt_disk *d, op *o) {
    struct io_uring_sqe *s = io_uring_get_sqe(&d->ring);
    MT_ASSERT(s); /* at most QUEUE_DEPTH in flight */
    int fd = d->dir[o->file].fd;
    if (o->write) io_uring_prep_write(s, fd, o->buf, (unsigned)o->len, o->off);
    else io_uring_prep_read(s, fd, o->buf, (unsigned)o->len, o->off);
    io_uring_sqe_set_data(s, o);
    d->in_flight++;
}

/* Queues stripe t->next of ticket id. */
static void queue_stripe(mt_disk *d, int id) {
    ticket *t = &d->tickets[id];
    size_t k = t->next++, at = k * MT_DISK_STRIPE, bytes = d->bytes[t->block];
    op *o = mt_calloc_or_die(1, sizeof *o);
    o->ticket = id;
    o->file = (int)(k % (size_t)d->n_dirs);
    o->buf = t->buf + at;
    o->len = bytes - at < MT_DISK_STRIPE ? bytes - at : MT_DISK_STRIPE;
    o->off = d->base[t->block] + (off_t)(k / (size_t)d->n_dirs * MT_DISK_STRIPE);
    o->write = t->write;
    queue(d, o);
}

/* Fills the ring with the tickets' stripes, one of each in turn. */
static void fill(mt_disk *d) {
    int idle = 0; /* tickets in a row with nothing to queue */
    while (d->in_flight < QUEUE_DEPTH && d->n_tickets && idle < d->n_tickets) {
        int id = d->turn;
        d->turn = (d->turn + 1) % d->n_tickets;
        ticket *t = &d->tickets[id];
        if (!t->used || t->next == t->stripes) {
            idle++;
            continue;
        }
        idle = 0;
        queue_stripe(d, id);
    }
}

/* Lands completion c: its stripe is done, failed, or (short) queued
 * again for the rest. Under mu. */
static void land(mt_disk *d, struct io_uring_cqe *c) {
    op *o = io_uring_cqe_get_data(c);
    int res = mt_fault_hit(MT_FAULT_DISK) ? -EIO : c->res;
    io_uring_cqe_seen(&d->ring, c);
    d->in_flight--;
    ticket *t = &d->tickets[o->ticket];
    if (res > 0 && (size_t)res < o->len) { /* short: the rest again */
        o->buf += res, o->off += res, o->len -= (size_t)res;
        queue(d, o);
        return;
    }
    if ((res <= 0) && !t->failed) {
        t->failed = res < 0 ? -res : EIO; /* 0 bytes: past the end, which is a bug or a lie */
        t->file = o->file;
        t->off = o->off;
    }
    free(o);
    if (--t->pending == 0) pthread_cond_broadcast(&d->done);
}

/* Keeps the ring full while there is work; sleeps on `work` when there is
 * none; ends (after what is in flight) when closed. */
static void *io_loop(void *arg) {
    mt_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        fill(d);
        if (d->in_flight == 0) {
            if (d->quit) break;
            pthread_cond_wait(&d->work, &d->mu);
            continue;
        }
        pthread_mutex_unlock(&d->mu);
        io_uring_submit(&d->ring);
        struct io_uring_cqe *c;
        int rc;
        do rc = io_uring_wait_cqe(&d->ring, &c);
        while (rc == -EINTR);
        MT_ASSERT(rc == 0);
        pthread_mutex_lock(&d->mu);
        do land(d, c);
        while (io_uring_peek_cqe(&d->ring, &c) == 0);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- the callers' side ---- */

int mt_disk_submit(mt_disk *d, int i, void *buf, int write, mt_error *err) {
    MT_ASSERT(i >= 0 && i < d->n && ((uintptr_t)buf % MT_DISK_ALIGN) == 0);
    pthread_mutex_lock(&d->mu);
    int id = 0;
    while (id < d->n_tickets && d->tickets[id].used) id++;
    if (id == d->n_tickets) {
        d->n_tickets = d->n_tickets ? 2 * d->n_tickets : 8;
        d->tickets = mt_realloc_or_die(d->tickets, (size_t)d->n_tickets * sizeof *d->tickets);
        memset(d->tickets + id, 0, (size_t)(d->n_tickets - id) * sizeof *d->tickets);
    }
    size_t stripes = (d->bytes[i] + MT_DISK_STRIPE - 1) / MT_DISK_STRIPE;
    d->tickets[id] = (ticket){.used = 1, .block = i, .buf = buf, .write = write,
                              .stripes = stripes, .pending = stripes};
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mu);
    (void)err;
    return id;
}

int mt_disk_done(mt_disk *d, int id) {
    pthread_mutex_lock(&d->mu);
    MT_ASSERT(id >= 0 && id < d->n_tickets && d->tickets[id].used);
    int done = d->tickets[id].pending == 0;
    pthread_mutex_unlock(&d->mu);
    return done;
}

int mt_disk_wait(mt_disk *d, int id, mt_error *err) {
    pthread_mutex_lock(&d->mu);
    MT_ASSERT(id >= 0 && id < d->n_tickets && d->tickets[id].used);
    while (d->tickets[id].pending > 0) pthread_cond_wait(&d->done, &d->mu);
    ticket t = d->tickets[id];
    d->tickets[id].used = 0;
    pthread_mutex_unlock(&d->mu);
    if (!t.failed) return 0;
    return mt_errorf(err, "disk tier file in '%s', offset %lld: %s; the run stops (its last "
                     "checkpoint is intact)", d->dir[t.file].path, (long long)t.off,
                     strerror(t.failed));
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Moves blocks [0, n) (write or read), `depth` in flight; seconds taken. */
static int move_all(mt_disk *d, void **bufs, int n, int depth, int write, double *s,
                    mt_error *err) {
    int *tk = mt_calloc_or_die((size_t)n, sizeof *tk), rc = 0;
    double t0 = now_s();
    for (int i = 0; i < n && rc == 0; i++) {
        if (i >= depth) rc = mt_disk_wait(d, tk[i - depth], err);
        tk[i] = mt_disk_submit(d, i, bufs[i % depth], write, err);
    }
    for (int i = n - depth > 0 ? n - depth : 0; i < n && rc == 0; i++) rc = mt_disk_wait(d, tk[i], err);
    *s = now_s() - t0;
    free(tk);
    return rc;
}

int mt_disk_measure(const char *dirs, size_t bytes, double *write_gbs, double *read_gbs,
                    double *both_gbs, mt_error *err) {
    const size_t block = (size_t)64 << 20;
    int n = (int)(bytes / block) < 4 ? 4 : (int)(bytes / block), depth = 4;
    size_t *sizes = mt_calloc_or_die((size_t)n, sizeof *sizes);
    for (int i = 0; i < n; i++) sizes[i] = block;
    mt_disk *d;
    int rc = mt_disk_open(&d, dirs, sizes, n, err);
    free(sizes);
    if (rc) return -1;
    void *bufs[8];
    for (int i = 0; i < 2 * depth; i++) {
        bufs[i] = mt_disk_buffer(block);
        MT_ASSERT(bufs[i]);
        memset(bufs[i], i + 1, block); /* data, not zeros: no short cut anywhere */
    }
    double tw = 0, tr = 0, tb = 0, moved = (double)n * block;
    /* written once untimed: a fresh file's first writes allocate its blocks
     * (on a thin virtual disk, slowly), which the tier's rewrites of its
     * blocks every step do not; then rewritten, timed */
    rc = move_all(d, bufs, n, depth, 1, &tw, err);
    if (rc == 0) rc = move_all(d, bufs, n, depth, 1, &tw, err);
    if (rc == 0) rc = move_all(d, bufs, n, depth, 0, &tr, err);
    if (rc == 0) { /* reads of the first half beside writes of the second, `depth` of
                    * each in flight, as a training step keeps them */
        double t0 = now_s();
        int half = n / 2, *tk = mt_calloc_or_die((size_t)n, sizeof *tk);
        for (int i = 0; i < half && rc == 0; i++) {
            if (i >= depth)
                rc = mt_disk_wait(d, tk[2 * (i - depth)], err) ||
                     mt_disk_wait(d, tk[2 * (i - depth) + 1], err);
            if (rc) break;
            tk[2 * i] = mt_disk_submit(d, i, bufs[i % depth], 0, err);
            tk[2 * i + 1] = mt_disk_submit(d, half + i, bufs[depth + i % depth], 1, err);
        }
        for (int i = half - depth > 0 ? half - depth : 0; i < half && rc == 0; i++)
            rc = mt_disk_wait(d, tk[2 * i], err) || mt_disk_wait(d, tk[2 * i + 1], err);
        free(tk);
        tb = now_s() - t0;
        moved = (double)n * block; /* read and written: both halves */
    }
    for (int i = 0; i < 2 * depth; i++) free(bufs[i]);
    mt_disk_close(d);
    if (rc) return -1;
    *write_gbs = (double)n * block / tw / 1e9;
    *read_gbs = (double)n * block / tr / 1e9;
    *both_gbs = moved / tb / 1e9;
    return 0;
}
