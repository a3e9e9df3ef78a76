/* TCP rendezvous and control collectives (see rendezvous.h). Sockets are
 * used with poll and MSG_DONTWAIT only, so every wait has a deadline. */
#include "dist/rendezvous.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/mem.h"

#define HELLO_MAGIC 0x3152544Du  /* "MTR1" */
#define HELLO_BYTES 24           /* magic, rank, world (u32), digest (u64), config length (u32) */
#define MAX_CONFIG_BYTES (1u << 20)
#define MAX_MSG_BYTES 1000u

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- bytes with deadlines ---------------------------------------------- */

typedef enum { IO_OK, IO_TIMEOUT, IO_CLOSED, IO_FAILED } io_rc;

/* 1 when fd is ready for events, 0 at the deadline, -1 on a poll error. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left * 1000.0 + 1.0 > (double)INT_MAX ? INT_MAX : (int)(left * 1000.0 + 1.0);
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r != 0) return r < 0 ? -1 : 1;
    }
}

static io_rc send_all(int fd, const void *buf, size_t n, double deadline) {
    const char *p = buf;
    while (n > 0) {
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w <= 0) return w == 0 ? IO_TIMEOUT : IO_FAILED;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) return errno == EPIPE || errno == ECONNRESET ? IO_CLOSED : IO_FAILED;
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

static io_rc recv_all(int fd, void *buf, size_t n, double deadline) {
    char *p = buf;
    while (n > 0) {
        int w = wait_fd(fd, POLLIN, deadline);
        if (w <= 0) return w == 0 ? IO_TIMEOUT : IO_FAILED;
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k == 0) return IO_CLOSED;
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) return errno == ECONNRESET ? IO_CLOSED : IO_FAILED;
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

/* The message of a failed exchange with rank `peer` while doing `what`. */
static int io_error(mt_error *err, io_rc rc, const mt_rdv *g, int peer, const char *what) {
    if (rc == IO_TIMEOUT)
        return mt_errorf(err, "rank %d: no answer from rank %d within %g s while %s: it is "
                         "stuck, gone or slower than the timeout; check it, or raise "
                         "MT_DIST_TIMEOUT", g->rank, peer, g->timeout_s, what);
    if (rc == IO_CLOSED)
        return mt_errorf(err, "rank %d: rank %d closed its connection while %s: it stopped "
                         "(its own output says why)", g->rank, peer, what);
    return mt_errorf(err, "rank %d: the connection to rank %d failed while %s: %s", g->rank,
                     peer, what, strerror(errno));
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}
static uint64_t get_u64(const unsigned char *p) {
    return get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* ---- configurations ---------------------------------------------------- */

/* Line i of text ("name=value"), without its newline, into buf; 0 past the end. */
static int config_line(const char *text, int i, char *buf, size_t cap) {
    const char *p = text;
    for (; i > 0 && p; i--) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!p || !*p) return 0;
    size_t n = strcspn(p, "\n");
    snprintf(buf, cap, "%.*s", (int)n, p);
    return 1;
}

/* The first option in which rank `peer`'s configuration differs from rank 0's. */
static int config_mismatch(const char *mine, const char *theirs, int peer, mt_error *err) {
    char a[256], b[256];
    for (int i = 0;; i++) {
        int ha = config_line(mine, i, a, sizeof a), hb = config_line(theirs, i, b, sizeof b);
        if (!ha && !hb) break;
        if (ha && hb && !strcmp(a, b)) continue;
        size_t na = strcspn(a, "="), nb = strcspn(b, "=");
        if (ha && hb && na == nb && !strncmp(a, b, na))
            return mt_errorf(err, "rank %d's configuration differs from rank 0's: option '%.*s' "
                             "is '%s' on rank 0 but '%s' on rank %d; start every rank with the "
                             "same options", peer, (int)na, a, a + na + (a[na] ? 1 : 0),
                             b + nb + (b[nb] ? 1 : 0), peer);
        return mt_errorf(err, "rank %d's configuration differs from rank 0's at option %d "
                         "('%s' on rank 0, '%s' on rank %d): every rank must run the same "
                         "megatrain with the same options", peer, i + 1, ha ? a : "(none)",
                         hb ? b : "(none)", peer);
    }
    /* same lines, different bytes: a difference past a line's 255 characters */
    return mt_errorf(err, "rank %d's configuration differs from rank 0's in a long option; "
                     "start every rank with the same options", peer);
}

