/* What a run asks of the GPU side of the build without knowing whether it
 * has one: how many GPUs, which one this process drives, and the
 * communicator between the GPUs of a data-parallel run. A build without
 * CUDA answers that there is none (backend/none/device_none.c). */
#ifndef MT_BACKEND_DEVICE_H
#define MT_BACKEND_DEVICE_H

#include <stdio.h>

#include "backend/cuda/backend_cuda.h" /* its options: plain C, in every build */
#include "plan/rates.h"
#include "util/error.h"

#define MT_DEVICE_COMM_ID_BYTES 128  /* fits the rendezvous' blob */

typedef struct mt_device_comm mt_device_comm;

/* GPUs visible to this process (0 without CUDA or a driver). */
int mt_device_count(void);

/* Free and total memory of the selected GPU, bytes; -1 (nothing written)
 * without a GPU. */
int mt_device_memory(double *free_bytes, double *total_bytes);

/* The GPU streaming backend (backend/cuda/backend_cuda.h) over store, for
 * up to max_M micro-batches of (B, T); NULL with a message without a GPU
 * or when memory is short. */
mt_backend *mt_device_backend_create(const mt_config *cfg, const mt_param_table *t,
                                     mt_host_store *store, int max_M, int64_t B, int64_t T,
                                     const mt_cuda_backend_opts *o, mt_error *err);

/* The grouped expert products' benchmark (megatrain bench moe-gemm) with
 * the tensor-core kernel's block size bk and pipeline depth (0: its
 * choice), printed to out; -1 without a GPU. */
int mt_device_bench_moe_gemm(FILE *out, int bk, int stages, mt_error *err);

/* Measures this machine's rates for the planner (copies, CPU AdamW, a layer
 * and the head of cfg's shape at M x (B, T) on the GPU); -1 without a GPU. */
int mt_device_probe(mt_rates *r, const mt_config *cfg, int M, int64_t B, int64_t T, int fp32,
                    mt_error *err);

/* Makes GPU `index` this process's (every later CUDA call of every
 * thread of the run goes there); -1 naming the index and how many there
 * are when it does not exist. */
int mt_device_select(int index, mt_error *err);

/* Rank 0 of a run on GPUs: the id every rank joins the communicator by. */
int mt_device_comm_id(unsigned char id[MT_DEVICE_COMM_ID_BYTES], mt_error *err);

/* Joins the communicator of `world` ranks named by id, on the selected
 * GPU; blocks until every rank has joined. */
mt_device_comm *mt_device_comm_open(const unsigned char id[MT_DEVICE_COMM_ID_BYTES], int rank,
                                    int world, mt_error *err);
void mt_device_comm_close(mt_device_comm *c);

/* Measures the communicator's collectives: all-gathers of a layer-sized
 * buffer (64 MB a rank) timed on the GPU, as the bus bandwidth in GB/s the
 * planner's link_gbs means. Collective: every rank calls it together. */
int mt_device_comm_probe(mt_device_comm *c, double *link_gbs, mt_error *err);

#endif
