/* Hub model names resolved in the local Hugging Face cache (hub_cache.h). */
#include "io/hub_cache.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void mt_hub_cache_dir(char *out, size_t cap, const char **where) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) *where = "HF_HUB_CACHE", snprintf(out, cap, "%s", v);
    else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v)
        *where = "HUGGINGFACE_HUB_CACHE", snprintf(out, cap, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v) *where = "HF_HOME", snprintf(out, cap, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        *where = "XDG_CACHE_HOME", snprintf(out, cap, "%s/huggingface/hub", v);
    else
        *where = "the default", snprintf(out, cap, "%s/.cache/huggingface/hub",
                                         (v = getenv("HOME")) && *v ? v : ".");
}

static bool name_part(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i])) return false;
    return true;
}

bool mt_hub_is_name(const char *s) {
    const char *slash = strchr(s, '/');
    return slash && !strchr(slash + 1, '/') && name_part(s, (size_t)(slash - s)) &&
           name_part(slash + 1, strlen(slash + 1));
}

/* The commit refs/main names, or the only snapshot when there is no
 * refs/main; false when neither. */
static bool snapshot_commit(const char *repo, char *commit, size_t cap) {
    char path[4300];
    snprintf(path, sizeof path, "%s/refs/main", repo);
    FILE *f = fopen(path, "r");
    if (f) {
        bool ok = fgets(commit, (int)cap, f) != NULL;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
        return ok && commit[0];
    }
    snprintf(path, sizeof path, "%s/snapshots", repo);
    DIR *d = opendir(path);
    if (!d) return false;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++, snprintf(commit, cap, "%s", e->d_name);
    closedir(d);
    return n == 1;
}

int mt_hub_model_dir(const char *path, char *out, size_t cap, mt_error *err) {
    if (exists(path) || !mt_hub_is_name(path)) {
        if (strlen(path) >= cap) return mt_errorf(err, "model: the path '%.64s...' is too long", path);
        snprintf(out, cap, "%s", path);
        return 0;
    }
    char cache[4096], repo[4200], commit[256], snap[4600];
    const char *where;
    mt_hub_cache_dir(cache, sizeof cache, &where);
    const char *slash = strchr(path, '/');
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - path), path, slash + 1);
    if (snapshot_commit(repo, commit, sizeof commit)) {
        snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, commit);
        char config[4700];
        snprintf(config, sizeof config, "%s/config.json", snap);
        if (exists(config) && strlen(snap) < cap) {
            snprintf(out, cap, "%s", snap);
            return 0;
        }
    }
    return mt_errorf(err, "model '%s' is not a folder here, nor a model in the Hugging Face cache "
                     "(%s, from %s): download it with `hf download %s` (pip install "
                     "huggingface_hub; or train from Python, whose megatrain.train(model=...) "
                     "downloads it), or give the model's folder (config.json, *.safetensors)",
                     path, cache, where, path);
}
