/* Sentences from a tiny grammar: subject, verb, object, place, time. The
 * structure is learnable by a small model in a few hundred steps, which is
 * what the demo needs to show a falling loss and a readable sample. */
#include "data/builtin_text.h"

#include <stdio.h>
#include <string.h>

#include "util/mem.h"

#define COUNT(a) (sizeof(a) / sizeof *(a))

static const char *subjects[] = {
    "The old man", "A young woman", "The farmer", "My brother", "The teacher", "A small child",
    "The captain", "Our neighbour", "The doctor", "A tired traveller", "The baker", "Her sister",
};
static const char *verbs[] = {
    "walked to", "looked at", "painted", "found", "carried", "remembered", "visited",
    "cleaned", "watched", "opened", "sold", "wrote about",
};
static const char *objects[] = {
    "the red door", "a wooden boat", "the quiet garden", "an old letter", "the black horse",
    "a bright lamp", "the long road", "a heavy box", "the green hill", "the broken clock",
};
static const char *places[] = {
    "near the river", "in the village", "behind the church", "at the market",
    "under the bridge", "by the sea", "in the city", "on the farm",
};
static const char *times[] = {
    "in the morning", "after dinner", "before the storm", "on Sunday", "at night",
    "in the spring", "every day", "last winter",
};

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

char *mt_builtin_text(size_t bytes, uint64_t seed, size_t *len) {
    size_t cap = bytes + 256, n = 0;
    char *buf = mt_malloc_or_die(cap);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    while (n < bytes) {
        const char *sub = subjects[next(&s) % COUNT(subjects)];
        const char *verb = verbs[next(&s) % COUNT(verbs)];
        const char *obj = objects[next(&s) % COUNT(objects)];
        const char *place = places[next(&s) % COUNT(places)];
        const char *time = times[next(&s) % COUNT(times)];
        int w;
        if (next(&s) % 2)
            w = snprintf(buf + n, cap - n, "%s %s %s %s %s. ", sub, verb, obj, place, time);
        else
            w = snprintf(buf + n, cap - n, "%s %s %s %s. ", sub, verb, obj, place);
        if (w < 0 || (size_t)w >= cap - n) break;
        n += (size_t)w;
        if (next(&s) % 5 == 0 && n + 1 < cap) buf[n++] = '\n';
    }
    buf[n] = 0;
    *len = n;
    return buf;
}
