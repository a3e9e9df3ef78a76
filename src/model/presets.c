/* Shapes from the published config.json files of each model. */
#include "model/presets.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const mt_preset presets[] = {
    {"1b", "Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256, 1, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"3b", "Llama-3.2-3B", 3072, 28, 24, 8, 8192, 128256, 1, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"7b", "Llama-2-7B", 4096, 32, 32, 32, 11008, 32000, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"8b", "Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"13b", "Llama-2-13B", 5120, 40, 40, 40, 13824, 32000, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"20b", "a 20B Llama-3 shape", 6144, 48, 48, 8, 16384, 128256, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"34b", "CodeLlama-34B", 8192, 48, 64, 8, 22016, 32000, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"70b", "Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"123b", "Mistral-Large-2 (123B)", 12288, 88, 96, 8, 28672, 32768, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"405b", "Llama-3.1-405B", 16384, 126, 128, 8, 53248, 128256, 0, MT_ARCH_LLAMA, 0, 0, 0, 0},
    {"qwen2.5-7b", "Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, 0, MT_ARCH_QWEN2, 0, 0, 0, 0},
    {"qwen3-8b", "Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, 0, MT_ARCH_QWEN3, 128, 0, 0, 0},
    {"mixtral-8x7b", "Mixtral-8x7B", 4096, 32, 32, 8, 14336, 32000, 0, MT_ARCH_MIXTRAL, 0, 8,
     2, 14336},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, 151936, 0, MT_ARCH_QWEN3_MOE, 128,
     128, 8, 768},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", 4096, 94, 64, 4, 12288, 151936, 0, MT_ARCH_QWEN3_MOE,
     128, 128, 8, 1536},
    {"pythia-1b", "Pythia-1B", 2048, 16, 8, 8, 8192, 50304, 0, MT_ARCH_GPT_NEOX, 0, 0, 0, 0},
    {"pythia-6.9b", "Pythia-6.9B", 4096, 32, 32, 32, 16384, 50432, 0, MT_ARCH_GPT_NEOX, 0, 0,
     0, 0},
    {"gpt-neox-20b", "GPT-NeoX-20B", 6144, 44, 64, 64, 24576, 50432, 0, MT_ARCH_GPT_NEOX, 0, 0,
     0, 0},
    /* tiiuae/falcon-7b and falcon-40b's config.json; both tie lm_head */
    {"falcon-7b", "Falcon-7B", 4544, 32, 71, 1, 18176, 65024, 1, MT_ARCH_FALCON, 0, 0, 0, 0},
    {"falcon-40b", "Falcon-40B", 8192, 60, 128, 8, 32768, 65024, 1, MT_ARCH_FALCON, 0, 0, 0, 0},
    /* microsoft/Phi-3-mini-4k-instruct's and Phi-3-medium-4k-instruct's
     * config.json: rope_theta 10000, rms_norm_eps 1e-5, untied */
    {"phi3-mini", "Phi-3-mini-4k", 3072, 32, 32, 32, 8192, 32064, 0, MT_ARCH_PHI3, 0, 0, 0, 0},
    {"phi3-medium", "Phi-3-medium-4k", 5120, 40, 40, 10, 17920, 32064, 0, MT_ARCH_PHI3, 0, 0, 0,
     0},
    /* google/gemma-2-2b, -9b, -27b's config.json: every other layer slides over
     * 4096 keys; query_pre_attn_scalar is head_dim but for 27B (hidden / heads) */
    {"gemma2-2b", "Gemma-2-2B", 2304, 26, 8, 4, 9216, 256000, 1, MT_ARCH_GEMMA2, 256, 0, 0, 0},
    {"gemma2-9b", "Gemma-2-9B", 3584, 42, 16, 8, 14336, 256000, 1, MT_ARCH_GEMMA2, 256, 0, 0, 0},
    {"gemma2-27b", "Gemma-2-27B", 4608, 46, 32, 16, 36864, 256000, 1, MT_ARCH_GEMMA2, 128, 0, 0,
     0},
    /* google/gemma-3-1b-pt's config.json, and text_config of gemma-3-4b-pt, -12b-pt,
     * -27b-pt (whose global layers scale rope linearly by 8) */
    {"gemma3-1b", "Gemma-3-1B", 1152, 26, 4, 1, 6912, 262144, 1, MT_ARCH_GEMMA3_TEXT, 256, 0, 0,
     0},
    {"gemma3-4b", "Gemma-3-4B (text)", 2560, 34, 8, 4, 10240, 262208, 1, MT_ARCH_GEMMA3_TEXT, 256,
     0, 0, 0},
    {"gemma3-12b", "Gemma-3-12B (text)", 3840, 48, 16, 8, 15360, 262208, 1, MT_ARCH_GEMMA3_TEXT,
     256, 0, 0, 0},
    {"gemma3-27b", "Gemma-3-27B (text)", 5376, 62, 32, 16, 21504, 262208, 1, MT_ARCH_GEMMA3_TEXT,
     128, 0, 0, 0},
};

