// bench/kernels.c: dmove's own GEMM kernel ("direct", each instruction-set variant this
// CPU runs) against OpenBLAS and BLIS on the contractions of one BERT encoder layer's
// training step, at 1 thread and at T, with each rate as a share of the machine's FMA
// rate for that instruction set measured in the same run (an in-register FMA loop on
// every thread, as `dmove probe` measures it).
//   - dmove runs through the executor's own path (dm_gemm_run, algorithm "direct"): the
//     threads split the longer side, or take batch indices where there are enough;
//   - the attention's six per-(sequence, head) GEMMs have the strides the layer gives them
//     (Q|K|V rows 3i floats apart, the context's i, the scores' j), not contiguous copies;
//   - OpenBLAS (linked) and BLIS (dlopen'ed on its own: both export cblas_sgemm) run one
//     multi-threaded call per GEMM, and for the attention's batched GEMMs one
//     single-threaded call per batch index inside an OpenMP loop, as dmove's "batch" does.
// Every implementation runs once per round, in turn, over R rounds; a time is the median
// over rounds of the best of 3 calls in a round. One binary runs everywhere: a variant the
// CPU lacks, or a BLIS that is not installed, is left out and said so.
//
// Build and run: sh bench/kernels.sh [options]   (it builds libdmove.a, then this)
// Usage: kernels [--batch B] [--seq J] [--hidden I] [--ffn U] [--heads H] [--threads T]
//                [--rounds R] [--only SUBSTRING] [--tsv]
#include <dlfcn.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cblas.h>

#include "cpu/contract.h"
#include "cpu/direct_isa.h"
#include "dmove_tools.h"

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);
typedef void (*blis_threads_fn)(long);
static cblas_sgemm_fn blis_sgemm;
static blis_threads_fn blis_set_threads;

static void load_blis(void) {
    const char *names[] = {"libblis.so.4", "libblis.so", "libblis-openmp.so.4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !blis_sgemm; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (!h) continue;
        blis_sgemm = (cblas_sgemm_fn)(uintptr_t)dlsym(h, "cblas_sgemm");
        blis_set_threads = (blis_threads_fn)(uintptr_t)dlsym(h, "bli_thread_set_num_threads");
        if (!blis_sgemm || !blis_set_threads) blis_sgemm = NULL;
    }
}

// --- the FMA rate ------------------------------------------------------------------------

#define CHAINS 12
__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters) {
    __m256 x[CHAINS], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int q = 0; q < CHAINS; q++) x[q] = _mm256_set1_ps(1.0f + 0.01f * (float)q);
    for (int64_t i = 0; i < iters; i++)
        for (int q = 0; q < CHAINS; q++) x[q] = _mm256_fmadd_ps(x[q], m, c);
    float s = 0, v[8];
    for (int q = 0; q < CHAINS; q++) {
        _mm256_storeu_ps(v, x[q]);
        s += v[0];
    }
    return (double)s;
}

__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters) {
    __m512 x[CHAINS], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int q = 0; q < CHAINS; q++) x[q] = _mm512_set1_ps(1.0f + 0.01f * (float)q);
    for (int64_t i = 0; i < iters; i++)
        for (int q = 0; q < CHAINS; q++) x[q] = _mm512_fmadd_ps(x[q], m, c);
    double s = 0; // every chain is read, or the compiler drops the unread ones and the rate inflates
    for (int q = 0; q < CHAINS; q++) s += (double)_mm512_reduce_add_ps(x[q]);
    return s;
}

// flop/s of the FMA loop of this instruction set on nt threads, best of 9 (a moment of
// another process on a core would lower it: main takes the best of this before and after)
static double fma_rate(int isa, int nt) {
    const int64_t iters = 20 * 1000 * 1000;
    const int lanes = isa == DM_ISA_AVX512 ? 16 : 8;
    double best = 0, sink = 0;
    for (int rep = 0; rep < 9; rep++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += isa == DM_ISA_AVX512 ? fma_avx512(iters) : fma_avx2(iters);
        double t = omp_get_wtime() - t0, r = 2.0 * lanes * CHAINS * (double)iters * nt / t;
        if (r > best) best = r;
    }
    if (sink == 12345.0) printf(" ");
    return best;
}

