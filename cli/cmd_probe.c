/* cmd_probe.c: `dmove probe`: measures this CPU (STREAM-style triad and read bandwidth,
 * SGEMM rate through the build's BLAS per thread count, an FMA vector rate), prints a
 * summary and saves the profile `dmove analyze --device cpu` reads. */
#include <stdio.h>
#include <string.h>

#include "cli_common.h"

static const char *const CMD = "probe";

typedef struct {
    const char *path;
    int threads, save;
} probe_opts;

static void init(void *p) { *(probe_opts *)p = (probe_opts){.save = 1}; }

static const cli_option k_options[] = {
    {.kind = CLI_INT, .name = "--threads", .arg = "N", .off = offsetof(probe_opts, threads), .lo = 1,
     .hi = DM_PROBE_MAX_THREADS, .help = "most threads to measure (default: OMP_NUM_THREADS or all cores)"},
    {.kind = CLI_PATH, .name = "--profile", .arg = "FILE", .off = offsetof(probe_opts, path),
     .help = "where to save the profile"},
    {.kind = CLI_FLAG, .name = "--no-save", .off = offsetof(probe_opts, save), .lo = 0,
     .help = "measure and print only"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_probe = {
    .name = "probe",
    .head = "usage: dmove probe [--threads N] [--profile FILE] [--no-save]\n"
            "\n"
            "Measures the CPU model that `dmove analyze --device cpu` uses, in well under a\n"
            "minute, with progress on stderr:\n"
            "  memory bandwidth  STREAM-style triad a = b + s*c and a read-only sum over\n"
            "                    3 x 96 MiB arrays (beyond any L3), OpenMP, best of 20;\n"
            "                    bytes counted as STREAM does (no write-allocate traffic)\n"
            "  vector rate       an in-register FMA loop on every thread\n"
            "  contraction rate  cblas_sgemm 2048^3 (OpenBLAS) for 1..N threads, best of at\n"
            "                    least 5 runs and 1 s each, and dmove's own GEMM kernel on\n"
            "                    the same problem (the variant in use: amx, avx512, avx2);\n"
            "                    the roofline takes the faster of the two\n"
            "Then it saves them as JSON (written to a temporary name and renamed) to\n"
            "--profile FILE, default $XDG_CACHE_HOME/dmove/cpu-profile.json or\n"
            "~/.cache/dmove/cpu-profile.json.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n",
    .options = k_options,
    .size = sizeof(probe_opts),
    .init = init,
};

static void progress(const char *line) {
    fprintf(stderr, "probe: %s\n", line);
    fflush(stderr);
}

static void print_profile(const dm_profile *prof, double secs) {
    dm_profile_info p;
    dm_profile_get_info(prof, &p);
    printf("dmove probe: %s (%s), %s, %.1f s\n", p.machine, p.host, p.date, secs);
    printf("  memory bandwidth   triad %8.1f GB/s   read %8.1f GB/s\n", p.triad_bw / 1e9,
           p.read_bw / 1e9);
    printf("  vector FMA rate    %8.1f GFLOP/s on %d threads\n", p.vector_flops / 1e9, p.threads);
    const char *use, *widest, *why;
    dm_cpu_kernel_isa(&use, &widest, &why);
    const int amx = !strcmp(use, "amx"), vec512 = amx || !strcmp(use, "avx512");
    printf("  dmove's GEMM kernel %s (this CPU's widest: %s)%s%s%s%s%s%s\n", strcmp(use, "none") ? use : "none: BLAS only",
           widest, *why ? "; " : "", why, amx ? "; " : "", dm_cpu_kernel_split(), vec512 ? "; " : "",
           vec512 ? dm_cpu_kernel_packing() : "");
    printf("  SGEMM %d^3%s%s%s:\n", p.sgemm_n, p.direct_kernel[0] ? ", GFLOP/s:     OpenBLAS   dmove's " : "",
           p.direct_kernel, p.direct_kernel[0] ? " kernel" : "");
    for (int k = 0; k < p.nsgemm; k++) {
        printf("    %3d thread%s %8.1f%s", p.sgemm_threads[k], p.sgemm_threads[k] > 1 ? "s" : " ",
               p.sgemm_flops[k] / 1e9, p.direct_kernel[0] ? "   " : " GFLOP/s");
        if (p.direct_flops[k] > 0) printf("   %8.1f", p.direct_flops[k] / 1e9);
        printf("\n");
    }
}

int cmd_probe(int argc, char **argv) {
    probe_opts o;
    int r = cli_parse(&k_probe, &o, argc, argv);
    if (r != CLI_GO) return r;
    char defpath[4096];
    if (o.save && !o.path) {
        if (dm_profile_default_path(defpath, sizeof defpath) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return CLI_FAIL;
        }
        o.path = defpath;
    }
    dm_profile *p = NULL;
    double t0 = cli_now();
    if (dm_profile_measure(&p, o.threads, progress) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    if (dm_profile_measure_direct(p, progress) != DM_OK) /* SGEMM's rates stand alone */
        fprintf(stderr, "probe: note: dmove's own kernel was not timed (%s): the profile has SGEMM's rates "
                        "only\n", dm_last_error());
    print_profile(p, cli_now() - t0);
    if (o.save) {
        if (dm_profile_write(p, o.path) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            dm_profile_free(p);
            return CLI_FAIL;
        }
        printf("saved to %s\n", o.path);
    }
    dm_profile_free(p);
    if (fflush(stdout) != 0) {
        cli_error(CMD, "cannot write to stdout");
        return CLI_FAIL;
    }
    return CLI_OK;
}