/* What a Gemma preset adds (same config.json files): sliding_window,
 * query_pre_attn_scalar, and the linear rope factor of Gemma 3's global
 * layers (0: none). */
static const struct {
    const char *name;
    int64_t window;
    double qpas, rope_linear;
} gemma_fields[] = {
    {"gemma2-2b", 4096, 256, 0},  {"gemma2-9b", 4096, 256, 0},   {"gemma2-27b", 4096, 144, 0},
    {"gemma3-1b", 512, 256, 0},   {"gemma3-4b", 1024, 256, 8},   {"gemma3-12b", 1024, 256, 8},
    {"gemma3-27b", 1024, 168, 8},
};

/* The Gemma fields of preset p. */
static void gemma_preset(const mt_preset *p, mt_config *cfg) {
    bool g3 = p->arch == MT_ARCH_GEMMA3_TEXT;
    cfg->HD = p->HD;
    mt_config_gemma_defaults(cfg, g3);
    cfg->rope_theta = g3 ? 1e6 : 10000.0;
    for (size_t i = 0; i < sizeof gemma_fields / sizeof *gemma_fields; i++) {
        if (strcmp(gemma_fields[i].name, p->name)) continue;
        cfg->sliding_window = gemma_fields[i].window;
        cfg->query_pre_attn_scalar = gemma_fields[i].qpas;
        if (gemma_fields[i].rope_linear > 0) {
            cfg->rope_kind = MT_ROPE_LINEAR;
            cfg->rope_factor = gemma_fields[i].rope_linear;
        }
    }
}

const mt_preset *mt_preset_find(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(name, presets[i].name)) return &presets[i];
    return NULL;
}

const char *mt_preset_names(void) { return MT_PRESET_NAMES; }

void mt_preset_config(const mt_preset *p, int64_t T, mt_config *cfg) {
    mt_config_default_tiny(cfg);
    cfg->C = p->C;
    cfg->L = p->L;
    cfg->NH = p->NH;
    cfg->NKV = p->NKV;
    cfg->F = p->F;
    cfg->V = p->V;
    cfg->HD = p->C / p->NH;
    cfg->tie_embeddings = p->tied;
    cfg->max_pos = T;
    cfg->rms_eps = 1e-5f;
    if (p->arch == MT_ARCH_LLAMA) return;
    if (p->arch == MT_ARCH_GPT_NEOX) { /* rotary_pct 0.25, rotary_emb_base 10000 */
        mt_config_neox_defaults(cfg);
        cfg->rope_theta = 10000.0;
        return;
    }
    if (p->arch == MT_ARCH_FALCON) { /* FalconConfig's rope_theta 10000 */
        /* Falcon-7B is multi-query, Falcon-40B the new decoder with 8 kv heads */
        mt_config_falcon_defaults(cfg, p->NKV > 1);
        cfg->rope_theta = 10000.0;
        return;
    }
    if (p->arch == MT_ARCH_PHI3) { /* no rope scaling, full attention */
        mt_config_phi3_defaults(cfg);
        cfg->rope_theta = 10000.0;
        cfg->bos_id = 1;
        cfg->eos_id = 32000;
        return;
    }
    if (mt_arch_is_gemma(p->arch)) {
        gemma_preset(p, cfg);
        return;
    }
    cfg->arch = p->arch;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s",
             p->arch == MT_ARCH_MIXTRAL ? "mixtral"
             : p->arch == MT_ARCH_QWEN2 ? "qwen2"
             : p->arch == MT_ARCH_QWEN3 ? "qwen3"
                                        : "qwen3_moe");
    if (p->HD) cfg->HD = p->HD;
    cfg->qk_norm = p->arch == MT_ARCH_QWEN3 || p->arch == MT_ARCH_QWEN3_MOE;
    cfg->qkv_bias = p->arch == MT_ARCH_QWEN2;
    cfg->rms_eps = 1e-6f;
    cfg->rope_theta = 1e6;
    if (!p->E) return;
    cfg->moe = (mt_moe_config){.E = p->E, .K = p->K, .FE = p->FE, .sparse_step = 1,
                               .norm_topk = true, .aux_coef = 0.001};
}
