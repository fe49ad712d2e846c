/* contract.c: the contraction family on the CPU. A contraction is mapped to GEMM calls
 * by plan/gemm.c (batch letters looped over, M, N and K collapsed by strides: layouts
 * never cost a copy), one sgemm per batch index, run by BLAS or dmove's own kernel.
 * Batched calls run in parallel over the batch with single-threaded BLAS inside (the
 * OpenMP build of OpenBLAS runs one thread inside a parallel region). */
#include "cpu/contract.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

static long g_direct_fallbacks; /* dm_gemm_run_one's BLAS guard for the direct algorithms */

long dm_gemm_direct_fallbacks(void) {
    long n;
#pragma omp atomic read
    n = g_direct_fallbacks;
    return n;
}

dm_status dm_gemm_prepare(dm_gemm *gm, const dm_graph *g, const dm_op *op, float *A, float *B,
                          float *C) {
    memset(gm, 0, sizeof *gm);
    DM_TRY(dm_gemm_map_prepare(&gm->map, g, op, A, B, C));
    return dm_gemm_set_algo(gm, DM_GEMM_DEFAULT, 0);
}

static const char *const k_algo_names[DM_GEMM_NUM_ALGOS] = {"default", "blas", "batch", "split_m", "split_n",
                                                                   "concurrent", "direct", "direct_rows",
                                                                   "concurrent_direct"};

static const unsigned k_algo_flags[DM_GEMM_NUM_ALGOS] = {[DM_GEMM_CONCURRENT] = DM_ALGO_BESIDE,
                                                          [DM_GEMM_DIRECT_ROWS] = DM_ALGO_ROWS_EPILOGUE,
                                                          [DM_GEMM_CONCURRENT_DIRECT] = DM_ALGO_BESIDE};

const dm_algo_table dm_cpu_gemm_algos = {"cpu", DM_GEMM_NUM_ALGOS, k_algo_names, k_algo_flags};

const char *dm_gemm_algo_name(dm_gemm_algo a) {
    return (unsigned)a < DM_GEMM_NUM_ALGOS ? k_algo_names[a] : "?";
}

int dm_gemm_algo_parse(const char *s) {
    for (int a = 0; a < DM_GEMM_NUM_ALGOS; a++)
        if (s && !strcmp(s, k_algo_names[a])) return a;
    return -1;
}

dm_gemm_algo dm_gemm_default_algo(int64_t nbatch) {
    if (dm_gemm_direct_available()) return DM_GEMM_DIRECT;
    return nbatch > 1 ? DM_GEMM_BATCH : DM_GEMM_BLAS;
}

dm_status dm_gemm_set_algo(dm_gemm *gm, dm_gemm_algo algo, int nthreads) {
    if ((unsigned)algo >= DM_GEMM_NUM_ALGOS)
        return dm_fail(DM_ERR_INVALID_ARG, "unknown contraction algorithm %d", (int)algo);
    if (algo == DM_GEMM_DEFAULT) algo = dm_gemm_default_algo(gm->nbatch);
    if (algo == DM_GEMM_BATCH && gm->nbatch < 2)
        return dm_fail(DM_ERR_UNSUPPORTED, "algorithm 'batch' needs a batched contraction");
    if (dm_gemm_algo_direct(algo) && !dm_gemm_direct_available())
        return dm_fail(DM_ERR_UNSUPPORTED, "algorithm '%s' needs a CPU with AVX-512 or AVX2 and FMA, which this one "
                                           "lacks (or DMOVE_ISA=none turned them off): give the contraction another "
                                           "algorithm (or tune again here)",
                       k_algo_names[algo]);
    gm->algo = algo;
    gm->nthreads = nthreads;
    return DM_OK;
}

/* Element offsets of batch index bi in A, B and C. */
static void batch_offsets(const dm_gemm *gm, int64_t bi, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = gm->nbd - 1; d >= 0; d--) {
        int64_t i = bi % gm->bsize[d];
        bi /= gm->bsize[d];
        *oa += i * gm->bsA[d];
        *ob += i * gm->bsB[d];
        *oc += i * gm->bsC[d];
    }
}

