/* fuzz_util.h: what the libFuzzer harnesses (tests/fuzz/fuzz_*.c, `make fuzz`) share.
 * The loaders read paths, so an input is written to a file in this process's own
 * temporary directory (removed at exit) and the loader reads it there. */
#ifndef DM_FUZZ_UTIL_H
#define DM_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dmove.h"

static char fuzz_dir_[256];

static void fuzz_cleanup_(void) {
    if (!fuzz_dir_[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_);
}

/* The process's directory, made on first use. */
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/dmove-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fuzz_dir_)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_cleanup_);
    }
    return fuzz_dir_;
}

/* Writes data to <dir>/<name>; returns the path (a static buffer). */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: writing the input");
        abort();
    }
    return path;
}

/* An input the loader refused: 0 (libFuzzer's "go on"); with FUZZ_VERBOSE set, prints
 * why (to see which seeds a loader takes: fuzz_NAME -runs=0 corpus/NAME). */
static inline int fuzz_rejected(void) {
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "refused: %s\n", dm_last_error());
    return 0;
}

#endif
