/* sysinfo.h: facts about the machine for reports (CPU model name). */
#ifndef DM_SYSINFO_H
#define DM_SYSINFO_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The "model name" of /proc/cpuinfo, or `fallback` when it cannot be read. */
void dm_cpu_model_name(char *out, size_t n, const char *fallback);

/* One of OpenBLAS's buffers: 128 MiB and its guard pages. It maps one or two when it
 * starts and one per thread that runs a GEMM. */
#define DM_BLAS_BUFFER_BYTES ((int64_t)136 << 20)

/* The stack a new thread maps (pthread's default: the stack limit, 8 MiB where it has
 * none; OMP_STACKSIZE is not read: a guess on the safe side for libgomp's threads). */
int64_t dm_thread_stack_bytes(void);

/* DM_OK when `bytes` more of address space can still be mapped under the process's
 * address-space limit (ulimit -v; always without one), else DM_ERR_OOM saying the limit
 * and what needs the room (`what`). Maps and unmaps a PROT_NONE region to find out. */
dm_status dm_address_room(int64_t bytes, const char *what);

/* DM_OK when `bytes` more of memory fit what the machine has free now (/proc/meminfo's
 * MemAvailable and SwapFree; always where it cannot be read), else DM_ERR_OOM saying both
 * and what needs it (`what`): a buffer touched at once past it would have the kernel kill
 * the process instead of an error. */
dm_status dm_memory_room(int64_t bytes, const char *what);

/* dm_address_room for `threads` threads (0: OpenMP's default) that each run GEMMs: an
 * OpenBLAS buffer and a stack apiece (OpenBLAS maps its first buffer when it starts:
 * counted by the dmove command's start-up check, not here). */
dm_status dm_threads_room(int threads, const char *what);

/* This process's rank among the ranks of its machine in a launch of several (set by
 * dm_dist_start), else -1: the CUDA backend takes GPU local_rank mod the GPUs it sees. */
void dm_set_local_rank(int r);
int dm_local_rank(void);

#endif
