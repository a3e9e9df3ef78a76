/* Models named as on the Hugging Face Hub ("meta-llama/Llama-3.2-1B"),
 * found in the local cache huggingface_hub keeps: the cache folder is
 * HF_HUB_CACHE (or the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else
 * XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; a model's
 * files are in models--ORG--NAME/snapshots/COMMIT/, and refs/main holds the
 * COMMIT of its main branch. Nothing is downloaded here: the Python package
 * downloads with huggingface_hub when it is installed. */
#ifndef MT_IO_HUB_CACHE_H
#define MT_IO_HUB_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

/* The cache folder (see above) into out; where says which variable set it
 * ("HF_HUB_CACHE", "HF_HOME", ... or "the default"). */
void mt_hub_cache_dir(char *out, size_t cap, const char **where);

/* Whether s has the shape of a Hub name: ORG/NAME of letters, digits,
 * '-', '_' and '.', neither part starting with '.'. */
bool mt_hub_is_name(const char *s);

/* The folder to read a model from: path itself when it exists (or is not
 * shaped like a Hub name); else the cached snapshot of the Hub model it
 * names. 0 with out set; -1 with err saying where it was looked for and
 * how to download it. */
int mt_hub_model_dir(const char *path, char *out, size_t cap, mt_error *err);

#endif
