/* device.c: device models (datasheet presets and the CPU profile from `dmove probe`), the
 * profile file (JSON via cJSON: load with validation, atomic save) and its default path. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "analysis/device.h"
#include "core/status.h"
#include "core/file.h"

/* Datasheet numbers (SXM boards, boost clock; tensor-core rates dense, i.e. half the
 * "with sparsity" figures the datasheets print first):
 *  - V100 SXM2: NVIDIA Tesla V100 GPU datasheet (2020): FP32 15.7 TFLOPS, Tensor
 *    Performance (FP16) 125 TFLOPS, HBM2 900 GB/s.
 *  - A100 SXM 80GB: NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS,
 *    BF16/FP16 Tensor Core 312 TFLOPS (624 sparse), HBM2e 2,039 GB/s.
 *  - H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (2023): FP32 67 TFLOPS, BF16/FP16
 *    Tensor Core 1,979 TFLOPS sparse = 989.5 dense, HBM3 3.35 TB/s.
 *  - H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (2024): FP32 67 TFLOPS, BF16/FP16
 *    Tensor Core 1,979 TFLOPS sparse = 989.5 dense, HBM3e 4.8 TB/s.
 * fp32 contractions use the plain FP32 rate: TF32 tensor cores round the inputs to 10
 * mantissa bits, which is not fp32 arithmetic. */
static const struct {
    const char *name, *desc;
    double fp32_tflops, tc16_tflops, bw_gbs;
} k_presets[] = {
    {"v100", "NVIDIA V100 SXM2 (datasheet: FP32 15.7 TFLOP/s, FP16 tensor 125, HBM2 900 GB/s)",
     15.7, 125.0, 900.0},
    {"a100", "NVIDIA A100 SXM 80GB (datasheet: FP32 19.5 TFLOP/s, BF16/FP16 tensor 312 dense, "
             "HBM2e 2039 GB/s)",
     19.5, 312.0, 2039.0},
    {"h100", "NVIDIA H100 SXM (datasheet: FP32 67 TFLOP/s, BF16/FP16 tensor 989.5 dense, HBM3 "
             "3350 GB/s)",
     67.0, 989.5, 3350.0},
    {"h200", "NVIDIA H200 SXM (datasheet: FP32 67 TFLOP/s, BF16/FP16 tensor 989.5 dense, HBM3e "
             "4800 GB/s)",
     67.0, 989.5, 4800.0},
};
enum { NUM_PRESETS = (int)(sizeof k_presets / sizeof k_presets[0]) };

const char *dm_device_names(void) { return "cpu, v100, a100, h100, h200"; }

dm_status dm_device_preset(const char *name, dm_device *dev) {
    if (!name || !dev) return dm_fail(DM_ERR_INVALID_ARG, "dm_device_preset: NULL argument");
    for (int k = 0; k < NUM_PRESETS; k++) {
        if (strcmp(name, k_presets[k].name) != 0) continue;
        memset(dev, 0, sizeof *dev);
        snprintf(dev->name, sizeof dev->name, "%s", k_presets[k].name);
        snprintf(dev->desc, sizeof dev->desc, "%s", k_presets[k].desc);
        dev->bandwidth = k_presets[k].bw_gbs * 1e9;
        dev->vector_flops = k_presets[k].fp32_tflops * 1e12;
        dev->contract_fp32 = k_presets[k].fp32_tflops * 1e12;
        dev->contract_16 = k_presets[k].tc16_tflops * 1e12;
        return DM_OK;
    }
    return dm_fail(DM_ERR_NOT_FOUND, "unknown device '%s' (known: %s)", name, dm_device_names());
}

/* Does s contain w, ignoring ASCII case? */
static int contains_nocase(const char *s, const char *w) {
    const size_t n = strlen(w);
    for (; *s; s++) {
        size_t k = 0;
        while (k < n && s[k] && tolower((unsigned char)s[k]) == tolower((unsigned char)w[k])) k++;
        if (k == n) return 1;
    }
    return 0;
}

