/* What a run asks of the GPU side of the build without knowing whether it
 * has one: how many GPUs, which one this process drives, and the
 * communicator between the GPUs of a data-parallel run. A build without
 * CUDA answers that there is none (backend/none/device_none.c). */
#ifndef MT_BACKEND_DEVICE_H
#define MT_BACKEND_DEVICE_H

#include "util/error.h"

#define MT_DEVICE_COMM_ID_BYTES 128  /* fits the rendezvous' blob */

typedef struct mt_device_comm mt_device_comm;

/* GPUs visible to this process (0 without CUDA or a driver). */
int mt_device_count(void);

/* Makes GPU `index` this process's (every later CUDA call of every
 * thread of the run goes there); -1 naming the index and how many there
 * are when it does not exist. */
int mt_device_select(int index, mt_error *err);

/* Rank 0 of a run on GPUs: the id every rank joins the communicator by. */
int mt_device_comm_id(unsigned char id[MT_DEVICE_COMM_ID_BYTES], mt_error *err);

/* Joins the communicator of `world` ranks named by id, on the selected
 * GPU; blocks until every rank has joined. */
mt_device_comm *mt_device_comm_open(const unsigned char id[MT_DEVICE_COMM_ID_BYTES], int rank,
                                    int world, mt_error *err);
void mt_device_comm_close(mt_device_comm *c);

#endif
