/* genbuild.cu: the kernels gen.cu and attn.cu generate, compiled and run. On the GPU: NVRTC
 * compiles the plan's kernels as one program for the device's architecture (its output
 * cached on disk), the runtime's library API loads the cubin (no driver API link), and
 * kernels are launched by handle. Emulating (tests): NVRTC still compiles the device text
 * (to PTX, which needs no GPU), and the host compiler builds the same text into a shared
 * object: a team of one lane per row, or with DMG_SIM every lane of the device kernel a
 * thread (genrt.cuh). */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nvrtc.h>

#include <new>
#include <string>

#include "cuda/cuda_internal.h"
#include "cuda/genrt.cuh"

extern "C" {
extern const char dmc_text_philox[], dmc_text_rowcore[], dmc_text_genrt[];
}

struct dmc_gen {
    int emulate; /* 0: the GPU; 1: host, a team of one lane; 2: host, lanes simulated */
    std::string *src;
    void *so;            /* emulation: the host build */
    cudaLibrary_t lib;   /* device: the loaded cubin */
    int have_lib;
    int nk;
    dmc_genk *k;
};

static_assert((int)DMG_MAXP == (int)DMC_GEN_MAXP, "genrt.cuh and cuda_internal.h disagree on operands");

/* The CUDA toolkit's headers (cuda_bf16.h, cuda_fp16.h) for NVRTC and the host builds:
 * DMOVE_CUDA_INCLUDE, else $CUDA_HOME/include, else the build's toolkit. */
static dm_status cuda_include(char *dir, size_t n) {
    const char *e = getenv("DMOVE_CUDA_INCLUDE"), *home = getenv("CUDA_HOME");
    int len = e && *e ? snprintf(dir, n, "%s", e)
              : home && *home ? snprintf(dir, n, "%s/include", home)
                              : snprintf(dir, n, "%s", DM_CUDA_INCLUDE);
    char probe[700];
    if (len < 0 || (size_t)len >= n ||
        snprintf(probe, sizeof probe, "%s/cuda_bf16.h", dir) >= (int)sizeof probe || access(probe, R_OK) != 0)
        return dm_fail(DM_ERR_NOT_FOUND, "the generated row kernels need the CUDA toolkit's headers, "
                       "but %s/cuda_bf16.h is not readable: set DMOVE_CUDA_INCLUDE (or CUDA_HOME) to "
                       "the toolkit, or use --rows interp", dir);
    return DM_OK;
}

/* The fixed NVRTC options (besides the architecture and include path), for the cache key. */
#define NVRTC_OPTS "--std=c++17 -lineinfo"

static const char *const hdr_names[3] = {"cuda/philox.cuh", "cuda/rowcore.cuh", "cuda/genrt.cuh"};

static const char *hdr_text(int i) {
    return i == 0 ? dmc_text_philox : i == 1 ? dmc_text_rowcore : dmc_text_genrt;
}

