/* NCCL loaded at run time (see nccl.h). The declarations come from
 * nccl.h; the calls go through pointers found with dlsym, so nothing of
 * NCCL is linked. */
#include "backend/cuda/nccl.h"

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_common.h"
#include "util/mem.h"

_Static_assert(MT_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the rendezvous blob holds an id");

/* Where NCCL is looked for after MT_NCCL_LIBRARY and the loader's own
 * search (LD_LIBRARY_PATH, the cache): the CUDA toolkit this build used. */
#ifndef MT_NCCL_DIRS
#define MT_NCCL_DIRS ""
#endif

static struct {
    pthread_once_t once;
    void *lib;
    char why[800];
    char version[32];
    __typeof__(&ncclGetVersion) get_version;
    __typeof__(&ncclGetUniqueId) get_unique_id;
    __typeof__(&ncclCommInitRank) init_rank;
    __typeof__(&ncclCommDestroy) destroy;
    __typeof__(&ncclAllGather) all_gather;
    __typeof__(&ncclReduceScatter) reduce_scatter;
    __typeof__(&ncclGetErrorString) error_string;
} nc = {.once = PTHREAD_ONCE_INIT};

struct mt_nccl {
    ncclComm_t comm;
    int rank, world, device;
};

#define NCCL_CHECK(stmt)                                                                   \
    do {                                                                                   \
        ncclResult_t mt_nccl_rc_ = (stmt);                                                 \
        if (mt_nccl_rc_ != ncclSuccess) {                                                  \
            int mt_dev_ = -1;                                                              \
            (void)cudaGetDevice(&mt_dev_);                                                 \
            mt_die(__FILE__, __LINE__, "NCCL error in '%s' on device %d: %s (%d)", #stmt, \
                   mt_dev_, nc.error_string(mt_nccl_rc_), (int)mt_nccl_rc_);               \
        }                                                                                  \
    } while (0)

static void *try_open(const char *path, char *tried, size_t cap) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t n = strlen(tried);
        snprintf(tried + n, cap - n, "%s%s", n ? "; " : "", dlerror());
    }
    return h;
}

static void load_once(void) {
    char tried[600] = "";
    const char *env = getenv("MT_NCCL_LIBRARY");
    if (env && *env) {
        nc.lib = try_open(env, tried, sizeof tried);
        if (!nc.lib) {
            snprintf(nc.why, sizeof nc.why, "MT_NCCL_LIBRARY=%s cannot be loaded (%s); point it "
                     "at a libnccl.so.2", env, tried);
            return;
        }
    }
    if (!nc.lib) nc.lib = try_open("libnccl.so.2", tried, sizeof tried);
    char dirs[] = MT_NCCL_DIRS;
    for (char *d = strtok(dirs, ":"); !nc.lib && d; d = strtok(NULL, ":")) {
        char path[512];
        snprintf(path, sizeof path, "%s/libnccl.so.2", d);
        nc.lib = try_open(path, tried, sizeof tried);
    }
    if (!nc.lib) {
        snprintf(nc.why, sizeof nc.why, "NCCL (libnccl.so.2) is needed for more than one GPU and "
                 "was not found (%s); install it (Debian/Ubuntu: libnccl2; it also comes with "
                 "PyTorch's wheels as nvidia/nccl/lib/libnccl.so.2) and put its folder on "
                 "LD_LIBRARY_PATH, or set MT_NCCL_LIBRARY to the file", tried);
        return;
    }
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&nc.get_version, "ncclGetVersion"},
        {(void **)&nc.get_unique_id, "ncclGetUniqueId"},
        {(void **)&nc.init_rank, "ncclCommInitRank"},
        {(void **)&nc.destroy, "ncclCommDestroy"},
        {(void **)&nc.all_gather, "ncclAllGather"},
        {(void **)&nc.reduce_scatter, "ncclReduceScatter"},
        {(void **)&nc.error_string, "ncclGetErrorString"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        *syms[i].fn = dlsym(nc.lib, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(nc.why, sizeof nc.why, "the NCCL library found lacks %s: it is too old or "
                     "not NCCL; install NCCL 2.12 or newer", syms[i].name);
            dlclose(nc.lib);
            nc.lib = NULL;
            return;
        }
    }
    int v = 0;
    if (nc.get_version(&v) == ncclSuccess)
        snprintf(nc.version, sizeof nc.version, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

int mt_nccl_load(mt_error *err) {
    pthread_once(&nc.once, load_once);
    return nc.lib ? 0 : mt_errorf(err, "%s", nc.why);
}

const char *mt_nccl_version(void) { return nc.version; }

int mt_nccl_unique_id(unsigned char id[MT_NCCL_ID_BYTES], mt_error *err) {
    if (mt_nccl_load(err)) return -1;
    ncclUniqueId u;
    ncclResult_t rc = nc.get_unique_id(&u);
    if (rc != ncclSuccess)
        return mt_errorf(err, "NCCL could not make a communicator id: %s", nc.error_string(rc));
    memcpy(id, u.internal, MT_NCCL_ID_BYTES);
    return 0;
}

mt_nccl *mt_nccl_open(const unsigned char id[MT_NCCL_ID_BYTES], int rank, int world,
                      mt_error *err) {
    if (mt_nccl_load(err)) return NULL;
    mt_nccl *c = mt_calloc_or_die(1, sizeof *c);
    c->rank = rank;
    c->world = world;
    CUDA_CHECK(cudaGetDevice(&c->device));
    ncclUniqueId u;
    memcpy(u.internal, id, MT_NCCL_ID_BYTES);
    ncclResult_t rc = nc.init_rank(&c->comm, world, u, rank);
    if (rc != ncclSuccess) {
        mt_errorf(err, "rank %d of %d: NCCL could not join the other GPUs on device %d: %s (set "
                  "NCCL_DEBUG=WARN for NCCL's reasons)", rank, world, c->device,
                  nc.error_string(rc));
        free(c);
        return NULL;
    }
    return c;
}

void mt_nccl_close(mt_nccl *c) {
    if (!c) return;
    NCCL_CHECK(nc.destroy(c->comm));
    free(c);
}

int mt_nccl_rank(const mt_nccl *c) { return c->rank; }
int mt_nccl_world(const mt_nccl *c) { return c->world; }

void mt_nccl_all_gather(mt_nccl *c, float *buf, size_t chunk, cudaStream_t s) {
    NCCL_CHECK(nc.all_gather(buf + (size_t)c->rank * chunk, buf, chunk, ncclFloat32, c->comm, s));
}

void mt_nccl_all_gather_from(mt_nccl *c, const float *send, float *recv, size_t chunk,
                             cudaStream_t s) {
    NCCL_CHECK(nc.all_gather(send, recv, chunk, ncclFloat32, c->comm, s));
}

void mt_nccl_reduce_scatter(mt_nccl *c, float *buf, size_t chunk, cudaStream_t s) {
    NCCL_CHECK(nc.reduce_scatter(buf, buf + (size_t)c->rank * chunk, chunk, ncclFloat32, ncclSum,
                                 c->comm, s));
}
