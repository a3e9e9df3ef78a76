/* Named Llama-family, Qwen, Phi-3, mixture-of-experts, GPT-NeoX, Falcon and Gemma shapes for
 * benchmarks and plan projections (random weights; only the shape matters). */
#ifndef MT_MODEL_PRESETS_H
#define MT_MODEL_PRESETS_H

#include <stdint.h>

#include "model/config.h"

typedef struct mt_preset {
    const char *name;
    const char *what;     /* the published model of that shape */
    int64_t C, L, NH, NKV, F, V;
    int tied;
    /* arch (Qwen: q/k norms or biases), head_dim when it is not C / NH;
     * mixture-of-experts shapes (0 for dense): experts, top-k, expert size */
    mt_arch arch;
    int64_t HD, E, K, FE;
} mt_preset;

/* The names, comma separated, for messages and --help. */
#define MT_PRESET_NAMES                                                                    \
    "1b, 3b, 7b, 8b, 13b, 20b, 34b, 70b, 123b, 405b, qwen2.5-7b, qwen3-8b, mixtral-8x7b, " \
    "qwen3-30b-a3b, qwen3-235b-a22b, pythia-1b, pythia-6.9b, gpt-neox-20b, falcon-7b, "    \
    "falcon-40b, phi3-mini, phi3-medium, gemma2-2b, gemma2-9b, gemma2-27b, gemma3-1b, "    \
    "gemma3-4b, gemma3-12b, gemma3-27b"

/* NULL when the name is unknown. */
const mt_preset *mt_preset_find(const char *name);
/* MT_PRESET_NAMES. */
const char *mt_preset_names(void);
/* cfg from the preset, with seq length T as max_pos. */
void mt_preset_config(const mt_preset *p, int64_t T, mt_config *cfg);

#endif