/* ---- rank 0 ------------------------------------------------------------ */

static int listen_socket(const mt_dist_env *env, int *out, mt_error *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", env->master_port);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(NULL, port, &hints, &res);
    if (rc) return mt_errorf(err, "rank 0: cannot listen on port %s: %s", port, gai_strerror(rc));
    int fd = -1, saved = 0;
    /* IPv6 first (dual stack: it takes IPv4 peers too), then IPv4 */
    for (int pass = 0; pass < 2 && fd < 0; pass++)
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            if ((a->ai_family == AF_INET6) != (pass == 0)) continue;
            fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (a->ai_family == AF_INET6)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
            saved = errno;
            close(fd);
            fd = -1;
        }
    freeaddrinfo(res);
    if (fd >= 0) {
        *out = fd;
        return 0;
    }
    if (saved == EADDRINUSE)
        return mt_errorf(err, "rank 0: cannot listen on MASTER_PORT=%s: the port is in use (by "
                         "another run or program); choose a free port", port);
    return mt_errorf(err, "rank 0: cannot listen on MASTER_PORT=%s: %s", port, strerror(saved));
}

/* Reads and checks one hello on socket c; sets *peer. */
static int read_hello(mt_rdv *g, int c, const char *config, uint64_t digest, const int *fd,
                      double deadline, int *peer, mt_error *err) {
    unsigned char h[HELLO_BYTES];
    io_rc rc = recv_all(c, h, sizeof h, deadline);
    if (rc != IO_OK)
        return mt_errorf(err, "rank 0: a process connected to MASTER_PORT but sent no complete "
                         "hello (%s): is another program using the port?",
                         rc == IO_TIMEOUT ? "timed out" : "closed");
    if (get_u32(h) != HELLO_MAGIC)
        return mt_errorf(err, "rank 0: something that is not a megatrain rank (or another "
                         "version) connected to MASTER_PORT; choose a port no other program uses");
    uint32_t r = get_u32(h + 4), w = get_u32(h + 8), len = get_u32(h + 20);
    *peer = (int)r;
    if ((int)w != g->world)
        return mt_errorf(err, "a rank says the world size is %u, rank 0 says %d: start every "
                         "rank with the same WORLD_SIZE", w, g->world);
    if (r == 0 || (int)r >= g->world)
        return mt_errorf(err, "a rank says it is rank %u (world size %d): rank 0 is taken and "
                         "ranks run to %d; check each process's RANK", r, g->world, g->world - 1);
    if (fd[r] >= 0)
        return mt_errorf(err, "two processes say they are rank %u: give each process its own "
                         "RANK", r);
    if (len > MAX_CONFIG_BYTES)
        return mt_errorf(err, "rank %u sent a configuration of %u bytes: not a megatrain "
                         "rank of this version", r, len);
    char *theirs = mt_malloc_or_die((size_t)len + 1);
    rc = recv_all(c, theirs, len, deadline);
    theirs[len] = 0;
    int out = 0;
    if (rc != IO_OK) out = io_error(err, rc, g, (int)r, "reading its configuration");
    else if (get_u64(h + 12) != digest || strcmp(theirs, config))
        out = config_mismatch(config, theirs, (int)r, err);
    free(theirs);
    return out;
}