#define DMC_NVRTC(call)                                                                     \
    do {                                                                                    \
        nvrtcResult dmc_r_ = (call);                                                        \
        if (dmc_r_ != NVRTC_SUCCESS) {                                                      \
            s = dm_fail(DM_ERR_BACKEND, "%s failed: %s", #call, nvrtcGetErrorString(dmc_r_)); \
            goto done;                                                                      \
        }                                                                                   \
    } while (0)

/* NVRTC: the source for architecture `arch` (e.g. "sm_90", or "compute_90" for PTX
 * only); *code (malloc'd) the cubin or PTX. On a compile error the log's start is in the
 * message. */
static dm_status nvrtc_build(const std::string &src, const char *arch, char **code, size_t *n) {
    dm_status s = DM_OK;
    nvrtcProgram prog = NULL;
    const char *texts[3] = {hdr_text(0), hdr_text(1), hdr_text(2)};
    char archopt[64], incopt[600], inc[512];
    DM_TRY(cuda_include(inc, sizeof inc));
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    snprintf(incopt, sizeof incopt, "--include-path=%s", inc);
    const char *opts[] = {archopt, "--std=c++17", incopt, "-lineinfo"}; /* NVRTC_OPTS */
    const int cubin = strncmp(arch, "sm_", 3) == 0;
    *code = NULL;
    DMC_NVRTC(nvrtcCreateProgram(&prog, src.c_str(), "dmove_rows.cu", 3, texts, hdr_names));
    {
        nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
        if (r != NVRTC_SUCCESS) {
            size_t ln = 0;
            std::string log;
            if (nvrtcGetProgramLogSize(prog, &ln) == NVRTC_SUCCESS && ln > 1) {
                log.resize(ln);
                if (nvrtcGetProgramLog(prog, &log[0]) != NVRTC_SUCCESS) log = "(no log)";
            }
            /* the error lines only (warnings first would push them out of the message) */
            std::string errs;
            for (size_t at = 0; at < log.size();) {
                size_t end = log.find('\n', at);
                if (end == std::string::npos) end = log.size();
                std::string line = log.substr(at, end - at);
                if (line.find("error") != std::string::npos) errs += line + "; ";
                at = end + 1;
            }
            if (errs.empty()) errs = log;
            if (errs.size() > 600) errs.resize(600);
            s = dm_fail(DM_ERR_BACKEND, "NVRTC could not compile the generated row kernels (%s; "
                        "--rows interp runs the interpreting kernel instead): %s",
                        nvrtcGetErrorString(r), errs.c_str());
            goto done;
        }
    }
    if (cubin) DMC_NVRTC(nvrtcGetCUBINSize(prog, n));
    else DMC_NVRTC(nvrtcGetPTXSize(prog, n));
    *code = (char *)malloc(*n ? *n : 1);
    if (!*code) {
        s = dm_fail(DM_ERR_OOM, "out of memory compiling the generated row kernels");
        goto done;
    }
    if (cubin) DMC_NVRTC(nvrtcGetCUBIN(prog, *code));
    else DMC_NVRTC(nvrtcGetPTX(prog, *code));
done:
    if (prog) (void)nvrtcDestroyProgram(&prog);
    if (s != DM_OK) {
        free(*code);
        *code = NULL;
    }
    return s;
}

/* --- the compiled-kernel cache ------------------------------------------------------ *
 * NVRTC takes seconds for a plan's kernels; its output is kept in
 * $XDG_CACHE_HOME/dmove/cuda/ (else ~/.cache/dmove/cuda/), one file per (source, target
 * architecture, NVRTC version), named by their FNV-1a hash: "DMGCODE1", the payload's
 * length and hash (8 bytes each, little-endian), then the payload. A file that does not
 * check out is ignored and replaced; files are written to a temporary name and renamed.
 * The cache only saves time: when it cannot be read or written the kernels are compiled
 * as if it were empty. DMOVE_CUDA_CACHE=0 turns it off. */
static uint64_t fnv64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static const char CACHE_MAGIC[8] = {'D', 'M', 'G', 'C', 'O', 'D', 'E', '1'};

/* The cache file of (src, arch); 0 if there is no cache. */
static int cache_path(const std::string &src, const char *arch, char *path, size_t n, char *dir, size_t dn) {
    const char *off = getenv("DMOVE_CUDA_CACHE");
    if (off && !strcmp(off, "0")) return 0;
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int len;
    if (x && x[0] == '/') len = snprintf(dir, dn, "%s/dmove/cuda", x);
    else if (home && *home) len = snprintf(dir, dn, "%s/.cache/dmove/cuda", home);
    else return 0;
    if (len < 0 || (size_t)len >= dn) return 0;
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
    char ver[700], inc[512];
    if (cuda_include(inc, sizeof inc) != DM_OK) return 0; /* the build will say why */
    snprintf(ver, sizeof ver, "|%s|nvrtc %d.%d|%s|%s", arch, major, minor, NVRTC_OPTS, inc);
    uint64_t h = fnv64(14695981039346656037ull, src.data(), src.size());
    h = fnv64(h, ver, strlen(ver));
    for (int i = 0; i < 3; i++) h = fnv64(h, hdr_text(i), strlen(hdr_text(i))); /* what it includes */
    len = snprintf(path, n, "%s/rows-%s-%016llx.bin", dir, arch, (unsigned long long)h);
    return len > 0 && (size_t)len < n;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The payload of a valid cache file, or NULL. */
static char *cache_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char hdr[24];
    char *buf = NULL;
    if (fread(hdr, 1, sizeof hdr, f) == sizeof hdr && !memcmp(hdr, CACHE_MAGIC, 8)) {
        uint64_t len = get_u64(hdr + 8), h = get_u64(hdr + 16);
        if (len > 0 && len < ((uint64_t)1 << 30) && (buf = (char *)malloc((size_t)len + 1)) != NULL) {
            int extra = 0;
            if (fread(buf, 1, (size_t)len, f) != (size_t)len || fread(&extra, 1, 1, f) != 0 ||
                fnv64(14695981039346656037ull, buf, (size_t)len) != h) {
                free(buf);
                buf = NULL;
            } else {
                buf[len] = 0; /* PTX is text */
                *n = (size_t)len;
            }
        }
    }
    fclose(f);
    return buf;
}

static void cache_write(const char *path, const char *dir, const char *code, size_t n) {
    /* the folder and its parents (…/dmove/cuda) */
    char d[512];
    snprintf(d, sizeof d, "%s", dir);
    for (char *q = d + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            (void)mkdir(d, 0755);
            *q = '/';
        }
    (void)mkdir(d, 0755);
    char tmp[600];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) return;
    int fd = mkstemp(tmp);
    if (fd < 0) return;
    unsigned char hdr[24];
    memcpy(hdr, CACHE_MAGIC, 8);
    put_u64(hdr + 8, n);
    put_u64(hdr + 16, fnv64(14695981039346656037ull, code, n));
    int ok = write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr;
    for (size_t done = 0; ok && done < n;) {
        ssize_t w = write(fd, code + done, n - done);
        if (w <= 0) ok = 0;
        else done += (size_t)w;
    }
    ok = ok && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) (void)unlink(tmp);
}

