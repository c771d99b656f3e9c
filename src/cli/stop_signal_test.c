/* Tests for the stop signals (stop_signal.c): after dt_cli_stop_on_signals, the calling thread
 * and the threads it starts block SIGTERM and SIGINT (so a signal never lands in a oneDNN JIT
 * kernel that points rsp at the heap, oneDNN issue #4845), and a SIGTERM sent to the process
 * still sets the flag, taken by the signal thread. */
#include "cli/stop_signal.c"
#include "core/test.h"

#include <stdbool.h>
#include <time.h>

static volatile sig_atomic_t g_test_stop;

static bool blocks_stop_signals(void) {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    return sigismember(&now, SIGTERM) == 1 && sigismember(&now, SIGINT) == 1;
}

static void *report_mask(void *arg) {
    *(bool *)arg = blocks_stop_signals();
    return NULL;
}

int main(void) {
    CHECK_MSG(!blocks_stop_signals(), "the signals are blocked before the call");
    CHECK(dt_cli_stop_on_signals(&g_test_stop) == 0);
    CHECK_MSG(blocks_stop_signals(), "the calling (training) thread still takes SIGTERM/SIGINT");
    bool child = false;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, report_mask, &child) == 0);
    pthread_join(th, NULL);
    CHECK_MSG(child, "a thread the trainer starts later (loader, ps exchange) takes SIGTERM/SIGINT");
    struct sigaction now;
    sigaction(SIGTERM, NULL, &now);
    CHECK_MSG(now.sa_handler == on_stop_signal && (now.sa_flags & SA_RESETHAND), "SIGTERM's handler");
    /* the process gets SIGTERM: the signal thread takes it and sets the flag (wait for it, or
     * give up after 60 s: a missing taker would leave it pending forever) */
    CHECK(kill(getpid(), SIGTERM) == 0);
    for (int i = 0; i < 60000 && !g_test_stop; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
    CHECK_MSG(g_test_stop == 1, "SIGTERM did not set the stop flag");
    sigset_t pending;
    sigpending(&pending);
    CHECK_MSG(sigismember(&pending, SIGTERM) == 0, "SIGTERM is still pending on the training thread");
    printf("stop_signal_test: %d checks, %d failures\n", dt_test_checks, dt_test_failures);
    return dt_test_failures != 0;
}