const char *dm_device_for_gpu(const char *gpu) {
    if (!gpu) return NULL;
    /* other boards of a name (PCIe, NVL, A100 40GB, Grace Hopper's GH200) and MIG slices
     * of a board have other clocks, bandwidths or shares of them */
    if (contains_nocase(gpu, "PCIe") || contains_nocase(gpu, "NVL") || contains_nocase(gpu, "MIG") || contains_nocase(gpu, "GH200"))
        return NULL;
    if (strstr(gpu, "H200")) return "h200";
    if (strstr(gpu, "H100")) return "h100";
    if (strstr(gpu, "A100") && strstr(gpu, "80GB")) return "a100";
    if (strstr(gpu, "V100") && strstr(gpu, "SXM2")) return "v100";
    return NULL;
}

dm_status dm_device_from_profile(const dm_cpu_profile *p, int threads, dm_device *dev) {
    if (!p || !dev || p->nsgemm < 1)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_device_from_profile: empty profile");
    /* the SGEMM entry with the most threads not above the request */
    int best = 0;
    for (int k = 0; k < p->nsgemm; k++) {
        int t = p->sgemm_threads[k];
        if ((threads <= 0 || t <= threads) && t >= p->sgemm_threads[best]) best = k;
    }
    memset(dev, 0, sizeof *dev);
    snprintf(dev->name, sizeof dev->name, "cpu");
    /* the contraction rate: the faster of BLAS and dmove's own kernel on the probe's GEMM */
    const double direct = p->direct_flops[best], gemm = direct > p->sgemm_flops[best] ? direct : p->sgemm_flops[best];
    if (direct > p->sgemm_flops[best])
        snprintf(dev->desc, sizeof dev->desc,
                 "%.120s, measured by dmove probe on %.31s (%d threads: dmove's %.15s GEMM %.1f GFLOP/s, "
                 "SGEMM %.1f, triad %.1f GB/s)",
                 p->machine, p->date, p->sgemm_threads[best], p->direct_kernel, direct / 1e9,
                 p->sgemm_flops[best] / 1e9, p->triad_bw / 1e9);
    else
        snprintf(dev->desc, sizeof dev->desc,
                 "%.120s, measured by dmove probe on %.31s (%d threads: SGEMM %.1f GFLOP/s, triad "
                 "%.1f GB/s)",
                 p->machine, p->date, p->sgemm_threads[best], p->sgemm_flops[best] / 1e9, p->triad_bw / 1e9);
    /* Triad: a mix of reads and writes as the layer's operators have. */
    dev->bandwidth = p->triad_bw;
    dev->contract_fp32 = gemm;
    dev->contract_16 = gemm; /* no half-precision GEMM measured on the CPU */
    /* the vector rate was measured on all probed threads: scale to the threads used */
    dev->vector_flops = p->vector_flops * (double)p->sgemm_threads[best] / (double)p->threads;
    dev->is_cpu = 1;
    dev->threads = p->sgemm_threads[best];
    return DM_OK;
}

double dm_device_contract_peak(const dm_device *dev, int dtype_bytes) {
    return dtype_bytes >= 4 ? dev->contract_fp32 : dev->contract_16;
}

double dm_device_vector_peak(const dm_device *dev, int dtype_bytes) {
    (void)dtype_bytes;
    return dev->vector_flops;
}

dm_status dm_profile_default_path(char *buf, size_t n) {
    if (!buf) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_default_path: NULL argument");
    const char *x = getenv("XDG_CACHE_HOME");
    int len;
    if (x && x[0] == '/') {
        len = snprintf(buf, n, "%s/dmove/cpu-profile.json", x);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home)
            return dm_fail(DM_ERR_NOT_FOUND, "neither XDG_CACHE_HOME nor HOME is set: give the "
                           "profile file with --profile FILE");
        len = snprintf(buf, n, "%s/.cache/dmove/cpu-profile.json", home);
    }
    if (len < 0 || (size_t)len >= n) return dm_fail(DM_ERR_INVALID_ARG, "profile path too long");
    return DM_OK;
}

/* --- the profile file --------------------------------------------------------------- */

static dm_status bad(const char *path, const char *what) {
    return dm_fail(DM_ERR_FORMAT, "profile '%s' is malformed: %s; run 'dmove probe' to write a "
                   "new one", path, what);
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return 0;
    *out = v->valuedouble;
    return 1;
}

static void get_str(const cJSON *o, const char *k, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(out, n, "%s", cJSON_IsString(v) && v->valuestring ? v->valuestring : "unknown");
}