/* nvrtc_build through the cache. */
static dm_status cached_build(const std::string &src, const char *arch, char **code, size_t *n) {
    char path[600], dir[512];
    const int use = cache_path(src, arch, path, sizeof path, dir, sizeof dir);
    if (use && (*code = cache_read(path, n)) != NULL) return DM_OK;
    DM_TRY(nvrtc_build(src, arch, code, n));
    if (use) cache_write(path, dir, *code, *n);
    return DM_OK;
}

/* A text file, written in place: the host build's private temporary files, and the
 * DMOVE_CUDA_DUMP debugging copy (nothing reads it back). */
static dm_status write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return dm_fail(DM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    bad |= fclose(f) != 0;
    if (bad) return dm_fail(DM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return DM_OK;
}

/* The emulation: the host compiler builds the generated text into a shared object in a
 * fresh temporary folder (removed after loading). */
static dm_status host_build(dmc_gen *gn) {
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[700], cmd[4096];
    snprintf(dir, sizeof dir, "%s/dmove-gen-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return dm_fail(DM_ERR_IO, "cannot make a temporary folder %s: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/cuda", dir);
    dm_status s = mkdir(path, 0700) == 0 ? DM_OK
                                          : dm_fail(DM_ERR_IO, "cannot make %s: %s", path, strerror(errno));
    for (int i = 0; i < 3 && s == DM_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, hdr_names[i]);
        s = write_file(path, hdr_text(i));
    }
    snprintf(path, sizeof path, "%s/rows.cpp", dir);
    if (s == DM_OK) s = write_file(path, gn->src->c_str());
    char inc[512];
    if (s == DM_OK) s = cuda_include(inc, sizeof inc);
    if (s == DM_OK) {
        int len = snprintf(cmd, sizeof cmd,
                           "%s -std=c++17 -O1 %s -fPIC -shared -w -I'%s' -I'%s' -o '%s/rows.so' '%s' 2>'%s/log'",
                           DM_HOST_CXX, gn->emulate == 2 ? "-DDMG_SIM -pthread" : "", dir, inc, dir, path, dir);
        int rc = len > 0 && len < (int)sizeof cmd ? system(cmd) : -1;
        if (rc != 0) {
            char log[1200] = "";
            snprintf(path, sizeof path, "%s/log", dir);
            FILE *f = fopen(path, "r");
            if (f) {
                size_t n = fread(log, 1, sizeof log - 1, f);
                log[n] = 0;
                fclose(f);
            }
            s = dm_fail(DM_ERR_BACKEND, "the host compiler (%s) could not build the generated row "
                        "kernels (%s %d): %s", DM_HOST_CXX, rc != -1 && WIFEXITED(rc) ? "exit status" : "status",
                        rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, log);
        }
    }
    if (s == DM_OK) {
        snprintf(path, sizeof path, "%s/rows.so", dir);
        gn->so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!gn->so) s = dm_fail(DM_ERR_BACKEND, "cannot load the generated row kernels: %s", dlerror());
    }
    const char *files[] = {"cuda/philox.cuh", "cuda/rowcore.cuh", "cuda/genrt.cuh", "rows.cpp", "rows.so", "log"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        (void)unlink(path);
    }
    snprintf(path, sizeof path, "%s/cuda", dir);
    (void)rmdir(path);
    (void)rmdir(dir);
    return s;
}

