/* status.h: error reporting inside the library. dm_fail() records a message for
 * dm_last_error() and returns the status, so call sites read `return dm_fail(...)`. */
#ifndef DM_STATUS_H
#define DM_STATUS_H

#include "dmove.h"

#if defined(__GNUC__)
#define DM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DM_PRINTF(a, b)
#endif

dm_status dm_fail(dm_status s, const char *fmt, ...) DM_PRINTF(2, 3);
/* Prepends context ("reading model.safetensors: ") to the current message. */
dm_status dm_fail_context(dm_status s, const char *fmt, ...) DM_PRINTF(2, 3);
void dm_clear_error(void);
/* The status the last dm_fail / dm_fail_context of this thread recorded: for a function
 * that fails with -1 after dm_fail (dm_graph_op, dm_graph_tensor, ...), what its caller
 * returns. DM_ERR_INTERNAL when none was recorded since dm_clear_error (a failure always
 * has a status). */
dm_status dm_last_status(void);

#define DM_TRY(expr)                                                                   \
    do {                                                                               \
        dm_status dm_try_s_ = (expr);                                                  \
        if (dm_try_s_ != DM_OK) return dm_try_s_;                                      \
    } while (0)

/* 1 in the fuzzing build (make fuzz: tests/fuzz), where the checkpoint and plan loaders
 * skip their checksum comparison so that the fuzzer reaches what the checksum guards. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define DM_FUZZING_BUILD 1
#else
#define DM_FUZZING_BUILD 0
#endif

/* Overflow-checked size arithmetic: return 0 on overflow. */
static inline int dm_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int dm_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#endif