/* Status, message and (accepted) blob to one rank; best effort when refusing. */
static io_rc send_reply(int c, uint32_t status, const char *msg, const unsigned char *blob,
                        double deadline) {
    size_t n = strlen(msg) < MAX_MSG_BYTES ? strlen(msg) : MAX_MSG_BYTES;
    unsigned char h[8];
    put_u32(h, status);
    put_u32(h + 4, (uint32_t)n);
    io_rc rc = send_all(c, h, sizeof h, deadline);
    if (rc == IO_OK) rc = send_all(c, msg, n, deadline);
    if (rc == IO_OK && status == 0) rc = send_all(c, blob, MT_RDV_BLOB_BYTES, deadline);
    return rc;
}

/* Tells every connected rank (and c, if >= 0) why the run stops. */
static void refuse_all(mt_rdv *g, int c, const char *why) {
    double deadline = now_s() + 1.0;
    for (int r = 1; r < g->world; r++)
        if (g->fd[r] >= 0) send_reply(g->fd[r], 1, why, NULL, deadline);
    if (c >= 0) send_reply(c, 1, why, NULL, deadline);
}

static int open_rank0(mt_rdv *g, const mt_dist_env *env, const char *config, mt_error *err) {
    int lfd = -1;
    if (listen_socket(env, &lfd, err)) return -1;
    const uint64_t digest = XXH3_64bits(config, strlen(config));
    const double deadline = now_s() + g->timeout_s;
    int have = 0, rc = 0;
    while (have < g->world - 1 && rc == 0) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w <= 0) {
            char missing[256] = "";
            size_t at = 0;
            for (int r = 1; r < g->world && at + 16 < sizeof missing; r++)
                if (g->fd[r] < 0)
                    at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%d",
                                           at ? ", " : "", r);
            rc = mt_errorf(err, "rank 0: %d of %d ranks did not connect to port %d within %g s "
                           "(missing: rank %s): start every rank with the same MASTER_ADDR and "
                           "MASTER_PORT, or raise MT_DIST_TIMEOUT", g->world - 1 - have,
                           g->world, env->master_port, g->timeout_s, missing);
            refuse_all(g, -1, err->msg);
            break;
        }
        int c = accept(lfd, NULL, NULL);
        if (c < 0) continue;
        int one = 1, peer = -1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (read_hello(g, c, config, digest, g->fd, deadline, &peer, err)) {
            refuse_all(g, c, err->msg);
            close(c);
            rc = -1;
        } else {
            g->fd[peer] = c;
            have++;
        }
    }
    close(lfd);
    for (int r = 1; r < g->world && rc == 0; r++) {
        io_rc io = send_reply(g->fd[r], 0, "", g->blob, now_s() + g->timeout_s);
        if (io != IO_OK) rc = io_error(err, io, g, r, "answering its hello");
    }
    return rc;
}

/* ---- the other ranks --------------------------------------------------- */

/* Connects the non-blocking socket fd to a, waiting no later than the
 * deadline (a blocking connect to an unreachable host waits for the
 * kernel's SYN retries, minutes). 0, or -1 with errno set. */
static int connect_by(int fd, const struct addrinfo *a, double deadline) {
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return 0;
    if (errno != EINPROGRESS) return -1;
    int w = wait_fd(fd, POLLOUT, deadline), e = 0;
    socklen_t len = sizeof e;
    if (w == 0) errno = ETIMEDOUT;
    if (w <= 0) return -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) return -1;
    errno = e;
    return e == 0 ? 0 : -1;
}

/* A connected socket to addr:port, retrying until the deadline. */
static int connect_rank0(const mt_rdv *g, const mt_dist_env *env, double deadline, int *out,
                         mt_error *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", env->master_port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    const char *last = "no attempt";
    for (;;) {
        struct addrinfo *res = NULL;
        int rc = getaddrinfo(env->master_addr, port, &hints, &res);
        if (rc && rc != EAI_AGAIN)
            return mt_errorf(err, "rank %d: MASTER_ADDR=%s: cannot resolve it: %s; give the "
                             "host name or address of rank 0's machine", g->rank,
                             env->master_addr, gai_strerror(rc));
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
            if (fd < 0) continue;
            if (connect_by(fd, a, deadline) == 0) {
                freeaddrinfo(res);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                *out = fd;
                return 0;
            }
            last = strerror(errno);
            close(fd);
        }
        if (rc) last = gai_strerror(rc);
        freeaddrinfo(res);
        if (now_s() >= deadline) break;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    return mt_errorf(err, "rank %d: could not reach rank 0 at %s:%d within %g s (%s): start "
                     "rank 0 with the same MASTER_ADDR and MASTER_PORT, or raise "
                     "MT_DIST_TIMEOUT", g->rank, env->master_addr, env->master_port,
                     g->timeout_s, last);
}

