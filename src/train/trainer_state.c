/* What a resume checkpoint records of a run besides the weights and Adam
 * state (trainer_state.json: step, data position, sampler RNG, options),
 * and the two saves of a run: resume checkpoints and the final model. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "dist/shard_ckpt.h"
#include "host/disk_state.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "train/trainer_internal.h"
#include "util/mem.h"
#include "util/sys.h"

/* ---- trainer state (resume) ---- */

char *mt_run_state_json(const mt_run *R) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)R->step);
    cJSON_AddNumberToObject(o, "tokens_seen", (double)R->tokens_seen);
    char rng[32];
    snprintf(rng, sizeof rng, "%llu", (unsigned long long)R->rng);
    cJSON_AddStringToObject(o, "rng", rng); /* 64 bits do not fit a JSON double */
    if (R->data) cJSON_AddItemToObject(o, "data", mt_dataset_pos_to_json(R->data));
    if (R->pref) cJSON_AddItemToObject(o, "pairs", mt_pref_data_pos_to_json(&R->pref->data));
    char *cfg = mt_train_config_to_json(R->tc);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* The options that decide which tokens each step sees: a resumed run must
 * keep them, or it would not continue the same run. */
static int check_resumable(const mt_run *R, const cJSON *saved, mt_error *err) {
    mt_train_config old;
    mt_train_config_defaults(&old);  /* a key missing from the saved object reads as its default */
    char *txt = cJSON_PrintUnformatted(saved);
    int rc = mt_train_config_from_json(&old, txt, err);
    free(txt);
    if (rc) return mt_error_prefix(err, "%s: trainer_state.json: ", R->ckpt_dir);
    const mt_train_config *tc = R->tc;
    struct { const char *name; long long was, now; } keys[] = {
        {"seq_len", old.seq_len, tc->seq_len},
        {"batch_size", old.batch_size, tc->batch_size},
        {"micro_batches", old.micro_batches, tc->micro_batches},
        {"seed", old.seed, tc->seed},
        {"epochs", old.epochs, tc->epochs},
        {"objective", old.objective, tc->objective},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (keys[i].was != keys[i].now)
            return mt_errorf(err, "%s was saved with %s = %lld, this run has %lld: a resumed "
                             "run must keep it (drop the flag or set it back)", R->ckpt_dir,
                             keys[i].name, keys[i].was, keys[i].now);
    if (old.packing != tc->packing)
        return mt_errorf(err, "%s was saved with packing %s, this run has %s: a resumed run "
                         "must keep it", R->ckpt_dir, mt_tc_packing_name(old.packing),
                         mt_tc_packing_name(tc->packing));
    if (strcmp(old.data, tc->data))
        return mt_errorf(err, "%s was saved training on '%s', this run on '%s'", R->ckpt_dir,
                         old.data, tc->data);
    return 0;
}

int mt_run_restore_state(mt_run *R, const char *json, mt_error *err) {
    cJSON *o = cJSON_Parse(json); /* the object mt_run_state_json() wrote */
    const cJSON *tr = cJSON_IsObject(o) ? o : NULL;
    const cJSON *step = tr ? cJSON_GetObjectItemCaseSensitive(tr, "step") : NULL;
    const cJSON *rng = tr ? cJSON_GetObjectItemCaseSensitive(tr, "rng") : NULL;
    const cJSON *cfg = tr ? cJSON_GetObjectItemCaseSensitive(tr, "config") : NULL;
    int rc = -1;
    if (!cJSON_IsNumber(step) || !cJSON_IsString(rng) || !cJSON_IsObject(cfg)) {
        mt_errorf(err, "%s/trainer_state.json: not written by this version of megatrain "
                  "(no trainer step, rng or config)", R->ckpt_dir);
        goto out;
    }
    if (check_resumable(R, cfg, err)) goto out;
    R->step = (int64_t)step->valuedouble;
    R->opt.step = R->step;
    R->rng = strtoull(rng->valuestring, NULL, 10);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(tr, "tokens_seen");
    R->tokens_seen = cJSON_IsNumber(ts) ? (int64_t)ts->valuedouble : 0;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(tr, "data");
    if (R->data && mt_dataset_pos_from_json(R->data, d, err)) {
        mt_error_prefix(err, "%s/trainer_state.json: ", R->ckpt_dir);
        goto out;
    }
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(tr, "pairs");
    if (R->pref && mt_pref_data_pos_from_json(&R->pref->data, pp, err)) {
        mt_error_prefix(err, "%s/trainer_state.json: ", R->ckpt_dir);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* ---- saving ---- */

int mt_run_save_checkpoint(mt_run *R, mt_error *err) {
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    mt_ranks_watch_pause(&R->rk, 1); /* the save's collectives have their own timeouts */
    if (mt_disk_state_error(R->store.disk, err)) { /* a state that failed to land: not saved */
        mt_ranks_watch_pause(&R->rk, 0);
        return -1;
    }
    char *js = mt_run_state_json(R), path[4096];
    double t0 = mt_now_s();
    int rc;
    if (R->several) { /* each rank its shard, rank 0 the rest */
        mt_shard_store view = {.layout = R->sl, .w = R->store.w, .m = R->store.m,
                               .v = R->store.v, .disk = R->store.disk};
        rc = mt_shard_ckpt_save(&R->rk.rdv, R->tc->out, R->step, &view, &R->cfg, js,
                                (int)R->tc->keep_last, path, sizeof path, err);
    } else {
        rc = mt_checkpoint_save(R->tc->out, R->step, &R->store, &R->cfg, js,
                                (int)R->tc->keep_last, path, sizeof path, err);
    }
    free(js);
    mt_ranks_watch_pause(&R->rk, 0);
    if (rc) return rc;
    R->saved_step = R->step;
    mt_emitf(&R->ev, MT_EVENT_INFO, "checkpoint: %s (%.1fs)", path, mt_now_s() - t0);
    return 0;
}

static int save_model_files(mt_run *R, const mt_host_store *s, mt_error *err);

/* The whole model's weights on rank 0 (others: NULL), gathered a layer
 * at a time from every rank's parts; -1 on every rank if one failed. */
static int gather_weights(mt_run *R, float **whole, mt_error *err) {
    int lead = mt_ranks_lead(&R->rk), world = R->rk.env.world_size;
    *whole = lead ? mt_aligned_alloc_or_die(64, R->table.total * sizeof(float)) : NULL;
    if (lead) memset(*whole, 0, R->table.total * sizeof(float));
    size_t most = 0;
    for (int l = 0; l < R->table.n_layers; l++) {
        size_t c = mt_shard_chunk(R->table.layers[l].numel, world);
        if (c > most) most = c;
    }
    float *mine = mt_calloc_or_die(most + 1, sizeof *mine);
    float *all = lead ? mt_calloc_or_die(most * (size_t)world + 1, sizeof *all) : NULL;
    int rc = 0;
    for (int l = 0; l < R->table.n_layers && rc == 0; l++) {
        const mt_layer_desc *ld = &R->table.layers[l];
        size_t chunk = mt_shard_chunk(ld->numel, world);
        memcpy(mine, R->store.w + R->parts.layers[l].offset,
               mt_shard_len(&R->sl, l) * sizeof(float));
        rc = mt_rdv_gather(&R->rk.rdv, mine, chunk * sizeof(float), all, err);
        if (rc == 0 && lead) memcpy(*whole + ld->offset, all, ld->numel * sizeof(float));
    }
    free(mine);
    free(all);
    return rc;
}

int mt_run_save_model(mt_run *R, mt_error *err) {
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    mt_ranks_watch_pause(&R->rk, 1); /* the last thing: its gathers have their own timeouts */
    if (R->several) {
        float *whole;
        int rc = gather_weights(R, &whole, err);
        if (rc == 0 && mt_ranks_lead(&R->rk)) {
            mt_host_store s = {.table = &R->table, .w = whole};
            rc = save_model_files(R, &s, err);
        }
        free(whole);
        return mt_ranks_agree(&R->rk, rc, err);
    }
    return save_model_files(R, &R->store, err);
}

/* The chat template the data was rendered with, where transformers reads
 * it: a built-in is written into the saved tokenizer_config.json (the
 * model's own template came with the tokenizer files). */
static int save_chat_template(mt_run *R, const char *dir, mt_error *err) {
    if (!R->data) return 0;
    const char *chat = mt_dataset_stats(R->data).chat_template;
    const char *builtin = chat ? mt_chat_builtin_source(chat) : NULL;
    return builtin ? mt_model_set_chat_template(dir, builtin, err) : 0;
}

/* The final HF model from s (the whole model's weights). */
static int save_model_files(mt_run *R, const mt_host_store *s, mt_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/model", R->tc->out);
    double t0 = mt_now_s();
    mt_dtype dt = R->tc->save_dtype == MT_SAVE_FP32 ? MT_DTYPE_F32 : MT_DTYPE_BF16;
    /* GB as transformers counts them ("5GB" = 5e9 bytes) */
    double gb = R->tc->max_shard_size * 1e9;
    size_t shard = gb >= 1.8e19 ? SIZE_MAX : (size_t)gb;
    if (mt_model_save(s, &R->cfg, dir, dt, shard ? shard : 1, err)) return -1;
    /* with the tokenizer's files: the run's (and its chat template), or the
     * built-in byte tokenizer's */
    bool bytes = !R->tc->tokenizer[0] || !strcmp(R->tc->tokenizer, "bytes");
    if (bytes ? mt_tokenizer_bytes_save(dir, err)
              : mt_model_copy_tokenizer(R->tc->tokenizer, dir, err) ||
                    save_chat_template(R, dir, err))
        return -1;
    mt_emitf(&R->ev, MT_EVENT_INFO, "model: %s (%s, %.1fs)", dir,
             mt_save_dtype_name(R->tc->save_dtype), mt_now_s() - t0);
    return 0;
}
