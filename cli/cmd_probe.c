/* cmd_probe.c: `dmove probe`: measures this CPU (STREAM-style triad and read bandwidth,
 * SGEMM rate through the build's BLAS per thread count, an FMA vector rate), prints a
 * summary and saves the profile `dmove analyze --device cpu` reads. */
#include <stdio.h>
#include <string.h>

#include "analysis/device.h"
#include "cli_common.h"

static const char *const CMD = "probe";

static void usage(FILE *out) {
    fprintf(out,
            "usage: dmove probe [--threads N] [--profile FILE] [--no-save]\n"
            "\n"
            "Measures the CPU model that `dmove analyze --device cpu` uses, in well under a\n"
            "minute, with progress on stderr:\n"
            "  memory bandwidth  STREAM-style triad a = b + s*c and a read-only sum over\n"
            "                    3 x 96 MiB arrays (beyond any L3), OpenMP, best of 20;\n"
            "                    bytes counted as STREAM does (no write-allocate traffic)\n"
            "  vector rate       an in-register FMA loop on every thread\n"
            "  contraction rate  cblas_sgemm 2048^3 (OpenBLAS) for 1..N threads, best of at\n"
            "                    least 5 runs and 1 s each\n"
            "Then it saves them as JSON (written to a temporary name and renamed) to\n"
            "--profile FILE, default $XDG_CACHE_HOME/dmove/cpu-profile.json or\n"
            "~/.cache/dmove/cpu-profile.json.\n"
            "\n"
            "options:\n"
            "  --threads N      most threads to measure (default: OMP_NUM_THREADS or all cores)\n"
            "  --profile FILE   where to save the profile\n"
            "  --no-save        measure and print only\n"
            "  --help           this text\n"
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n");
}

static void progress(const char *line) {
    fprintf(stderr, "probe: %s\n", line);
    fflush(stderr);
}

int cmd_probe(int argc, char **argv) {
    const char *path = NULL;
    int threads = 0, save = 1;
    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--threads", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--threads", v, 1, DM_PROFILE_MAX_THREADS, &threads))
                return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--profile", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!*v) {
                cli_usage_error(CMD, "--profile: empty file name");
                return CLI_USAGE;
            }
            path = v;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--no-save")) != 0) {
            if (r < 0) return CLI_USAGE;
            save = 0;
            continue;
        }
        return cli_unknown(CMD, argv[a], "");
    }
    char defpath[4096];
    if (save && !path) {
        if (dm_profile_default_path(defpath, sizeof defpath) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return CLI_FAIL;
        }
        path = defpath;
    }
    dm_cpu_profile p;
    double t0 = cli_now();
    if (dm_cpu_probe(&p, threads, progress) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    printf("dmove probe: %s (%s), %s, %.1f s\n", p.machine, p.host, p.date, cli_now() - t0);
    printf("  memory bandwidth   triad %8.1f GB/s   read %8.1f GB/s\n", p.triad_bw / 1e9,
           p.read_bw / 1e9);
    printf("  vector FMA rate    %8.1f GFLOP/s on %d threads\n", p.vector_flops / 1e9, p.threads);
    printf("  SGEMM %d^3:\n", p.sgemm_n);
    for (int k = 0; k < p.nsgemm; k++)
        printf("    %3d thread%s %8.1f GFLOP/s\n", p.sgemm_threads[k],
               p.sgemm_threads[k] > 1 ? "s" : " ", p.sgemm_flops[k] / 1e9);
    if (save) {
        if (dm_profile_save(path, &p) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return CLI_FAIL;
        }
        printf("saved to %s\n", path);
    }
    if (fflush(stdout) != 0) {
        cli_error(CMD, "cannot write to stdout");
        return CLI_FAIL;
    }
    return CLI_OK;
}
