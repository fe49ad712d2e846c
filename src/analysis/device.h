/* device.h: device models for the roofline analysis: datasheet presets (V100, A100, H100,
 * H200) and the CPU dmove runs on, from a profile file measured by `dmove probe`
 * (probe.c). Rates in flop/s and bytes/s. */
#ifndef DM_DEVICE_H
#define DM_DEVICE_H

#include <stddef.h>

#include "core/file.h" /* dm_write_file_atomic, dm_make_parent (declared here before) */
#include "dmove.h"

#define DM_PROFILE_MAX_THREADS 64

/* What `dmove probe` measured on this CPU (the profile file's content). */
typedef struct {
    int version;              /* DM_PROFILE_VERSION */
    char machine[256];        /* CPU model name from /proc/cpuinfo */
    char host[128];           /* hostname */
    char date[32];            /* UTC, ISO 8601 */
    int threads;              /* most threads measured */
    double triad_bw;          /* bytes/s, STREAM triad a = b + s*c (3 arrays counted) */
    double read_bw;           /* bytes/s, a read-only sum over one array */
    int nsgemm;
    int sgemm_threads[DM_PROFILE_MAX_THREADS];
    double sgemm_flops[DM_PROFILE_MAX_THREADS]; /* flop/s of cblas_sgemm, n = sgemm_n */
    int sgemm_n;              /* square size used */
    double vector_flops;      /* flop/s of an in-cache FMA loop on all threads */
    /* dmove's own GEMM kernel on the same problem, per sgemm entry (0: not measured;
     * dm_profile_measure_direct), and its variant's name ("" if none ran) */
    double direct_flops[DM_PROFILE_MAX_THREADS];
    char direct_kernel[16];
} dm_cpu_profile;

#define DM_PROFILE_VERSION 1

typedef struct {
    char name[16];            /* "cpu", "v100", ... */
    char desc[256];           /* what it is and where the numbers come from */
    double bandwidth;         /* bytes/s of device memory */
    double vector_flops;      /* non-contraction rate: fp32 CUDA cores / CPU SIMD */
    double contract_fp32;     /* contraction rate in fp32 (GPU: no tensor cores; CPU: SGEMM) */
    double contract_16;       /* contraction rate in bf16/fp16 (GPU: dense tensor cores) */
    int is_cpu;
    int threads;              /* CPU: the thread count the rates are for */
} dm_device;

/* A datasheet preset: "v100", "a100", "h100", "h200". DM_ERR_NOT_FOUND names the known. */
dm_status dm_device_preset(const char *name, dm_device *dev);
/* The preset for a GPU of this name as the driver gives it ("NVIDIA H100 80GB HBM3"), or
 * NULL when no preset has its board's rates (a PCIe or NVL board, an A100 40GB). */
const char *dm_device_for_gpu(const char *gpu);
/* The CPU model from a profile, at `threads` (0: the most measured). */
dm_status dm_device_from_profile(const dm_cpu_profile *p, int threads, dm_device *dev);
/* Contraction and vector peaks for a dtype of `dtype_bytes` (4: fp32, 2: bf16/fp16). The
 * vector rate is the fp32 one for every dtype: element-wise and normalization math runs
 * in fp32 (design.md: fp32 statistics). */
double dm_device_contract_peak(const dm_device *dev, int dtype_bytes);
double dm_device_vector_peak(const dm_device *dev, int dtype_bytes);
/* The known device names, comma-separated, for messages. */
const char *dm_device_names(void);

/* $XDG_CACHE_HOME/dmove/cpu-profile.json, else ~/.cache/dmove/cpu-profile.json. */
dm_status dm_profile_default_path(char *buf, size_t n);
/* Loads and validates a profile (DM_ERR_IO unreadable, DM_ERR_NOT_FOUND missing,
 * DM_ERR_FORMAT malformed: the message says which field). */
dm_status dm_profile_load(const char *path, dm_cpu_profile *p);
/* Writes atomically (temporary file + rename), creating the parent directory if needed. */
dm_status dm_profile_save(const char *path, const dm_cpu_profile *p);

/* probe.c: measures the profile. progress (may be NULL) gets one line per step. Threads
 * 1..max_threads (0: all). Takes well under a minute. */
dm_status dm_cpu_probe(dm_cpu_profile *p, int max_threads, void (*progress)(const char *line));

#endif