// --- the shapes ---------------------------------------------------------------------------

// How an attention item's operand lies in the layer's tensors (the strides dmove's layer
// gives its per-(sequence, head) GEMMs): a slice of the fused Q|K|V tensor (t x 3i) or of
// the context (t x i), p columns of a head, rows 3i or i floats apart; or a j x j block of
// the scores (b, h, j, j), contiguous.
enum { LAY_NONE, LAY_QKV, LAY_CTX, LAY_SCORES };

typedef struct {
    char name[64];
    int ta, tb, m, n, k;
    int nbatch; // > 1: per (b, h) item
    int lay[3]; // A, B, C: LAY_*
    int b, h, j, i;
} shape;

static int make_shapes(shape *s, int b, int j, int i, int u, int h) {
    const int t = b * j, p = i / h;
    int n = 0;
#define S(nm, TA, TB, M, N, K, NB) \
    s[n++] = (shape){.ta = TA, .tb = TB, .m = M, .n = N, .k = K, .nbatch = NB}; \
    snprintf(s[n - 1].name, sizeof s[n - 1].name, "%s", nm)
    S("qkv fwd", 0, 1, t, 3 * i, i, 1);
    S("out fwd", 0, 1, t, i, i, 1);
    S("ffn1 fwd", 0, 1, t, u, i, 1);
    S("ffn2 fwd", 0, 1, t, i, u, 1);
    S("ffn2 dX", 0, 0, t, u, i, 1);
    S("ffn1 dX", 0, 0, t, i, u, 1);
    S("ffn1 dW", 1, 0, u, i, t, 1);
    S("ffn2 dW", 1, 0, i, u, t, 1);
    S("qkv dW", 1, 0, 3 * i, i, t, 1);
#define L(LA, LB, LC) \
    s[n - 1].lay[0] = LAY_##LA, s[n - 1].lay[1] = LAY_##LB, s[n - 1].lay[2] = LAY_##LC; \
    s[n - 1].b = b, s[n - 1].h = h, s[n - 1].j = j, s[n - 1].i = i
    S("attn QK^T", 0, 1, j, j, p, b * h);
    L(QKV, QKV, SCORES);
    S("attn PV", 0, 0, j, p, j, b * h);
    L(SCORES, QKV, CTX);
    S("attn dP", 0, 1, j, j, p, b * h);
    L(CTX, QKV, SCORES);
    S("attn dV", 1, 0, j, p, j, b * h);
    L(SCORES, CTX, QKV);
    S("attn dQ", 0, 0, j, p, j, b * h);
    L(SCORES, QKV, QKV);
    S("attn dK", 1, 0, j, p, j, b * h);
    L(SCORES, QKV, QKV);
#undef L
#undef S
    return n;
}

typedef struct {
    const shape *s;
    float *A, *B, *C;
    int lda, ldb, ldc;
    int64_t sa, sb, sc; // per batch index (contiguous items)
    int64_t st[3][2];   // the layer's strides: per sequence and per head, of A, B, C
} operands;

// operands in transparent huge pages where the kernel gives them (madvise), as dmove's
// arena is (core/hugealloc.c): a strided walk over 4 KiB pages would time the TLB
static float *filled(size_t n, unsigned seed) {
    const size_t huge = (size_t)2 << 20, bytes = (n * sizeof(float) + huge - 1) / huge * huge;
    float *p = aligned_alloc(huge, bytes);
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
    if (!p) {
        fprintf(stderr, "kernels: out of memory\n");
        exit(1);
    }
    for (size_t e = 0; e < n; e++) p[e] = (float)sin(0.37 * (double)(e + seed));
    return p;
}

