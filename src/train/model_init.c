/* A new Llama-architecture model with random weights, as a Hugging Face
 * directory (`megatrain init`), and what a model is described by. */
#include "train/model_init.h"

#include <sys/stat.h>

#include "data/tokenizer.h"
#include "host/store.h"
#include "io/model_io.h"

void mt_model_shape_defaults(mt_model_shape *s) {
    *s = (mt_model_shape){.hidden = 1024, .layers = 12, .heads = 16, .kv_heads = 4, .ffn = 2816,
                          .max_positions = 2048, .rope_theta = 500000.0, .init_std = 0.02,
                          .seed = 1};
}

void mt_model_info_fill(mt_model_info *info, const mt_config *cfg, const mt_param_table *t) {
    *info = (mt_model_info){.model_type = cfg->model_type, .n_params = (int64_t)t->n_params,
                            .layers = cfg->L, .hidden = cfg->C, .heads = cfg->NH,
                            .kv_heads = cfg->NKV, .ffn = cfg->F, .vocab_size = cfg->V,
                            .max_positions = cfg->max_pos,
                            .tied_embeddings = cfg->tie_embeddings};
}

int mt_model_create(const char *dir, const char *tokpath, const mt_model_shape *sh,
                    mt_model_info *info, mt_error *err) {
    struct stat st;
    if (stat(dir, &st) == 0)
        return mt_errorf(err, "%s already exists; choose a new directory (nothing was written)",
                         dir);
    mt_tokenizer *tok = mt_tokenizer_load(tokpath, err);
    if (!tok) return -1;
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.C = sh->hidden;
    cfg.L = sh->layers;
    cfg.NH = sh->heads;
    cfg.NKV = sh->kv_heads;
    cfg.HD = sh->heads > 0 ? sh->hidden / sh->heads : 0;
    cfg.F = sh->ffn;
    cfg.V = (int64_t)mt_tokenizer_vocab_size(tok);
    cfg.max_pos = sh->max_positions;
    cfg.rope_theta = sh->rope_theta;
    cfg.rms_eps = 1e-5f;
    cfg.tie_embeddings = !sh->untied;
    cfg.bos_id = mt_tokenizer_bos_id(tok);
    cfg.eos_id = mt_tokenizer_eos_id(tok);
    mt_tokenizer_free(tok);
    mt_param_table t = {0};
    mt_host_store s = {0};
    int rc = -1;
    if (sh->hidden % (sh->heads > 0 ? sh->heads : 1)) {
        mt_errorf(err, "--hidden %lld is not a multiple of --heads %lld", (long long)sh->hidden,
                  (long long)sh->heads);
        goto out;
    }
    if (mt_config_validate(&cfg, "the model shape", err) || mt_params_init(&t, &cfg, err) ||
        mt_host_store_create(&s, &t, 0, err))
        goto out;
    mt_host_store_init_random(&s, sh->seed, (float)sh->init_std);
    if (mt_model_save(&s, &cfg, dir, MT_DTYPE_F32, (size_t)5 << 30, err)) goto out;
    if (mt_model_copy_tokenizer(tokpath, dir, err)) goto out;
    if (info) {
        mt_model_info_fill(info, &cfg, &t);
        info->model_type = "llama"; /* cfg is gone on return */
    }
    rc = 0;
out:
    mt_host_store_free(&s);
    mt_params_free(&t);
    return rc;
}
