/* status.c: thread-local last-error message and status names. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];
static _Thread_local dm_status g_status;

dm_status dm_fail(dm_status s, const char *fmt, ...) {
    g_status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}

dm_status dm_fail_context(dm_status s, const char *fmt, ...) {
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    g_status = s;
    snprintf(g_msg, sizeof g_msg, "%s%s", prefix, old);
    return s;
}

void dm_clear_error(void) {
    g_msg[0] = 0;
    g_status = DM_OK;
}

dm_status dm_last_status(void) { return g_status != DM_OK ? g_status : DM_ERR_INTERNAL; }

const char *dm_last_error(void) { return g_msg[0] ? g_msg : "no error"; }

const char *dm_status_name(dm_status s) {
    switch (s) {
    case DM_OK: return "ok";
    case DM_ERR_INVALID_ARG: return "invalid argument";
    case DM_ERR_OOM: return "out of memory";
    case DM_ERR_IO: return "i/o error";
    case DM_ERR_FORMAT: return "bad file format";
    case DM_ERR_SHAPE: return "wrong shape or dtype";
    case DM_ERR_NOT_FOUND: return "not found";
    case DM_ERR_BACKEND: return "backend failure";
    case DM_ERR_UNSUPPORTED: return "unsupported";
    case DM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *dm_class_name(dm_op_class c) {
    switch (c) {
    case DM_CLASS_CONTRACTION: return "contraction";
    case DM_CLASS_NORMALIZATION: return "normalization";
    case DM_CLASS_ELEMENTWISE: return "elementwise";
    default: return "?";
    }
}
