/* backend.h: the CPU backend's entry in the backend interface (plan/backend.h), and its
 * executor for those that measure it (the tuner) and white-box tests. */
#ifndef DM_CPU_BACKEND_H
#define DM_CPU_BACKEND_H

#include "cpu/exec.h"
#include "plan/backend.h"

extern const dm_backend dm_backend_cpu;

/* The CPU executor of a state of backend bk (a layer's: L->bk, L->st), or NULL if bk is
 * not the CPU backend. */
dm_cpu_exec *dm_cpu_backend_exec(const dm_backend *bk, dm_backend_state *st);

#endif