static operands make_operands(const shape *s) {
    operands o = {.s = s};
    const int ar = s->ta ? s->k : s->m, ac = s->ta ? s->m : s->k, br = s->tb ? s->n : s->k, bc = s->tb ? s->k : s->n;
    o.lda = ac, o.ldb = bc, o.ldc = s->n;
    o.sa = (int64_t)ar * ac, o.sb = (int64_t)br * bc, o.sc = (int64_t)s->m * s->n;
    int64_t size[3] = {o.sa * s->nbatch, o.sb * s->nbatch, o.sc * s->nbatch};
    int *ld[3] = {&o.lda, &o.ldb, &o.ldc};
    if (s->lay[0] != LAY_NONE)
        for (int x = 0; x < 3; x++) {
            const int64_t t = (int64_t)s->b * s->j, p = s->i / s->h;
            const int w = s->lay[x] == LAY_QKV ? 3 * s->i : s->lay[x] == LAY_CTX ? s->i : s->j;
            *ld[x] = w;
            if (s->lay[x] == LAY_SCORES) {
                o.st[x][0] = (int64_t)s->h * s->j * s->j, o.st[x][1] = (int64_t)s->j * s->j;
                size[x] = (int64_t)s->b * o.st[x][0];
            } else {
                o.st[x][0] = (int64_t)s->j * w, o.st[x][1] = p;
                size[x] = t * w;
            }
        }
    o.A = filled((size_t)size[0], 1);
    o.B = filled((size_t)size[1], 2);
    o.C = filled((size_t)size[2], 3);
    return o;
}

enum { IMPL_DIRECT_AMX, IMPL_DIRECT_AVX512, IMPL_DIRECT_AVX2, IMPL_OPENBLAS, IMPL_BLIS, NIMPL };
static const char *impl_name[NIMPL] = {"dmove amx", "dmove avx512", "dmove avx2", "openblas", "blis"};
static const int impl_isa[NIMPL] = {DM_ISA_AMX, DM_ISA_AVX512, DM_ISA_AVX2, -1, -1};

