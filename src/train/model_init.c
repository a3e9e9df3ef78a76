/* A new model with random weights, as a Hugging Face directory (`megatrain
 * init`), dense or mixture-of-experts, and what a model is described by. */
#include "train/model_init.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "data/tokenizer.h"
#include "host/store.h"
#include "io/model_io.h"

void mt_model_shape_defaults(mt_model_shape *s) {
    *s = (mt_model_shape){.hidden = 1024, .layers = 12, .heads = 16, .kv_heads = 4, .ffn = 2816,
                          .max_positions = 2048, .rope_theta = 500000.0, .init_std = 0.02,
                          .seed = 1, .experts = 8, .experts_per_tok = 2, .norm_topk = -1};
}

void mt_model_info_fill(mt_model_info *info, const mt_config *cfg, const mt_param_table *t) {
    *info = (mt_model_info){.model_type = cfg->model_type, .n_params = (int64_t)t->n_params,
                            .layers = cfg->L, .hidden = cfg->C, .heads = cfg->NH,
                            .kv_heads = cfg->NKV, .ffn = cfg->F, .vocab_size = cfg->V,
                            .max_positions = cfg->max_pos,
                            .tied_embeddings = cfg->tie_embeddings,
                            .experts = cfg->moe.E, .experts_per_tok = cfg->moe.K,
                            .active_params = mt_config_active_params(cfg)};
}

const char *const mt_model_init_types[] = {"llama", "mistral", "qwen2", "qwen3", "mixtral",
                                           "qwen2_moe", "qwen3_moe", "gpt_neox", "falcon",
                                           "phi3", "gemma2", "gemma3_text", NULL};
static const mt_arch archs[] = {MT_ARCH_LLAMA, MT_ARCH_MISTRAL, MT_ARCH_QWEN2, MT_ARCH_QWEN3,
                                MT_ARCH_MIXTRAL, MT_ARCH_QWEN2_MOE, MT_ARCH_QWEN3_MOE,
                                MT_ARCH_GPT_NEOX, MT_ARCH_FALCON, MT_ARCH_PHI3, MT_ARCH_GEMMA2,
                                MT_ARCH_GEMMA3_TEXT};
_Static_assert(sizeof archs / sizeof *archs + 1 ==
                   sizeof mt_model_init_types / sizeof *mt_model_init_types,
               "an architecture for every model type");

/* The architecture of model_type and what the type implies (q/k/v bias,
 * q/k norm, experts); returns the type's name, or NULL if unknown. */
static const char *set_type(mt_config *c, const char *model_type, const mt_model_shape *sh) {
    int k = -1;
    for (int i = 0; mt_model_init_types[i]; i++)
        if (!strcmp(model_type, mt_model_init_types[i])) k = i;
    if (k < 0) return NULL;
    c->arch = archs[k];
    snprintf(c->model_type, sizeof c->model_type, "%s", mt_model_init_types[k]);
    c->qkv_bias = c->arch == MT_ARCH_QWEN2 || c->arch == MT_ARCH_QWEN2_MOE;
    c->qk_norm = c->arch == MT_ARCH_QWEN3 || c->arch == MT_ARCH_QWEN3_MOE;
    if (!mt_arch_has_experts(c->arch)) return mt_model_init_types[k];
    mt_moe_config *m = &c->moe;
    m->E = sh->experts;
    m->K = sh->experts_per_tok;
    m->FE = c->arch == MT_ARCH_MIXTRAL || !sh->expert_ffn ? sh->ffn : sh->expert_ffn;
    if (c->arch == MT_ARCH_QWEN2_MOE) m->FS = sh->shared_expert_ffn ? sh->shared_expert_ffn : sh->ffn;
    m->norm_topk = c->arch == MT_ARCH_MIXTRAL ? true
                   : sh->norm_topk >= 0   ? sh->norm_topk != 0
                                          : c->arch == MT_ARCH_QWEN3_MOE;
    m->sparse_step = 1;
    m->aux_coef = c->arch == MT_ARCH_MIXTRAL ? 0.02 : 0.001; /* the published configs' */
    return mt_model_init_types[k];
}

int mt_model_create(const char *dir, const char *tokpath, const mt_model_shape *sh,
                    mt_model_info *info, mt_error *err) {
    struct stat st;
    if (stat(dir, &st) == 0)
        return mt_errorf(err, "%s already exists; choose a new directory (nothing was written)",
                         dir);
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    const char *type = set_type(&cfg, sh->model_type ? sh->model_type : "llama", sh);
    if (!type)
        return mt_errorf(err, "model type \"%s\" is not one megatrain makes; use llama, mistral, "
                         "qwen2, qwen3, phi3, mixtral, qwen2_moe, qwen3_moe, gpt_neox, falcon, "
                         "gemma2 or gemma3_text",
                         sh->model_type);
    if (cfg.moe.E > 0 && (sh->experts_per_tok < 1 || sh->experts_per_tok > sh->experts))
        return mt_errorf(err, "--experts-per-tok %lld must be in 1..--experts (%lld)",
                         (long long)sh->experts_per_tok, (long long)sh->experts);
    bool bytes = !strcmp(tokpath, "bytes");  /* the built-in tokenizer: no files to copy */
    mt_tokenizer *tok = bytes ? mt_tokenizer_bytes() : mt_tokenizer_load(tokpath, err);
    if (!tok) return -1;
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
    if (cfg.arch == MT_ARCH_GPT_NEOX) mt_config_neox_defaults(&cfg); /* --kv-heads, tying: n/a */
    /* falcon: Falcon-7B's layout with one kv head, the new decoder's with more */
    if (cfg.arch == MT_ARCH_FALCON) mt_config_falcon_defaults(&cfg, cfg.NKV > 1);
    if (cfg.arch == MT_ARCH_PHI3) mt_config_phi3_defaults(&cfg);
    /* gemma: the published configs' soft-caps, windows and rope bases, tied */
    if (mt_arch_is_gemma(cfg.arch)) mt_config_gemma_defaults(&cfg, cfg.arch == MT_ARCH_GEMMA3_TEXT);
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
    if (!bytes && mt_model_copy_tokenizer(tokpath, dir, err)) goto out;
    if (info) {
        mt_model_info_fill(info, &cfg, &t);
        info->model_type = type; /* cfg is gone on return */
    }
    rc = 0;
out:
    mt_host_store_free(&s);
    mt_params_free(&t);
    return rc;
}