dm_status dm_profile_load(const char *path, dm_cpu_profile *p) {
    if (!path || !p) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_load: NULL argument");
    memset(p, 0, sizeof *p);
    if (dm_input_regular(path) != DM_OK) return dm_fail_context(dm_last_status(), "CPU profile: ");
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return dm_fail(DM_ERR_NOT_FOUND, "no CPU profile at '%s': run 'dmove probe' first "
                           "(a few seconds), or choose a datasheet device with --device", path);
        return dm_fail(DM_ERR_IO, "cannot read profile '%s': %s", path, strerror(errno));
    }
    enum { MAX_BYTES = 1 << 20 };
    /* memory as the file's size, not the 1 MiB limit (core/file.c) */
    struct stat sb;
    char *text = NULL;
    size_t n = 0;
    int too_large = 0;
    const size_t size = fstat(fileno(f), &sb) == 0 && sb.st_size > 0 ? (size_t)sb.st_size : 0;
    const dm_status rs = dm_read_stream(f, size, MAX_BYTES, &text, &n, &too_large);
    const int e = errno;
    fclose(f); /* read-only */
    if (rs == DM_ERR_OOM) return dm_fail(DM_ERR_OOM, "out of memory");
    if (too_large) return bad(path, "larger than 1 MiB");
    if (rs != DM_OK) return dm_fail(DM_ERR_IO, "cannot read profile '%s': %s", path, strerror(e));
    text[n] = 0;
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    dm_status st = DM_OK;
    double v, ver;
    const cJSON *bw, *sg, *mach;
    if (!root || !cJSON_IsObject(root)) {
        st = bad(path, "not a JSON object");
        goto done;
    }
    if (!get_num(root, "version", 1, 1e9, &ver)) {
        st = bad(path, "no \"version\" number");
        goto done;
    }
    if (ver != DM_PROFILE_VERSION) {
        st = dm_fail(DM_ERR_FORMAT, "profile '%s' has version %g, this dmove reads version %d: "
                     "run 'dmove probe' again", path, ver, DM_PROFILE_VERSION);
        goto done;
    }
    p->version = DM_PROFILE_VERSION;
    mach = cJSON_GetObjectItemCaseSensitive(root, "machine");
    if (!cJSON_IsObject(mach)) {
        st = bad(path, "no \"machine\" object");
        goto done;
    }
    get_str(mach, "cpu", p->machine, sizeof p->machine);
    get_str(mach, "host", p->host, sizeof p->host);
    get_str(root, "date", p->date, sizeof p->date);
    if (!get_num(root, "threads", 1, DM_PROFILE_MAX_THREADS, &v)) {
        st = bad(path, "\"threads\" missing or not in 1..64");
        goto done;
    }
    p->threads = (int)v;
    bw = cJSON_GetObjectItemCaseSensitive(root, "bandwidth_gbs");
    if (!cJSON_IsObject(bw) || !get_num(bw, "triad", 1e-3, 1e6, &v)) {
        st = bad(path, "\"bandwidth_gbs\".\"triad\" missing or not a positive number");
        goto done;
    }
    p->triad_bw = v * 1e9;
    if (!get_num(bw, "read", 1e-3, 1e6, &v)) {
        st = bad(path, "\"bandwidth_gbs\".\"read\" missing or not a positive number");
        goto done;
    }
    p->read_bw = v * 1e9;
    if (!get_num(root, "vector_gflops", 1e-3, 1e9, &v)) {
        st = bad(path, "\"vector_gflops\" missing or not a positive number");
        goto done;
    }
    p->vector_flops = v * 1e9;
    if (!get_num(root, "sgemm_n", 1, 1e6, &v)) {
        st = bad(path, "\"sgemm_n\" missing or not a positive number");
        goto done;
    }
    p->sgemm_n = (int)v;
    sg = cJSON_GetObjectItemCaseSensitive(root, "sgemm");
    if (!cJSON_IsArray(sg) || cJSON_GetArraySize(sg) < 1 ||
        cJSON_GetArraySize(sg) > DM_PROFILE_MAX_THREADS) {
        st = bad(path, "\"sgemm\" is not a list of 1..64 entries");
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, sg) {
        double t, gf;
        if (!cJSON_IsObject(it) || !get_num(it, "threads", 1, p->threads, &t) ||
            !get_num(it, "gflops", 1e-3, 1e9, &gf)) {
            st = bad(path, "an \"sgemm\" entry lacks \"threads\" (1..threads) or a positive "
                     "\"gflops\"");
            goto done;
        }
        /* dmove's own kernel beside it (optional: profiles before 2026-11-29 lack it) */
        const cJSON *dg = cJSON_GetObjectItemCaseSensitive(it, "direct_gflops");
        double d = 0;
        if (dg && !get_num(it, "direct_gflops", 1e-3, 1e9, &d)) {
            st = bad(path, "an \"sgemm\" entry's \"direct_gflops\" is not a positive number");
            goto done;
        }
        p->direct_flops[p->nsgemm] = d * 1e9;
        p->sgemm_threads[p->nsgemm] = (int)t;
        p->sgemm_flops[p->nsgemm++] = gf * 1e9;
    }
    {
        /* the variant that gave the rates: one of dmove's names, or none at all */
        const cJSON *dk = cJSON_GetObjectItemCaseSensitive(root, "direct_kernel");
        if (dk) {
            const char *name = cJSON_IsString(dk) ? dk->valuestring : NULL;
            if (!name || (strcmp(name, "amx") && strcmp(name, "avx512") && strcmp(name, "avx2"))) {
                st = bad(path, "\"direct_kernel\" is not one of dmove's kernels (amx, avx512, avx2)");
                goto done;
            }
            snprintf(p->direct_kernel, sizeof p->direct_kernel, "%s", name);
        }
        for (int k = 0; k < p->nsgemm && !p->direct_kernel[0]; k++)
            if (p->direct_flops[k] > 0) {
                st = bad(path, "\"direct_gflops\" without a \"direct_kernel\" naming the kernel");
                goto done;
            }
    }
