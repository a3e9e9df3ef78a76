/* A training run of several ranks, the parts that differ from a run of
 * one: meeting the other ranks, this rank's parts of the model (fresh,
 * from a model directory, or from a checkpoint of any number of ranks),
 * and its share of every step's micro-batches. The ranks' steps and saves
 * are in trainer.c and trainer_state.c. */
#include <stdlib.h>
#include <string.h>

#include "dist/cpu_ranks.h"
#include "host/disk_state.h"
#include "train/train_memory.h"
#include "dist/shard_ckpt.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "train/trainer_internal.h"
#include "util/mem.h"
#include "util/signals.h"
#include "util/sys.h"

int mt_run_ranks_open(mt_run *R, int gpu, mt_error *err) {
    const mt_train_config *tc = R->tc;
    char *lines = mt_train_config_to_lines(tc);
    int rc = mt_ranks_open(&R->rk, gpu, lines, err);
    free(lines);
    if (rc) return -1;
    int world = R->rk.env.world_size;
    R->several = world > 1;
    R->M = (int)tc->micro_batches;
    R->mb_first = 0;
    if (tc->gpus > 1 && world != tc->gpus)
        return mt_errorf(err, "gpus = %lld, but this process is one of %d ranks (%s): start "
                         "it with %lld or drop gpus", (long long)tc->gpus, world,
                         R->rk.env.source, (long long)tc->gpus);
    if (!R->several) return 0;
    if (tc->micro_batches % world)
        return mt_errorf(err, "micro_batches = %lld cannot be shared by %d ranks: each takes "
                         "the same number of every step's micro-batches; use a multiple of %d",
                         (long long)tc->micro_batches, world, world);
    R->M = (int)(tc->micro_batches / world);
    R->mb_first = R->rk.env.rank * R->M;
    return 0;
}

const mt_param_table *mt_run_store_table(const mt_run *R) {
    return R->several ? &R->parts : &R->table;
}

int mt_run_store_open(mt_run *R, int store_grads, mt_error *err) {
    const mt_train_config *tc = R->tc;
    const mt_param_table *t = mt_run_store_table(R);
    if (tc->disk_layers > 0 && !tc->nvme_dir[0])
        return mt_errorf(err, "disk_layers %lld: give the directories for them with --nvme-dir "
                         "DIR[,DIR...]", (long long)tc->disk_layers);
    if (tc->disk_layers > t->n_layers)
        return mt_errorf(err, "disk_layers %lld: the model has %d layers (the embedding, %lld "
                         "blocks, the head); give at most %d", (long long)tc->disk_layers,
                         t->n_layers, (long long)R->cfg.L, t->n_layers);
    int n = R->disk_layers, nw = R->disk_weight_layers;
    if (mt_disk_store_create(&R->store, t, store_grads, n, nw, tc->nvme_dir, err)) return -1;
    if (n)
        mt_emitf(&R->ev, MT_EVENT_INFO, "disk tier: the optimizer state of the last %d layers on "
                 "%s, %.2f GB (%.2f GB of RAM for their staging)", n, tc->nvme_dir,
                 mt_disk_state_disk_bytes(R->store.disk) / 1e9,
                 mt_disk_state_ram_bytes(R->store.disk) / 1e9);
    if (nw)
        mt_emitf(&R->ev, MT_EVENT_INFO, "disk tier: the fp32 weights of the last %d layers too "
                 "(a bf16 copy of them in RAM)", nw);
    return 0;
}