static int open_peer(mt_rdv *g, const mt_dist_env *env, const char *config, mt_error *err) {
    const double start = now_s();
    int fd = -1;
    if (connect_rank0(g, env, start + g->timeout_s, &fd, err)) return -1;
    g->fd[0] = fd;
    size_t len = strlen(config);
    if (len > MAX_CONFIG_BYTES)
        return mt_errorf(err, "rank %d: the configuration text is %zu bytes, more than %u",
                         g->rank, len, MAX_CONFIG_BYTES);
    unsigned char h[HELLO_BYTES];
    put_u32(h, HELLO_MAGIC);
    put_u32(h + 4, (uint32_t)g->rank);
    put_u32(h + 8, (uint32_t)g->world);
    put_u64(h + 12, XXH3_64bits(config, len));
    put_u32(h + 20, (uint32_t)len);
    /* Rank 0 answers once every rank has come, or gives up after its own
     * timeout and says why: wait a little longer than it does. */
    const double deadline = start + g->timeout_s + 2.0;
    io_rc rc = send_all(fd, h, sizeof h, deadline);
    if (rc == IO_OK) rc = send_all(fd, config, len, deadline);
    unsigned char r[8];
    if (rc == IO_OK) rc = recv_all(fd, r, sizeof r, deadline);
    if (rc != IO_OK) return io_error(err, rc, g, 0, "waiting for every rank to arrive");
    uint32_t status = get_u32(r), n = get_u32(r + 4);
    if (n > MAX_MSG_BYTES) return mt_errorf(err, "rank %d: rank 0 sent a garbled answer", g->rank);
    char msg[MAX_MSG_BYTES + 1];
    rc = recv_all(fd, msg, n, deadline);
    msg[rc == IO_OK ? n : 0] = 0;
    if (rc == IO_OK && status != 0)
        return mt_errorf(err, "rank %d: rank 0 stopped the run: %s", g->rank, msg);
    if (rc == IO_OK) rc = recv_all(fd, g->blob, MT_RDV_BLOB_BYTES, deadline);
    if (rc != IO_OK) return io_error(err, rc, g, 0, "reading its answer");
    return 0;
}

int mt_rdv_open(mt_rdv *g, const mt_dist_env *env, const char *config,
                const unsigned char blob[MT_RDV_BLOB_BYTES], mt_error *err) {
    *g = (mt_rdv){.rank = env->rank, .world = env->world_size, .timeout_s = env->timeout_s};
    if (env->rank == 0 && blob) memcpy(g->blob, blob, MT_RDV_BLOB_BYTES);
    if (g->world == 1) return 0;
    int n = env->rank == 0 ? g->world : 1;
    g->fd = mt_malloc_or_die((size_t)n * sizeof *g->fd);
    for (int i = 0; i < n; i++) g->fd[i] = -1;
    int rc = env->rank == 0 ? open_rank0(g, env, config, err) : open_peer(g, env, config, err);
    if (rc) mt_rdv_close(g);
    return rc;
}

void mt_rdv_close(mt_rdv *g) {
    int n = g->fd ? (g->rank == 0 ? g->world : 1) : 0;
    for (int i = 0; i < n; i++)
        if (g->fd[i] >= 0) close(g->fd[i]);
    free(g->fd);
    g->fd = NULL;
}

/* ---- collectives ------------------------------------------------------- */