void dm_gemm_run_one(const dm_gemm *gm, int64_t bi, float *tileA, float *tileB, float *tileC) {
    int64_t oa, ob, oc;
    batch_offsets(gm, bi, &oa, &ob, &oc);
    if (gm->swapped) {
        float *t = tileA;
        tileA = tileB;
        tileB = t;
    }
    const float *a = tileA ? tileA : gm->A + oa, *b = tileB ? tileB : gm->B + ob;
    float *c = tileC ? tileC : gm->C + oc;
    int tid = omp_get_thread_num();
    /* the buffers are made for every thread that can run this (dm_cpu_exec_init,
     * dm_gemm_run, dm_gemm_run_pair); BLAS below is only a guard against a caller that has
     * none, counted so that the tests can tell the direct kernel really ran */
    if (dm_gemm_algo_direct(gm->algo)) {
        if (gm->pack && tid < gm->pack_threads) {
            float *buf = gm->pack + (int64_t)tid * DM_GEMM_DIRECT_PACK_FLOATS;
            if (gm->algo == DM_GEMM_DIRECT_ROWS)
                dm_sgemm_direct_vec(gm->transA, gm->transB, gm->m, gm->n, gm->k, gm->alpha, a, gm->lda, b, gm->ldb, c,
                                    gm->ldc, buf);
            else
                dm_sgemm_direct_part(gm->whole_m ? gm->whole_m : gm->m, gm->whole_n ? gm->whole_n : gm->n,
                                     gm->transA, gm->transB, gm->m, gm->n, gm->k, gm->alpha, a, gm->lda, b, gm->ldb,
                                     c, gm->ldc, buf);
            return;
        }
#pragma omp atomic
        g_direct_fallbacks++;
    }
    cblas_sgemm(CblasRowMajor, gm->transA ? CblasTrans : CblasNoTrans,
                gm->transB ? CblasTrans : CblasNoTrans, gm->m, gm->n, gm->k, gm->alpha, a,
                gm->lda, b, gm->ldb, gm->beta, c, gm->ldc);
}

/* rows x cols floats at stride ld from p into L2, a prefetch per cache line */
static void prefetch_block(const float *p, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c += 16) __builtin_prefetch(p + r * ld + c, 0, 2);
}

void dm_gemm_prefetch(const dm_gemm *gm, int64_t bi, int tileA, int tileB) {
    int64_t oa, ob, oc;
    batch_offsets(gm, bi, &oa, &ob, &oc);
    if (gm->swapped) {
        int t = tileA;
        tileA = tileB;
        tileB = t;
    }
    if (!tileA) prefetch_block(gm->A + oa, gm->transA ? gm->k : gm->m, gm->transA ? gm->m : gm->k, gm->lda);
    if (!tileB) prefetch_block(gm->B + ob, gm->transB ? gm->n : gm->k, gm->transB ? gm->k : gm->n, gm->ldb);
}

static void run_one(const dm_gemm *gm, int64_t bi) { dm_gemm_run_one(gm, bi, NULL, NULL, NULL); }

/* gm, or a copy with nt direct-kernel buffers where it is on the direct kernel and has
 * none for nt threads (free *own_pack after); NULL: out of memory. */
static const dm_gemm *with_buffers(const dm_gemm *gm, int nt, dm_gemm *copy, float **own_pack) {
    *own_pack = NULL;
    if (!dm_gemm_algo_direct(gm->algo) || (gm->pack && gm->pack_threads >= nt)) return gm;
    *copy = *gm;
    copy->pack = aligned_alloc(64, sizeof(float) * (size_t)DM_GEMM_DIRECT_PACK_FLOATS * (size_t)nt);
    if (!copy->pack) {
        dm_fail(DM_ERR_OOM, "out of memory for the direct kernel's buffers");
        return NULL;
    }
    copy->pack_threads = nt;
    *own_pack = copy->pack;
    return copy;
}

/* Block [lo, hi) of the rows (split_m) or columns of batch index bi, one thread's share.
 * Row block of op(A) starts lo rows (or, transposed, lo columns) in; likewise for B. */