int mt_run_check_disk_weights(const mt_run *R, int gpu, mt_error *err) {
    const mt_train_config *tc = R->tc;
    long long n = (long long)tc->disk_weight_layers;
    if (n <= 0) return 0;
    const char *why = !tc->nvme_dir[0] ? "give the directories for them with --nvme-dir DIR[,DIR...]"
                      : !gpu ? "they are for the GPU's bf16 mode (the CPU backend computes with "
                               "the fp32 weights in RAM); leave it out or train with --device cuda"
                      : R->several || tc->gpus > 1
                          ? "they are for one GPU (each rank of several holds only its part of "
                            "every layer); leave it out (--disk-layers works there)"
                      : tc->precision == MT_TC_PRECISION_FP32
                          ? "the GPU computes with the bf16 copy RAM keeps of them, which an fp32 "
                            "run cannot; use --precision bf16 or leave it out"
                      : tc->host_saved_inputs
                          ? "they need the planner, which --host-saved-inputs turns off"
                      : tc->ref_model[0]
                          ? "the reference model (ref_model) is loaded into the store whole; "
                            "leave one of them out"
                          : NULL;
    return why ? mt_errorf(err, "--disk-weight-layers %lld: %s", n, why) : 0;
}

/* Reading a model directory into this rank's parts: a layer at a time
 * through a buffer of one layer. */
typedef struct part_reader {
    mt_run *R;
    float *layer;
} part_reader;

static float *reader_dst(void *ctx, int layer) {
    (void)layer;
    return ((part_reader *)ctx)->layer;
}

static void reader_done(void *ctx, int layer) {
    part_reader *pr = ctx;
    mt_run *R = pr->R;
    memcpy(R->store.w + R->parts.layers[layer].offset, pr->layer + R->sl.part[layer].begin,
           mt_shard_len(&R->sl, layer) * sizeof(float));
}

/* A run of one whose weights are partly on disk, from a model directory:
 * each such layer is read into a buffer of one layer and written to the
 * disk tier; the others straight into the store. */
typedef struct disk_reader {
    mt_host_store *s;
    float *layer;
    mt_error err;
    int rc;
} disk_reader;

static float *disk_reader_dst(void *ctx, int l) {
    disk_reader *dr = ctx;
    if (!mt_disk_state_weights_on_disk(dr->s->disk, l)) return mt_store_layer(dr->s->w, dr->s->table, l);
    memset(dr->layer, 0, dr->s->table->layers[l].numel * sizeof(float)); /* the padding: 0 */
    return dr->layer;
}

static void disk_reader_done(void *ctx, int l) {
    disk_reader *dr = ctx;
    if (dr->rc == 0 && mt_disk_state_weights_on_disk(dr->s->disk, l))
        dr->rc = mt_disk_layer_write(dr->s, l, dr->layer, NULL, NULL, &dr->err);
}

static int load_disk_weights(mt_run *R, mt_error *err) {
    const mt_param_table *t = &R->table;
    disk_reader dr = {.s = &R->store, .layer = mt_calloc_or_die(t->max_layer_numel + 1,
                                                                sizeof(float))};
    int rc = mt_model_read_layers(t, R->tc->model, disk_reader_dst, disk_reader_done, &dr, err);
    if (rc == 0 && dr.rc) *err = dr.err;
    free(dr.layer);
    return rc || dr.rc ? -1 : 0;
}

int mt_run_init_weights(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    int away = mt_disk_state_weight_layers(R->store.disk) > 0;
    if (away && !tc->model[0])
        return mt_disk_store_init_random(&R->store, (uint64_t)tc->seed, 0.02f, err);
    if (away) return load_disk_weights(R, err);
    if (!tc->model[0]) {
        if (R->several)
            mt_shard_init_random(&R->store, &R->sl, (uint64_t)tc->seed, 0.02f);
        else
            mt_host_store_init_random(&R->store, (uint64_t)tc->seed, 0.02f);
        return 0;
    }
    if (!R->several) return mt_model_load_weights(&R->store, tc->model, err);
    part_reader pr = {.R = R, .layer = mt_calloc_or_die(R->table.max_layer_numel + 1,
                                                        sizeof(float))};
    int rc = mt_model_read_layers(&R->table, tc->model, reader_dst, reader_done, &pr, err);
    free(pr.layer);
    return rc;
}

/* Layer l of the run's store (this rank's part of it, on several) from w,
 * m and v (its numel floats each), wherever its parts live
 * (mt_disk_layer_write). A sink of mt_shard_ckpt_load_layers for a run of
 * one. */