done:
    cJSON_Delete(root);
    if (st != DM_OK) memset(p, 0, sizeof *p);
    return st;
}

static int jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

dm_status dm_profile_save(const char *path, const dm_cpu_profile *p) {
    if (!path || !*path || !p) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_save: no path");
    cJSON *root = cJSON_CreateObject(), *mach = NULL, *bw = NULL, *sg = NULL;
    int ok = root && jnum(root, "version", DM_PROFILE_VERSION) &&
             (mach = cJSON_AddObjectToObject(root, "machine")) != NULL &&
             cJSON_AddStringToObject(mach, "cpu", p->machine) &&
             cJSON_AddStringToObject(mach, "host", p->host) &&
             cJSON_AddStringToObject(root, "date", p->date) &&
             cJSON_AddStringToObject(root, "dmove_version", DMOVE_VERSION) &&
             jnum(root, "threads", p->threads) &&
             (bw = cJSON_AddObjectToObject(root, "bandwidth_gbs")) != NULL &&
             jnum(bw, "triad", p->triad_bw / 1e9) && jnum(bw, "read", p->read_bw / 1e9) &&
             jnum(root, "vector_gflops", p->vector_flops / 1e9) &&
             jnum(root, "sgemm_n", p->sgemm_n) &&
             (sg = cJSON_AddArrayToObject(root, "sgemm")) != NULL;
    for (int k = 0; ok && k < p->nsgemm; k++) {
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(sg, e) && jnum(e, "threads", p->sgemm_threads[k]) &&
             jnum(e, "gflops", p->sgemm_flops[k] / 1e9) &&
             (!(p->direct_flops[k] / 1e9 >= 1e-3 && p->direct_flops[k] / 1e9 <= 1e9) || !p->direct_kernel[0] ||
              jnum(e, "direct_gflops", p->direct_flops[k] / 1e9)); /* only what the loader takes back */
    }
    if (ok && p->direct_kernel[0]) ok = cJSON_AddStringToObject(root, "direct_kernel", p->direct_kernel) != NULL;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory building the profile");
    dm_status st = dm_make_parent(path);
    if (st == DM_OK) {
        size_t len = strlen(text);
        text[len] = '\n'; /* replaces the terminator; length passed explicitly */
        st = dm_write_file_atomic(path, text, len + 1);
    }
    cJSON_free(text);
    return st;
}
