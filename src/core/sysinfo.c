/* sysinfo.c: facts about the machine for reports. */
#include "core/sysinfo.h"

#include <stdio.h>
#include <string.h>

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
