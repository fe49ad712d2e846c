/* direct.c: which variant of the direct kernel runs (direct_isa.h): the widest this CPU
 * has (AMX with AVX-512 for the shallow GEMMs, else AVX-512F, else AVX2 with FMA), read
 * once from cpuid (AMX also needs Linux's grant of its tile state); DMOVE_ISA=avx512,
 * =avx2 (or =none) in the environment, or dm_gemm_direct_set_isa, narrows it, so that the
 * narrower variants are tested on a wider machine and a plan can be timed as on a smaller
 * one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <omp.h>

#include "core/status.h"
#include "core/sysinfo.h"
#include "cpu/direct_isa.h"
#include "dmove_tools.h"

static int g_isa = -1; /* the variant in use; -1: not read yet */

/* Linux hands out AMX's 8 KB of tile state to a process that asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); once granted, every thread may use it. The
 * grant is for the whole process (a host program's later sigaltstack smaller than the
 * state is then refused), so it is asked for only where AMX is to run; whether the kernel
 * supports the state at all (ARCH_GET_XCOMP_SUPP) asks for nothing. */
#define ARCH_GET_XCOMP_SUPP 0x1021
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int g_amx_grant = -1; /* -1: not asked yet, 0: refused, 1: granted */

static int amx_granted(void) {
    int r = __atomic_load_n(&g_amx_grant, __ATOMIC_ACQUIRE);
    if (r >= 0) return r;
#if defined(__linux__) && defined(SYS_arch_prctl)
    r = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    r = 0;
#endif
    __atomic_store_n(&g_amx_grant, r, __ATOMIC_RELEASE);
    return r;
}

static int amx_supported_by_os(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    unsigned long long feats = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &feats) == 0 && (feats >> XFEATURE_XTILEDATA & 1);
#else
    return 0;
#endif
}

/* cpuid leaf 7: AMX-TILE (EDX bit 24) and AMX-BF16 (bit 22); sub-leaf 1: AVX512-BF16 (EAX
 * bit 5), which the packing's conversions use (read directly: clang 14's
 * __builtin_cpu_supports knows no AMX) */
static int cpu_has_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tiles = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tiles || !bf16 || a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
}

/* the widest variant this CPU and OS have, nothing asked of Linux */
static int widest_unasked(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && cpu_has_amx() &&
            amx_supported_by_os())
            return DM_ISA_AMX;
        return DM_ISA_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return DM_ISA_AVX2;
    return DM_ISA_NONE;
}

/* the widest this process can run: AMX asked of Linux where the CPU has it */
int dm_cpu_isa_widest(void) {
    const int w = widest_unasked();
    return w == DM_ISA_AMX && !amx_granted() ? DM_ISA_AVX512 : w;
}

const char *dm_isa_name(int isa) {
    return isa == DM_ISA_AMX      ? "amx"
           : isa == DM_ISA_AVX512 ? "avx512"
           : isa == DM_ISA_AVX2   ? "avx2"
           : isa == DM_ISA_NONE   ? "none"
                                  : "?";
}

int dm_isa_parse(const char *s) {
    for (int i = DM_ISA_NONE; i <= DM_ISA_AMX; i++)
        if (s && !strcmp(s, dm_isa_name(i))) return i;
    return -1;
}

