/* dtrain train: SIGTERM and SIGINT as a request to stop at the next step (stop_signal.c). */
#ifndef DT_CLI_STOP_SIGNAL_H
#define DT_CLI_STOP_SIGNAL_H

#include <signal.h>

/* From here on the first SIGTERM or SIGINT sets *flag (the trainer finishes its step, writes a
 * checkpoint and exits); a second one ends the process as the signal does by default. The
 * signals are taken by a thread of their own: the calling thread and every thread it starts
 * later block them, so a signal never interrupts a kernel (a JIT kernel may keep data below the
 * stack pointer, where a signal frame is written) nor a system call with EINTR. Returns 0, or
 * -1 with errno when the thread cannot start (the signals then stay with the caller). */
int dt_cli_stop_on_signals(volatile sig_atomic_t *flag);

#endif
