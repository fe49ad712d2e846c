/* sysinfo.c: facts about the machine for reports. */
#include "core/sysinfo.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

void dm_cpu_model_name(char *out, size_t n, const char *fallback) {
    if (!out || !n) return;
    snprintf(out, n, "%s", fallback ? fallback : "");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *p = strchr(line, ':');
        if (!p) continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        snprintf(out, n, "%.*s", (int)strcspn(p, "\n"), p);
        break;
    }
    fclose(f); /* read-only: a failing close loses nothing */
}

int64_t dm_thread_stack_bytes(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur < ((rlim_t)1 << 20))
        return (int64_t)8 << 20;
    return rl.rlim_cur > ((rlim_t)1 << 30) ? (int64_t)1 << 30 : (int64_t)rl.rlim_cur;
}

dm_status dm_address_room(int64_t bytes, const char *what) {
    struct rlimit rl;
    if (bytes <= 0 || getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return DM_OK;
    void *p = mmap(NULL, (size_t)bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        if (munmap(p, (size_t)bytes) != 0)
            return dm_fail(DM_ERR_OOM, "could not unmap a test region of address space: %s", strerror(errno));
        return DM_OK;
    }
    return dm_fail(DM_ERR_OOM,
                   "the address-space limit (ulimit -v: %llu MiB) leaves less than the %lld MiB more that %s "
                   "need (OpenBLAS would retry its allocation forever): raise the limit by that much, or use "
                   "fewer threads",
                   (unsigned long long)(rl.rlim_cur >> 20), (long long)(bytes >> 20), what ? what : "dmove");
}

dm_status dm_threads_room(int threads, const char *what) {
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    return dm_address_room((DM_BLAS_BUFFER_BYTES + dm_thread_stack_bytes()) * nt, what);
}

static int g_local_rank = -1;
void dm_set_local_rank(int r) { g_local_rank = r; }
int dm_local_rank(void) { return g_local_rank; }

/* A /proc/meminfo value in bytes (its "NAME:  N kB" line), or -1. */
static int64_t meminfo(const char *text, const char *name) {
    const char *p = strstr(text, name);
    if (!p) return -1;
    p += strlen(name);
    while (*p == ' ' || *p == '\t') p++;
    char *end;
    const long long kb = strtoll(p, &end, 10);
    return end == p || kb < 0 ? -1 : (int64_t)kb * 1024;
}

dm_status dm_memory_room(int64_t bytes, const char *what) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return DM_OK;
    char text[8192];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const int64_t avail = meminfo(text, "MemAvailable:"), swap = meminfo(text, "SwapFree:");
    if (avail < 0) return DM_OK;
    const int64_t room = avail + (swap > 0 ? swap : 0);
    if (bytes <= room) return DM_OK;
    return dm_fail(DM_ERR_OOM, "not enough memory for %s: %.2f GiB, and the machine has %.2f GiB free (memory "
                   "and swap): reduce the batch or the sequence length", what, (double)bytes / (1 << 30),
                   (double)room / (1 << 30));
}
