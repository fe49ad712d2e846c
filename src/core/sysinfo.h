/* sysinfo.h: facts about the machine for reports (CPU model name). */
#ifndef DM_SYSINFO_H
#define DM_SYSINFO_H

#include <stddef.h>

/* The "model name" of /proc/cpuinfo, or `fallback` when it cannot be read. */
void dm_cpu_model_name(char *out, size_t n, const char *fallback);

#endif