static void run(int impl, const operands *o, int nt) {
    const shape *s = o->s;
    if (impl_isa[impl] >= 0) {
        dm_gemm gm;
        memset(&gm, 0, sizeof gm);
        gm.A = o->A, gm.B = o->B, gm.C = o->C;
        gm.transA = s->ta, gm.transB = s->tb, gm.m = s->m, gm.n = s->n, gm.k = s->k;
        gm.lda = o->lda, gm.ldb = o->ldb, gm.ldc = o->ldc, gm.alpha = 1, gm.beta = 0;
        gm.nbatch = s->nbatch;
        if (s->nbatch > 1 && s->lay[0] != LAY_NONE) { // (sequence, head), the layer's strides
            gm.nbd = 2, gm.bsize[0] = s->b, gm.bsize[1] = s->h;
            for (int d = 0; d < 2; d++) gm.bsA[d] = o->st[0][d], gm.bsB[d] = o->st[1][d], gm.bsC[d] = o->st[2][d];
        } else if (s->nbatch > 1) {
            gm.nbd = 1, gm.bsize[0] = s->nbatch, gm.bsA[0] = o->sa, gm.bsB[0] = o->sb, gm.bsC[0] = o->sc;
        }
        static float *pack;
        static int pack_threads;
        if (pack_threads < nt) {
            free(pack);
            pack = aligned_alloc(64, sizeof(float) * (size_t)DM_GEMM_DIRECT_PACK_FLOATS * (size_t)nt);
            pack_threads = pack ? nt : 0;
        }
        gm.pack = pack, gm.pack_threads = pack_threads;
        if (dm_gemm_direct_set_isa(impl_isa[impl]) != DM_OK ||
            dm_gemm_set_algo(&gm, DM_GEMM_DIRECT, nt) != DM_OK || dm_gemm_run(&gm) != DM_OK) {
            fprintf(stderr, "kernels: the direct kernel refused %s\n", s->name);
            exit(1);
        }
        return;
    }
    cblas_sgemm_fn f = impl == IMPL_BLIS ? blis_sgemm : (cblas_sgemm_fn)cblas_sgemm;
    const int ta = s->ta ? CblasTrans : CblasNoTrans, tb = s->tb ? CblasTrans : CblasNoTrans;
    if (s->nbatch == 1) {
        if (impl == IMPL_BLIS) blis_set_threads(nt);
        else openblas_set_num_threads(nt);
        f(CblasRowMajor, ta, tb, s->m, s->n, s->k, 1.0f, o->A, o->lda, o->B, o->ldb, 0.0f, o->C, o->ldc);
        return;
    }
    if (impl == IMPL_BLIS) blis_set_threads(1); // process-wide in BLIS: set outside the region
    else openblas_set_num_threads(1);            // a team of one is no parallel region to it
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int q = 0; q < s->nbatch; q++) {
        int64_t oa = q * o->sa, ob = q * o->sb, oc = q * o->sc;
        if (s->lay[0] != LAY_NONE) {
            const int64_t sq = q / s->h, hq = q % s->h;
            oa = sq * o->st[0][0] + hq * o->st[0][1], ob = sq * o->st[1][0] + hq * o->st[1][1];
            oc = sq * o->st[2][0] + hq * o->st[2][1];
        }
        f(CblasRowMajor, ta, tb, s->m, s->n, s->k, 1.0f, o->A + oa, o->lda, o->B + ob, o->ldb, 0.0f, o->C + oc,
          o->ldc);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int b = 8, j = 128, i = 768, u = 3072, h = 12, nt = omp_get_max_threads(), rounds = 7, tsv = 0;
    const char *only = NULL;
    for (int a = 1; a < argc; a++) {
        const char *o = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int *dst = !strcmp(o, "--batch") ? &b : !strcmp(o, "--seq") ? &j : !strcmp(o, "--hidden") ? &i
                 : !strcmp(o, "--ffn") ? &u : !strcmp(o, "--heads") ? &h : !strcmp(o, "--threads") ? &nt
                 : !strcmp(o, "--rounds") ? &rounds : NULL;
        if (!strcmp(o, "--tsv")) {
            tsv = 1;
        } else if (!strcmp(o, "--only") && v) {
            only = v;
            a++;
        } else if (dst && v && atoi(v) > 0) {
            *dst = atoi(v);
            a++;
        } else {
            fprintf(stderr, "kernels: unknown or incomplete option %s (see the header of bench/kernels.c)\n", o);
            return 2;
        }
    }
    if (i % h) {
        fprintf(stderr, "kernels: --hidden %d is not a multiple of --heads %d\n", i, h);
        return 2;
    }
    load_blis();
    // the FMA rates of the vector instruction sets; AMX's column is a share of AVX-512's
    // (its tile unit is not the FMA units: it can pass 100%)
    const int widest = dm_cpu_isa_widest(), vwide = widest > DM_ISA_AVX512 ? DM_ISA_AVX512 : widest;
    int use[NIMPL] = {widest >= DM_ISA_AMX, widest >= DM_ISA_AVX512, widest >= DM_ISA_AVX2, 1, blis_sgemm != NULL};
    double peak[2][3]; // [thread setting][isa]
    const int tset[2] = {1, nt};
    for (int q = 0; q < 2; q++)
        for (int isa = DM_ISA_AVX2; isa <= vwide; isa++) peak[q][isa] = fma_rate(isa, tset[q]);
    printf("# bench/kernels: b %d j %d i %d u %d h %d; threads 1 and %d; %d rounds; widest ISA %s%s\n", b, j, i, u,
           h, nt, rounds, dm_isa_name(widest), use[IMPL_BLIS] ? "" : "; BLIS not found (libblis-openmp-dev)");
    for (int isa = DM_ISA_AVX2; isa <= vwide; isa++)
        printf("# FMA rate %s: %.1f GFLOP/s on 1 thread, %.1f on %d\n", dm_isa_name(isa), peak[0][isa] / 1e9,
               peak[1][isa] / 1e9, nt);
    const char *split = dm_cpu_kernel_split();
    if (use[IMPL_DIRECT_AMX])
        printf("# dmove amx: fp32 as three bf16 parts on the tile unit (src/cpu/direct_amx.c), as a share of the "
               "AVX-512 FMA rate; %s\n",
               *split ? split : "which GEMMs it takes: dm_direct_amx_takes in src/cpu/direct_isa.h");
    if (widest < DM_ISA_AVX2) {
        printf("# this CPU has no AVX2: the direct kernel does not run here\n");
        use[IMPL_DIRECT_AVX2] = 0;
    }
    shape sh[32];
    const int ns = make_shapes(sh, b, j, i, u, h);
    if (tsv) printf("shape\tm\tn\tk\tbatch\tthreads\timpl\tms\tgflops\tpct_fma\n");
    else printf("%-10s %5s %5s %5s %4s %3s", "shape", "m", "n", "k", "bat", "thr");
    if (!tsv)
        for (int q = 0; q < NIMPL; q++)
            if (use[q]) printf("  %14s", impl_name[q]);
    if (!tsv) printf("   (GFLOP/s, %% of the FMA rate of the ISA it uses)\n");
    for (int si = 0; si < ns; si++) {
        if (only && !strstr(sh[si].name, only)) continue;
        operands o = make_operands(&sh[si]);
        const double flop = 2.0 * sh[si].m * sh[si].n * (double)sh[si].k * sh[si].nbatch;
        for (int q = 0; q < 2; q++) {
            if (q == 1 && nt == 1) break;
            double t[NIMPL][64];
            for (int r = 0; r < rounds && r < 64; r++)
                for (int im = 0; im < NIMPL; im++) {
                    if (!use[im]) continue;
                    run(im, &o, tset[q]); // warm-up
                    double best = 1e30;
                    for (int rep = 0; rep < 3; rep++) {
                        double t0 = omp_get_wtime();
                        run(im, &o, tset[q]);
                        double dt = omp_get_wtime() - t0;
                        if (dt < best) best = dt;
                    }
                    t[im][r] = best;
                }
            if (!tsv) printf("%-10s %5d %5d %5d %4d %3d", sh[si].name, sh[si].m, sh[si].n, sh[si].k, sh[si].nbatch, tset[q]);
            for (int im = 0; im < NIMPL; im++) {
                if (!use[im]) continue;
                const int nr = rounds < 64 ? rounds : 64;
                qsort(t[im], (size_t)nr, sizeof(double), cmp);
                const double med = t[im][nr / 2], rate = flop / med;
                const int isa = im == IMPL_DIRECT_AVX2 ? DM_ISA_AVX2 : vwide;
                const double pct = 100.0 * rate / peak[q][isa];
                if (tsv)
                    printf("%s\t%d\t%d\t%d\t%d\t%d\t%s\t%.4f\t%.1f\t%.1f\n", sh[si].name, sh[si].m, sh[si].n, sh[si].k,
                           sh[si].nbatch, tset[q], impl_name[im], med * 1e3, rate / 1e9, pct);
                else printf("  %7.1f (%3.0f%%)", rate / 1e9, pct);
            }
            if (!tsv) printf("\n");
            fflush(stdout);
        }
        free(o.A), free(o.B), free(o.C);
    }
    for (int q = 0; q < 2; q++) /* again, after: the table's percentages used the rate before */
        for (int isa = DM_ISA_AVX2; isa <= vwide; isa++) {
            const double again = fma_rate(isa, tset[q]);
            if (again > 1.03 * peak[q][isa])
                printf("# FMA rate %s on %d threads measured again after: %.1f GFLOP/s, %.0f%% above the rate the "
                       "table used: the machine was busy at the start, take the table with care\n",
                       dm_isa_name(isa), tset[q], again / 1e9, 100.0 * (again / peak[q][isa] - 1));
        }
    return 0;
}
