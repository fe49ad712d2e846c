/* hugealloc.c: see hugealloc.h. */
#include "core/hugealloc.h"

#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_BYTES ((size_t)2 << 20)

void *dm_alloc_huge(size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes < HUGE_BYTES) return aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (bytes > (size_t)-1 - HUGE_BYTES) return NULL;
    size_t n = (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
    void *p = aligned_alloc(HUGE_BYTES, n);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    /* advice only: a refusal (EINVAL without THP) leaves ordinary pages, still correct */
    if (madvise(p, n, MADV_HUGEPAGE) != 0) {
        /* nothing to undo */
    }
#endif
    return p;
}
