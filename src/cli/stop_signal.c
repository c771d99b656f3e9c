/* SIGTERM / SIGINT as a stop request, taken on a thread of their own (see stop_signal.h). */
#include "cli/stop_signal.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

static volatile sig_atomic_t *g_flag;

static void on_stop_signal(int sig) {
    (void)sig;
    *g_flag = 1; /* SA_RESETHAND: the next one has the default action (ends the process) */
}

/* The thread that takes the signals: they are unblocked here only (and in threads libraries
 * started before the caller blocked them, which wait idle). */
static void *signal_thread(void *arg) {
    sigset_t *set = arg;
    pthread_sigmask(SIG_UNBLOCK, set, NULL);
    for (;;) pause();
    return NULL;
}

int dt_cli_stop_on_signals(volatile sig_atomic_t *flag) {
    static sigset_t set;
    g_flag = flag;
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, signal_thread, &set);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* after the thread exists: a signal always has a taker */
    return 0;
}
