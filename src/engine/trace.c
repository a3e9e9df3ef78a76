/* Chrome trace output: one "complete" event per span. */
#include "engine/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/mem.h"

static const char *track_names[MT_TRACK_COUNT] = {"H2D stream", "compute stream", "D2H stream",
                                                  "CPU optimizer", "collectives stream"};

void mt_trace_add(mt_trace *t, int track, const char *name, double start_us, double dur_us) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->spans = mt_realloc_or_die(t->spans, t->cap * sizeof *t->spans);
    }
    mt_trace_span *s = &t->spans[t->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->track = track;
    s->start_us = start_us;
    s->dur_us = dur_us;
}

int mt_trace_write(const mt_trace *t, const char *path, mt_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return mt_errorf(err, "%s: cannot write the trace: %s", path, strerror(errno));
    fprintf(f, "{\"traceEvents\": [\n");
    for (int k = 0; k < MT_TRACK_COUNT; k++)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                "\"args\": {\"name\": \"%s\"}},\n", k, track_names[k]);
    double t0 = t->n ? t->spans[0].start_us : 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->spans[i].start_us < t0) t0 = t->spans[i].start_us;
    for (size_t i = 0; i < t->n; i++) {
        const mt_trace_span *s = &t->spans[i];
        fprintf(f, "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f, "
                "\"dur\": %.1f}%s\n", s->name, s->track, s->start_us - t0, s->dur_us,
                i + 1 < t->n ? "," : "");
    }
    fprintf(f, "]}\n");
    if (fclose(f)) return mt_errorf(err, "%s: write failed", path);
    return 0;
}

void mt_trace_free(mt_trace *t) {
    free(t->spans);
    memset(t, 0, sizeof *t);
}

double mt_trace_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}
