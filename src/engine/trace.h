/* A timeline of the step: spans on named tracks (the three CUDA streams,
 * the optimizer thread), written as Chrome trace JSON (chrome://tracing,
 * Perfetto) to see what overlaps with what. */
#ifndef MT_ENGINE_TRACE_H
#define MT_ENGINE_TRACE_H

#include <stddef.h>

#include "util/error.h"

typedef struct mt_trace_span {
    char name[32];
    int track;          /* index into the track names */
    double start_us, dur_us;
} mt_trace_span;

typedef struct mt_trace {
    mt_trace_span *spans;
    size_t n, cap;
} mt_trace;

enum { MT_TRACK_H2D, MT_TRACK_COMPUTE, MT_TRACK_D2H, MT_TRACK_OPTIMIZER, MT_TRACK_COLLECTIVES,
       MT_TRACK_COUNT };

void mt_trace_add(mt_trace *t, int track, const char *name, double start_us, double dur_us);
int mt_trace_write(const mt_trace *t, const char *path, mt_error *err);
void mt_trace_free(mt_trace *t);

/* Microseconds on the host clock that trace timestamps use. */
double mt_trace_now_us(void);

#endif