int dm_gemm_direct_isa(void) {
    int isa = __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
    if (isa >= 0) return isa;
    int want = widest_unasked();
    const int env = dm_isa_parse(getenv("DMOVE_ISA")); /* unknown or too wide: ignored, probe says so */
    if (env >= 0 && env < want) want = env;
    if (want == DM_ISA_AMX && !amx_granted()) want = DM_ISA_AVX512; /* asked only now */
    /* from "not read" only: a dm_gemm_direct_set_isa meanwhile wins */
    if (__atomic_compare_exchange_n(&g_isa, &isa, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return want;
    return isa;
}

dm_status dm_gemm_direct_set_isa(int isa) {
    const int widest = widest_unasked(); /* AMX asked for below, only when set */
    if (isa < DM_ISA_NONE || isa > DM_ISA_AMX)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown instruction set %d for the direct kernel", isa);
    if (isa > widest)
        return dm_fail(DM_ERR_UNSUPPORTED, "this CPU has no %s (its widest is %s): the direct kernel cannot use it",
                       dm_isa_name(isa), dm_isa_name(widest));
    if (isa == DM_ISA_AMX && !amx_granted())
        return dm_fail(DM_ERR_UNSUPPORTED, "Linux did not grant this process AMX's tile state (arch_prctl "
                       "ARCH_REQ_XCOMP_PERM; an alternate signal stack too small for it refuses it): the "
                       "direct kernel runs on AVX-512");
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
    return DM_OK;
}

void dm_cpu_kernel_isa(const char **in_use, const char **widest, const char **note) {
    const int use = dm_gemm_direct_isa(), wide = widest_unasked(); /* nothing asked of Linux here */
    const char *env = getenv("DMOVE_ISA");
    if (in_use) *in_use = dm_isa_name(use);
    if (widest) *widest = dm_isa_name(wide);
    if (note)
        *note = env && *env && dm_isa_parse(env) < 0 ? "DMOVE_ISA not understood (amx, avx512, avx2 or none): ignored"
                : env && dm_isa_parse(env) > wide ? "DMOVE_ISA asks for more than this CPU has: ignored"
                : use == DM_ISA_AVX512 && wide == DM_ISA_AMX && __atomic_load_n(&g_amx_grant, __ATOMIC_ACQUIRE) == 0
                    ? "Linux did not grant AMX's tile state (arch_prctl): AVX-512"
                : use < wide && env && dm_isa_parse(env) == use ? "narrowed by DMOVE_ISA"
                : use < wide ? "narrowed by the program (dm_gemm_direct_set_isa)"
                             : "";
}

dm_status dm_blas_room_check(int threads) {
    return dm_address_room(DM_BLAS_BUFFER_BYTES * ((threads > 0 ? threads : omp_get_max_threads()) + 1),
                           "OpenBLAS's buffers");
}

int dm_gemm_direct_available(void) { return dm_gemm_direct_isa() != DM_ISA_NONE; }

static int g_pack_at = -1;  /* -1: not read yet */
static int g_pack_set = 0;  /* 1: by dm_direct_set_pack_at */

int dm_direct_pack_at_always(void) {
    int v = __atomic_load_n(&g_pack_at, __ATOMIC_ACQUIRE);
    if (v >= 0) return v;
    const char *e = getenv("DMOVE_PACK_AT");
    __builtin_cpu_init();
    int want = e && (!strcmp(e, "0") || !strcmp(e, "1")) ? e[0] == '1' : !__builtin_cpu_is("amd");
    /* from "not read" only: a dm_direct_set_pack_at meanwhile wins */
    if (__atomic_compare_exchange_n(&g_pack_at, &v, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return want;
    return v;
}

void dm_direct_set_pack_at(int v) {
    __atomic_store_n(&g_pack_set, v >= 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g_pack_at, v < 0 ? -1 : !!v, __ATOMIC_RELEASE);
}

const char *dm_cpu_kernel_split(void) {
    static char text[160];
    if (dm_gemm_direct_isa() != DM_ISA_AMX) return "";
    snprintf(text, sizeof text,
             "GEMMs with C at least %d x %d and k >= %d, or C %d or more wide with m and k >= %d, on AMX, the rest "
             "on AVX-512",
             DM_DIRECT_AMX_MIN_M, DM_DIRECT_AMX_MIN_N, DM_DIRECT_AMX_MIN_K, DM_DIRECT_AMX_NARROW_N,
             DM_DIRECT_AMX_NARROW_MK);
    return text;
}

const char *dm_cpu_kernel_packing(void) {
    const char *e = getenv("DMOVE_PACK_AT");
    const int v = dm_direct_pack_at_always(), env = e && (!strcmp(e, "0") || !strcmp(e, "1"));
    const int why = __atomic_load_n(&g_pack_set, __ATOMIC_ACQUIRE) ? 2 : env;
    static const char *const text[2][3] = {
        {"A^T packed from 3 column blocks or deeper than 256 (an AMD CPU)",
         "A^T packed from 3 column blocks or deeper than 256 (DMOVE_PACK_AT=0)",
         "A^T packed from 3 column blocks or deeper than 256 (set by the program)"},
        {"A^T packed from 2 column blocks or deeper than 256 (not an AMD CPU)",
         "A^T packed from 2 column blocks or deeper than 256 (DMOVE_PACK_AT=1)",
         "A^T packed from 2 column blocks or deeper than 256 (set by the program)"}};
    return text[v][why];
}

void dm_direct_pack_panels(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc,
                           int j0, int nc, int tb, dm_direct_transpose_fn transpose) {
    enum { PW = 64 }; /* a panel's columns */
    for (int p0 = 0; p0 < nc; p0 += PW) {
        const int w = nc - p0 < PW ? nc - p0 : PW;
        float *d = buf + (int64_t)(p0 / PW) * pstride;
        if (!transB) {
            for (int kk = 0; kk < kc; kk++)
                memcpy(d + (int64_t)kk * PW, B + (int64_t)(k0 + kk) * ldb + j0 + p0, sizeof(float) * (size_t)w);
        } else { /* op(B)(k, j) = B[j * ldb + k]: tb x tb blocks in registers, the edges by element */
            const float *src = B + (int64_t)(j0 + p0) * ldb + k0;
            const int jt = w / tb * tb, kt = kc / tb * tb;
            for (int j = 0; j < jt; j += tb)
                for (int kk = 0; kk < kt; kk += tb) transpose(d + (int64_t)kk * PW + j, PW, src + (int64_t)j * ldb + kk, ldb);
            for (int j = 0; j < w; j++)
                for (int kk = j < jt ? kt : 0; kk < kc; kk++) d[(int64_t)kk * PW + j] = src[(int64_t)j * ldb + kk];
        }
        if (w < PW)
            for (int kk = 0; kk < kc; kk++) memset(d + (int64_t)kk * PW + w, 0, sizeof(float) * (size_t)(PW - w));
    }
}

void dm_sgemm_direct(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                     const float *B, int ldb, float *C, int ldc, float *buf) {
    dm_sgemm_direct_part(m, n, transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
}

void dm_sgemm_direct_part(int whole_m, int whole_n, int transA, int transB, int m, int n, int k, float alpha,
                          const float *A, int lda, const float *B, int ldb, float *C, int ldc, float *buf) {
    if (dm_gemm_direct_isa() == DM_ISA_AMX && dm_direct_amx_takes(whole_m, whole_n, k))
        dm_sgemm_direct_amx(transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
    else
        dm_sgemm_direct_vec(transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
}

void dm_sgemm_direct_vec(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, float *buf) {
    if (dm_gemm_direct_isa() >= DM_ISA_AVX512)
        dm_sgemm_direct_avx512(transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
    else
        dm_sgemm_direct_avx2(transA, transB, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
}

void dm_sgemm_direct_rows(int transA, int m, int n, int k, float alpha, const float *A, int lda, const float *Bp,
                          int64_t ldbp, int64_t pstride, float *C, int ldc, void (*done)(void *ctx, int i0, int rows),
                          void *ctx) {
    if (dm_gemm_direct_isa() >= DM_ISA_AVX512)
        dm_sgemm_direct_rows_avx512(transA, m, n, k, alpha, A, lda, Bp, ldbp, pstride, C, ldc, done, ctx);
    else
        dm_sgemm_direct_rows_avx2(transA, m, n, k, alpha, A, lda, Bp, ldbp, pstride, C, ldc, done, ctx);
}

void dm_direct_pack_b(float *buf, int64_t pstride, int transB, const float *B, int64_t ldb, int k0, int kc, int j0,
                      int nc) {
    if (dm_gemm_direct_isa() >= DM_ISA_AVX512)
        dm_direct_pack_b_avx512(buf, pstride, transB, B, ldb, k0, kc, j0, nc);
    else
        dm_direct_pack_b_avx2(buf, pstride, transB, B, ldb, k0, kc, j0, nc);
}
