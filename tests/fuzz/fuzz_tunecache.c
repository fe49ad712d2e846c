/* fuzz_tunecache: the tune cache's reader (cache_load, static in src/tune/tune.c, which
 * this harness compiles in whole instead of the library's copy) and lookups on what it
 * keeps. */
#include "../../src/tune/tune.c"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, "tune-cache.tsv");
    cache c;
    memset(&c, 0, sizeof c);
    if (cache_load(&c, path) == DM_OK) {
        double secs;
        for (int k = 0; k < c.n; k++) {
            if (!cache_find(&c, c.e[k].key, &secs)) abort(); /* every key kept is found */
            if (!(secs > 0 && (secs <= 3600.0 || isinf(secs)))) abort(); /* only times (inf: cannot run) */
        }
        (void)cache_find(&c, "absent", &secs);
    }
    else (void)fuzz_rejected();
    cache_free(&c);
    return 0;
}