static void run_block(const dm_gemm *gm, int64_t bi, int split_m, int lo, int hi) {
    if (hi <= lo) return;
    dm_gemm part = *gm;
    part.nbd = 0;
    part.whole_m = gm->whole_m ? gm->whole_m : gm->m;
    part.whole_n = gm->whole_n ? gm->whole_n : gm->n;
    int64_t oa, ob, oc;
    batch_offsets(gm, bi, &oa, &ob, &oc);
    if (split_m) {
        part.m = hi - lo;
        part.A = gm->A + oa + (int64_t)lo * (gm->transA ? 1 : gm->lda);
        part.B = gm->B + ob;
        part.C = gm->C + oc + (int64_t)lo * gm->ldc;
    } else {
        part.n = hi - lo;
        part.A = gm->A + oa;
        part.B = gm->B + ob + (int64_t)lo * (gm->transB ? gm->ldb : 1);
        part.C = gm->C + oc + lo;
    }
    dm_gemm_run_one(&part, 0, NULL, NULL, NULL);
}

/* Thread i of a team of n takes its block of the rows (split_m) or columns, in every
 * batch index: blocks rounded to 16 (whole SIMD panels; 64 columns for the direct
 * kernel's micro-tiles), the last takes the rest. */
static void run_share(const dm_gemm *gm, int split_m, int i, int n) {
    int len = split_m ? gm->m : gm->n,
        unit = !split_m && dm_gemm_algo_direct(gm->algo) ? 64 : 16;
    int per = (len + n - 1) / n;
    per = (per + unit - 1) / unit * unit;
    int lo = i * per, hi = lo + per < len ? lo + per : len;
    for (int64_t b = 0; b < gm->nbatch; b++) run_block(gm, b, split_m, lo, hi);
}

/* cblas_sgemm returns nothing: arguments are validated in dm_gemm_prepare, and OpenBLAS
 * reports argument errors through xerbla, which prepare's checks rule out. Inside an
 * OpenMP parallel region the OpenMP build of OpenBLAS runs single-threaded. */
dm_status dm_gemm_run(const dm_gemm *gm) {
    int nt = gm->nthreads > 0 ? gm->nthreads : omp_get_max_threads();
    switch (gm->algo) {
    case DM_GEMM_BATCH:
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t b = 0; b < gm->nbatch; b++) run_one(gm, b);
        break;
    case DM_GEMM_SPLIT_M:
    case DM_GEMM_SPLIT_N: {
        int split_m = gm->algo == DM_GEMM_SPLIT_M;
#pragma omp parallel num_threads(nt)
        run_share(gm, split_m, omp_get_thread_num(), omp_get_num_threads());
        break;
    }
    case DM_GEMM_DIRECT:
    case DM_GEMM_DIRECT_ROWS:
    case DM_GEMM_CONCURRENT_DIRECT: {
        dm_gemm copy;
        float *own_pack;
        const dm_gemm *d = with_buffers(gm, nt, &copy, &own_pack); /* a caller without the executor's */
        if (!d) return DM_ERR_OOM;
        if (d->nbatch >= nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t b = 0; b < d->nbatch; b++) run_one(d, b);
        } else {
#pragma omp parallel num_threads(nt)
            run_share(d, d->m >= d->n, omp_get_thread_num(), omp_get_num_threads());
        }
        free(own_pack);
        break;
    }
    default:
        for (int64_t b = 0; b < gm->nbatch; b++) run_one(gm, b);
        break;
    }
    return DM_OK;
}

dm_status dm_gemm_run_pair(const dm_gemm *a, const dm_gemm *b, int nthreads) {
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (nt < 2) {
        DM_TRY(dm_gemm_run(a));
        return dm_gemm_run(b);
    }
    dm_gemm ca, cb;
    float *pa, *pb;
    a = with_buffers(a, nt, &ca, &pa);
    b = a ? with_buffers(b, nt, &cb, &pb) : NULL;
    if (!b) {
        free(pa); /* NULL where a had its own */
        return DM_ERR_OOM;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        if (T < 2) { /* the runtime gave one thread: one after the other, in it */
            run_share(a, a->m >= a->n, 0, 1);
            run_share(b, b->m >= b->n, 0, 1);
        } else {
            int na = T / 2;
            if (t < na) run_share(a, a->m >= a->n, t, na);
            else run_share(b, b->m >= b->n, t - na, T - na);
        }
    }
    free(pa);
    free(pb);
    return DM_OK;
}

/* Loops over every letter assignment; sums in double. */
