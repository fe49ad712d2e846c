/* testutil.h: tiny test harness: CHECK prints the failing expression and counts it;
 * tests end with TEST_END() which prints a summary and returns non-zero on failure. */
#ifndef DM_TESTUTIL_H
#define DM_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int g_fail = 0, g_checks = 0;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        g_checks++;                                                                    \
        if (!(cond)) {                                                                 \
            g_fail++;                                                                  \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
        }                                                                              \
    } while (0)

#define CHECK_OK(expr)                                                                 \
    do {                                                                               \
        g_checks++;                                                                    \
        dm_status s_ = (expr);                                                         \
        if (s_ != DM_OK) {                                                             \
            g_fail++;                                                                  \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,   \
                    dm_status_name(s_), dm_last_error());                              \
        }                                                                              \
    } while (0)

#define TEST_END()                                                                     \
    do {                                                                               \
        printf("%s: %d checks, %d failed\n", __FILE__, g_checks, g_fail);              \
        return g_fail ? 1 : 0;                                                         \
    } while (0)

/* The worst of a running maximum error and a new one, where a NaN (a value never written,
 * a kernel that made one) counts as infinite: `worst = worst_of(worst, e)` then fails a
 * `CHECK(worst < tol)`, as `if (e > worst) worst = e` would not. */
/* Where a test's CUDA backend runs, for its report: "GPU" with DMOVE_CUDA_EMULATE=0 (the
 * tests emulate on the host unless the variable is set), else "emulated". */
static inline const char *cuda_where(void) {
    const char *e = getenv("DMOVE_CUDA_EMULATE");
    return e && e[0] == '0' && !e[1] ? "GPU" : "emulated";
}

static inline double worst_of(double worst, double e) { return e <= worst ? worst : isnan(e) ? INFINITY : e; }

/* Relative error ||a - b|| / ||b|| in double (||b|| == 0: ||a||). */
static inline double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double x = (double)a[i] - (double)b[i];
        d += x * x;
        r += (double)b[i] * (double)b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

#endif
