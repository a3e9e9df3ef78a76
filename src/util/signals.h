/* SIGINT/SIGTERM for the trainer: the first one asks for a clean stop (the
 * trainer polls mt_signals_pending() between steps, and on the CPU between
 * the layers of a step, which it then abandons; it saves a checkpoint and
 * exits); a second one of the same kind is not caught, so a user can still
 * force quit a run that does not stop.
 *
 * This is megatrain's one piece of process-global mutable state, and it has
 * to be: a signal handler receives no context pointer, so the only place it
 * can leave a note is a static `volatile sig_atomic_t`, the one type C
 * guarantees a handler may write. Everything else reads it through these
 * functions. */
#ifndef MT_UTIL_SIGNALS_H
#define MT_UTIL_SIGNALS_H

/* Installs the handlers (again after a stop was handled, to re-arm). */
void mt_signals_install(void);

/* Puts back the handlers that were there before the first
 * mt_signals_install (a program embedding the library keeps its own), and
 * forgets a pending stop. */
void mt_signals_restore(void);

/* Nonzero once SIGINT or SIGTERM arrived since mt_signals_install. */
int mt_signals_pending(void);

/* The number of the last signal caught (SIGINT, SIGTERM), 0 if none. */
int mt_signals_last(void);

#endif