static int put_layer(void *ctx, int l, const float *w, const float *m, const float *v,
                     mt_error *err) {
    return mt_disk_layer_write(&((mt_run *)ctx)->store, l, w, m, v, err);
}

/* A checkpoint of one process on a rank of several: the whole store once,
 * then this rank's parts of it. */
static int load_whole_into_parts(mt_run *R, char **js, mt_error *err) {
    mt_host_store whole;
    if (mt_host_store_create(&whole, &R->table, 0, err)) return -1;
    int rc = mt_checkpoint_load_verified(R->ckpt_dir, &whole, &R->cfg, js, err);
    for (int l = 0; rc == 0 && l < R->table.n_layers; l++) {
        size_t from = R->table.layers[l].offset + R->sl.part[l].begin;
        rc = put_layer(R, l, whole.w + from, whole.m + from, whole.v + from, err);
    }
    mt_host_store_free(&whole);
    return rc;
}

int mt_run_load_checkpoint(mt_run *R, char **js, mt_error *err) {
    int ranks = mt_shard_ckpt_ranks(R->ckpt_dir, err);
    if (ranks < 0) return -1;
    if (ranks == 0)
        return R->several ? load_whole_into_parts(R, js, err)
                          : mt_checkpoint_load_verified(R->ckpt_dir, &R->store, &R->cfg, js, err);
    if (!R->several)
        return mt_shard_ckpt_load_layers(R->ckpt_dir, &R->table, &R->cfg, js, put_layer, R, err);
    mt_shard_store view = {.layout = R->sl, .w = R->store.w, .m = R->store.m, .v = R->store.v,
                           .disk = R->store.disk};
    return mt_shard_ckpt_load(R->ckpt_dir, &view, &R->cfg, js, err);
}

/* A rank other than the first reports only its warnings, named: progress
 * and information come from rank 0. */
static void warnings_only(const mt_event *ev, void *user) {
    mt_run *R = user;
    if (ev->kind != MT_EVENT_WARNING || !R->ev_rank.fn) return;
    char text[1200];
    snprintf(text, sizeof text, "rank %d: %s", R->rk.env.rank, ev->text);
    mt_event e = *ev;
    e.text = text;
    R->ev_rank.fn(&e, R->ev_rank.user);
}

void mt_run_quiet_events(mt_run *R) {
    R->ev_rank = R->ev;
    R->ev.fn = warnings_only;
    R->ev.user = R;
}

double mt_run_host_mem_share(const mt_run *R) {
    const mt_train_config *tc = R->tc;
    if (!R->several) return tc->host_mem;
    double machine = tc->host_mem > 0 ? tc->host_mem : mt_host_ram_budget_bytes() / 1e9;
    return machine / R->rk.local_world;
}

int mt_run_backend_init(mt_run *R, const mt_runner_opts *ro, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (R->several && !mt_runner_pick_gpu(ro->device, err)) {
        R->r = (mt_runner){.n_layers = R->table.n_layers, .M = R->M, .B = tc->batch_size,
                           .T = tc->seq_len};
        R->r.be = mt_cpu_ranks_backend_create(&R->cfg, &R->sl, &R->store, &R->rk.rdv, R->M,
                                              tc->batch_size, tc->seq_len, err);
        R->cpu_ranks = R->r.be != NULL;
        return R->r.be ? 0 : -1;
    }
    return mt_runner_init(&R->r, &R->cfg, &R->table, &R->store, R->M, tc->batch_size,
                          tc->seq_len, ro, err);
}

void mt_run_backend_free(mt_run *R) {
    if (R->cpu_ranks) {
        R->r.be->ops->destroy(R->r.be);
        R->r.be = NULL;
        R->cpu_ranks = 0;
        return;
    }
    mt_runner_free(&R->r);
}

int mt_run_stop_asked(const mt_run *R) {
    return R->several ? R->stop_asked : mt_signals_pending();
}