static dm_status build(dmc_gen *gn, const dmc_rowprog *const *progs, int np,
                       const dmc_attn *attns, int na, int emulate, int device) {
    const int n = np + na;
    gn->emulate = emulate;
    gn->src = new std::string();
    gn->k = (dmc_genk *)calloc((size_t)(n > 0 ? n : 1), sizeof(dmc_genk));
    gn->nk = n;
    dm_status s = gn->k ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory generating row kernels");
    int sms = 132; /* an H100's, emulating */
    if (s == DM_OK && !emulate) {
        cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (e != cudaSuccess)
            s = dm_fail(DM_ERR_BACKEND, "cudaDeviceGetAttribute failed: %s", cudaGetErrorString(e));
    }
    if (s == DM_OK) s = dmc_gen_source(progs, np, attns, na, sms, gn->k, gn->src);
    /* DMOVE_CUDA_COLSUM_BLOCKS=N: kernels with column sums launch at most N blocks (each
     * then strides over more rows, and fewer partial sums are written and added: a trade
     * against latency hiding that only a GPU can settle; bench/gpu/run.sh measures 2 per
     * multiprocessor against the default, and the tests run 1 block lane by lane) */
    const char *cb = getenv("DMOVE_CUDA_COLSUM_BLOCKS");
    if (s == DM_OK && cb && *cb) {
        char *end = NULL;
        const long v = strtol(cb, &end, 10);
        if (*end || v < 1 || v > 65535)
            s = dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_COLSUM_BLOCKS='%s' is not a block count from 1 to 65535", cb);
        for (int i = 0; s == DM_OK && i < np; i++)
            if (gn->k[i].acc_floats > 0 && gn->k[i].blocks > v) gn->k[i].blocks = (int)v;
    }
    /* DMOVE_CUDA_DUMP=FILE: the generated source, before it is compiled (for debugging) */
    const char *dump = getenv("DMOVE_CUDA_DUMP");
    if (s == DM_OK && dump && *dump) s = write_file(dump, gn->src->c_str());
    char *code = NULL;
    size_t ncode = 0;
    if (s == DM_OK && emulate) {
        /* the device text must compile too: NVRTC to PTX, no GPU needed */
        s = cached_build(*gn->src, "compute_90", &code, &ncode);
        free(code);
        code = NULL;
        if (s == DM_OK) s = host_build(gn);
        for (int i = 0; i < n && s == DM_OK; i++) {
            char sym[32];
            snprintf(sym, sizeof sym, "dmg_h%d", i);
            gn->k[i].host = dlsym(gn->so, sym);
            if (!gn->k[i].host) s = dm_fail(DM_ERR_INTERNAL, "generated kernel %s missing", sym);
        }
    } else if (s == DM_OK) {
        int major = 0, minor = 0;
        cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        if (e != cudaSuccess)
            s = dm_fail(DM_ERR_BACKEND, "cudaDeviceGetAttribute failed: %s", cudaGetErrorString(e));
        char arch[32];
        snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
        if (s == DM_OK) s = cached_build(*gn->src, arch, &code, &ncode);
        if (s == DM_OK) {
            e = cudaLibraryLoadData(&gn->lib, code, NULL, NULL, 0, NULL, NULL, 0);
            if (e != cudaSuccess)
                s = dm_fail(DM_ERR_BACKEND, "cudaLibraryLoadData (the generated row kernels) failed: %s (%s); "
                            "--rows interp runs the interpreting kernel instead",
                            cudaGetErrorString(e), cudaGetErrorName(e));
            else gn->have_lib = 1;
        }
        free(code);
        for (int i = 0; i < n && s == DM_OK; i++) {
            char sym[32];
            snprintf(sym, sizeof sym, "dmg_k%d", i);
            cudaKernel_t kern;
            e = cudaLibraryGetKernel(&kern, gn->lib, sym);
            if (e != cudaSuccess)
                s = dm_fail(DM_ERR_BACKEND, "cudaLibraryGetKernel(%s) failed: %s", sym, cudaGetErrorString(e));
            else gn->k[i].kernel = (void *)kern;
            /* the fused kernels' tiles: more shared memory than the default 48 KiB */
            if (s == DM_OK && gn->k[i].smem > 48 * 1024) {
                e = cudaKernelSetAttributeForDevice(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)gn->k[i].smem, device);
                if (e != cudaSuccess)
                    s = dm_fail(DM_ERR_BACKEND, "cudaKernelSetAttributeForDevice(%s, %zu bytes of shared "
                                "memory) failed: %s", sym, gn->k[i].smem, cudaGetErrorString(e));
            }
            /* A program with column sums: no more blocks than the GPU holds at once, now
             * counted as the runtime counts them (registers and this GPU's shared memory;
             * gen.cu's guess knows neither): blocks past one full wave would form a second,
             * partial one that every row waits for. Where the runtime cannot tell, the
             * guess stays (the kernel strides over rows by its grid either way). */
            if (s == DM_OK && gn->k[i].acc_floats > 0) {
                int per_sm = 0, sms = 0;
                /* an error already pending is not the query's: report it, not clear it below */
                e = cudaPeekAtLastError();
                if (e != cudaSuccess)
                    s = dm_fail(DM_ERR_BACKEND, "a CUDA error was pending before loading %s: %s (%s)", sym,
                                cudaGetErrorString(e), cudaGetErrorName(e));
                else if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)kern, gn->k[i].threads,
                                                                  gn->k[i].smem) == cudaSuccess &&
                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                    per_sm > 0 && sms > 0) {
                    const long long fit = (long long)per_sm * sms;
                    if (fit < gn->k[i].blocks) gn->k[i].blocks = (int)fit;
                } else {
                    (void)cudaGetLastError(); /* a failed query is not sticky: clear it */
                }
            }
        }
    }
    return s;
}

