/* The CUDA backend's timeline (mt_cuda_backend_set_trace): spans between
 * pairs of events on a stream, resolved against one base event at the end
 * of each step. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/backend_cuda_internal.h"
#include "kernels/cuda_common.h"
#include "util/mem.h"

/* Starts a span on `stream`; returns its index or -1 (tracing off/full). */
int mt_cuda_span_begin(cuda_backend *cb, cudaStream_t stream, int track, const char *fmt, int a) {
    if (!cb->trace || cb->n_tspans >= TRACE_SPANS) return -1;
    int i = cb->n_tspans++;
    cb->tspan[i].track = track;
    snprintf(cb->tspan[i].name, sizeof cb->tspan[i].name, fmt, a);
    CUDA_CHECK(cudaEventRecord(cb->tev[2 * i], stream));
    return i;
}

void mt_cuda_span_end(cuda_backend *cb, cudaStream_t stream, int i) {
    if (cb->trace && i >= 0) CUDA_CHECK(cudaEventRecord(cb->tev[2 * i + 1], stream));
}

void mt_cuda_backend_set_trace(mt_backend *be, mt_trace *trace) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->tev) {
        cb->tev = mt_calloc_or_die(2 * TRACE_SPANS, sizeof *cb->tev);
        for (int i = 0; i < 2 * TRACE_SPANS; i++) CUDA_CHECK(cudaEventCreate(&cb->tev[i]));
        CUDA_CHECK(cudaEventCreate(&cb->ev_base));
    }
    /* One moment seen by both clocks: the event, then the host, at once. */
    CUDA_CHECK(cudaEventRecord(cb->ev_base, cb->s_comp));
    CUDA_CHECK(cudaEventSynchronize(cb->ev_base));
    cb->trace_base_us = mt_trace_now_us();
    cb->trace = trace;
}