/* One message of n bytes between rank 0 and each other rank, in rank
 * order. to_root: every other rank sends leaf, rank 0 receives rank r's at
 * root + r * stride; else rank 0 sends root + r * stride to rank r, which
 * receives it in leaf. leaf_what / root_what: the step, in an error. */
static int star(mt_rdv *g, bool to_root, void *leaf, char *root, size_t stride, size_t n,
                const char *leaf_what, const char *root_what, mt_error *err) {
    if (g->world == 1) return 0;
    MT_ASSERT(g->fd);
    const double deadline = now_s() + g->timeout_s;
    if (g->rank != 0) {
        io_rc rc = to_root ? send_all(g->fd[0], leaf, n, deadline)
                           : recv_all(g->fd[0], leaf, n, deadline);
        return rc == IO_OK ? 0 : io_error(err, rc, g, 0, leaf_what);
    }
    for (int r = 1; r < g->world; r++) {
        char *p = root + (size_t)r * stride;
        io_rc rc = to_root ? recv_all(g->fd[r], p, n, deadline) : send_all(g->fd[r], p, n, deadline);
        if (rc != IO_OK) return io_error(err, rc, g, r, root_what);
    }
    return 0;
}

int mt_rdv_bcast(mt_rdv *g, void *buf, size_t n, mt_error *err) {
    return star(g, false, buf, buf, 0, n, "receiving a broadcast", "broadcasting", err);
}

int mt_rdv_gather(mt_rdv *g, const void *send, size_t n, void *recv, mt_error *err) {
    if (g->rank == 0 && n) memcpy(recv, send, n);
    /* send is only read: star sends leaf when to_root */
    return star(g, true, (void *)send, recv, n, n, "sending to a gather", "gathering", err);
}

int mt_rdv_allgather(mt_rdv *g, const void *send, size_t n, void *recv, mt_error *err) {
    return mt_rdv_gather(g, send, n, recv, err) ||
                   mt_rdv_bcast(g, recv, (size_t)g->world * n, err)
               ? -1
               : 0;
}

/* x (n elements of size es) replaced on every rank by the elementwise sum
 * over the ranks, added in rank order on rank 0 by add(acc, part, n). */
static int sum_in_rank_order(mt_rdv *g, void *x, size_t n, size_t es,
                             void (*add)(void *acc, const void *part, size_t n), mt_error *err) {
    if (g->world == 1 || n == 0) return 0;
    size_t bytes = n * es;
    char *all = g->rank == 0 ? mt_malloc_or_die((size_t)g->world * bytes) : NULL;
    int rc = mt_rdv_gather(g, x, bytes, all, err);
    if (rc == 0 && g->rank == 0) {
        for (int r = 1; r < g->world; r++) add(all, all + (size_t)r * bytes, n);
        memcpy(x, all, bytes);
    }
    free(all);
    return rc ? rc : mt_rdv_bcast(g, x, bytes, err);
}

static void add_f64(void *acc, const void *part, size_t n) {
    double *a = acc;
    const double *p = part;
    for (size_t i = 0; i < n; i++) a[i] += p[i];
}

static void add_f32(void *acc, const void *part, size_t n) {
    float *a = acc;
    const float *p = part;
    for (size_t i = 0; i < n; i++) a[i] += p[i];
}

int mt_rdv_sum_n(mt_rdv *g, double *x, size_t n, mt_error *err) {
    return sum_in_rank_order(g, x, n, sizeof *x, add_f64, err);
}

int mt_rdv_sum_f32(mt_rdv *g, float *x, size_t n, mt_error *err) {
    return sum_in_rank_order(g, x, n, sizeof *x, add_f32, err);
}

int mt_rdv_sum(mt_rdv *g, double *x, mt_error *err) { return mt_rdv_sum_n(g, x, 1, err); }

int mt_rdv_barrier(mt_rdv *g, mt_error *err) {
    double x = 0;
    return mt_rdv_sum(g, &x, err);
}