dm_status dmc_gen_build(dmc_gen **out, const dmc_rowprog *const *progs, int n,
                        const dmc_attn *attns, int na, int emulate, int device) {
    *out = NULL;
    dmc_gen *gn = NULL;
    dm_status s;
    try { /* what new and std::string throw is out of memory, a status */
        gn = new dmc_gen();
        s = build(gn, progs, n, attns, na, emulate, device);
    } catch (const std::bad_alloc &) {
        s = dm_fail(DM_ERR_OOM, "out of memory building the generated row kernels");
    }
    if (s != DM_OK) {
        dmc_gen_free(gn);
        return s;
    }
    *out = gn;
    return DM_OK;
}

const dmc_genk *dmc_gen_kernel(const dmc_gen *gn, int i) { return gn && i >= 0 && i < gn->nk ? &gn->k[i] : NULL; }


typedef int (*dmg_host_fn)(const void *P, unsigned long long seed, float *part, int blocks);

dm_status dmc_gen_launch(const dmc_gen *gn, int i, uint64_t seed, float *partials, cudaStream_t stream) {
    const dmc_genk *k = &gn->k[i];
    /* the kernel's dmg_ptrs argument: params in order, the rest NULL */
    dmg_ptrs P;
    memset(&P, 0, sizeof P);
    for (int q = 0; q < k->nparams; q++) P.p[q] = k->params[q];
    if (gn->emulate) {
        if (((dmg_host_fn)k->host)(&P, (unsigned long long)seed, partials, k->blocks) != 0)
            return dm_fail(DM_ERR_OOM, "out of memory emulating a generated row kernel");
        return DM_OK;
    }
    if (k->blocks <= 0) return DM_OK; /* no rows: nothing to launch (a grid of 0 is an error) */
    unsigned long long sd = (unsigned long long)seed;
    void *args[3] = {&P, &sd, &partials};
    DMC_CUDA(cudaLaunchKernel((const void *)k->kernel, dim3((unsigned)k->blocks), dim3((unsigned)k->threads),
                              args, k->smem, stream));
    return DM_OK;
}

void dmc_gen_free(dmc_gen *gn) {
    if (!gn) return;
    if (gn->so) dlclose(gn->so);
    if (gn->have_lib) (void)cudaLibraryUnload(gn->lib);
    free(gn->k);
    delete gn->src;
    delete gn;
}
