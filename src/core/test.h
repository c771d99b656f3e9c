/* A minimal test harness shared by every *_test.c: CHECK macros that count failures and a
 * summary line. Each test binary exits 0 when all of its checks pass. */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int dt_test_checks, dt_test_failures;

#define CHECK(cond)                                                         \
    do {                                                                    \
        dt_test_checks++;                                                   \
        if (!(cond)) {                                                      \
            dt_test_failures++;                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
    } while (0)

#define CHECK_MSG(cond, ...)                                                \
    do {                                                                    \
        dt_test_checks++;                                                   \
        if (!(cond)) {                                                      \
            dt_test_failures++;                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

/* Checks a dt_status call returns DT_OK, printing the last error otherwise. */
#define CHECK_OK(call)                                                                \
    do {                                                                              \
        dt_status chk_s_ = (call);                                                    \
        CHECK_MSG(chk_s_ == DT_OK, "%s: %s", dt_status_str(chk_s_), dt_last_error()); \
    } while (0)

/* Max |a-b| over n floats. */
static inline double dt_test_maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

/* Makes a temporary directory from tmpl ("/tmp/NAME-XXXXXX") into dir (cap bytes): 0, or -1
 * after saying why. */
static inline int dt_test_mkdtemp(char *dir, size_t cap, const char *tmpl) {
    snprintf(dir, cap, "%s", tmpl);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* Prints "name: N checks, M failures" and returns the process exit code. */
static inline int dt_test_summary(const char *name) {
    printf("%s: %d checks, %d failures\n", name, dt_test_checks, dt_test_failures);
    return dt_test_failures ? 1 : 0;
}

#endif
