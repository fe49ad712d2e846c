/* test_contract.c: the einsum -> BLAS mapping under many layouts (the order of each
 * operand's letters), batch letters, letters that must be looped over, slices (views)
 * and the C^T = B^T A^T swap, against the loop reference in double; and a layout that
 * would need a copy is refused with DM_ERR_UNSUPPORTED. Every algorithm (how threads
 * share a contraction) and two contractions run side by side give the same numbers. The
 * direct kernel alone: every transpose, sizes across its blocks and micro-tiles, leading
 * dimensions beyond the matrix (whose extra columns it must not touch). */
#include <stdlib.h>
#include <string.h>

#include "cpu/contract.h"
#include "cpu/direct_isa.h"
#include "dmove.h"
#include "dmove_tools.h"
#include "testutil.h"

static int g_scale = 1; /* j, k, i and u times this: blocks split between threads */

static void set_dims(dm_graph *g) {
    memset(g->dim, 0, sizeof g->dim);
    g->dim['b' - 'a'] = 3;
    g->dim['j' - 'a'] = 5 * g_scale;
    g->dim['k' - 'a'] = 5 * g_scale;
    g->dim['h' - 'a'] = 2;
    g->dim['p' - 'a'] = 4;
    g->dim['i' - 'a'] = 8 * g_scale;
    g->dim['u' - 'a'] = 6 * g_scale;
    g->dim['q' - 'a'] = 3;
}

/* spec "A,B->C" with each operand a root laid out as its letters say */
static void one(const char *spec, dm_status expect) {
    dm_graph g;
    dm_graph_init(&g);
    set_dims(&g);
    char a[16], b[16], c[16];
    sscanf(spec, "%15[a-z],%15[a-z]->%15[a-z]", a, b, c);
    int ta = dm_graph_tensor(&g, "A", a, DM_ROLE_ACT), tb = dm_graph_tensor(&g, "B", b, DM_ROLE_ACT),
        tc = dm_graph_tensor(&g, "C", c, DM_ROLE_ACT);
    dm_op op = {.kind = DM_OP_CONTRACT, .nin = 2, .nout = 1, .alpha = 0.5f, .in = {ta, tb}, .out = {tc}};
    snprintf(op.name, sizeof op.name, "t");
    snprintf(op.spec, sizeof op.spec, "%s", spec);
    size_t na = (size_t)g.t[ta].numel, nb = (size_t)g.t[tb].numel, nc = (size_t)g.t[tc].numel;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *R = malloc(nc * 4);
    for (size_t e = 0; e < na; e++) A[e] = (float)sin(0.7 * (double)e);
    for (size_t e = 0; e < nb; e++) B[e] = (float)cos(0.3 * (double)e);
    for (size_t e = 0; e < nc; e++) C[e] = NAN; /* every element must be written */
    dm_gemm gm;
    dm_status s = dm_gemm_prepare(&gm, &g, &op, A, B, C);
    CHECK(s == expect);
    if (s == DM_OK) {
        CHECK_OK(dm_gemm_run(&gm));
        dm_gemm_ref(&g, &op, A, B, R);
        double e = rel_err(C, R, nc);
        CHECK(e < 1e-6);
        printf("  %-22s batch %3lld m %2d n %2d k %2d transA %d transB %d: rel.err %.1e %s\n", spec,
               (long long)gm.nbatch, gm.m, gm.n, gm.k, gm.transA, gm.transB, e, e < 1e-6 ? "ok" : "FAIL");
        /* every algorithm that applies, on 1 to 3 threads, and two at once (the pair
         * "concurrent" runs: each on its share of the threads) */
        float *C2 = malloc(nc * 4);
        dm_gemm g2;
        CHECK_OK(dm_gemm_prepare(&g2, &g, &op, A, B, C2));
        double worst = 0;
        for (int nt = 1; nt <= 3; nt++) {
            for (int al = DM_GEMM_BLAS; al < DM_GEMM_NUM_ALGOS; al++) {
                if (dm_gemm_set_algo(&gm, (dm_gemm_algo)al, nt) != DM_OK) {
                    CHECK((al == DM_GEMM_BATCH && gm.nbatch < 2) ||
                          (dm_gemm_algo_direct(al) && !dm_gemm_direct_available()));
                    continue;
                }
                for (size_t q = 0; q < nc; q++) C[q] = NAN;
                CHECK_OK(dm_gemm_run(&gm));
                double ea = rel_err(C, R, nc);
                if (!(ea <= worst)) worst = ea; /* NaN (an element never written) counts */
            }
            for (size_t q = 0; q < nc; q++) C[q] = C2[q] = NAN;
            CHECK_OK(dm_gemm_run_pair(&gm, &g2, nt));
            double e1 = rel_err(C, R, nc), e2 = rel_err(C2, R, nc);
            if (!(e1 <= worst)) worst = e1;
            if (!(e2 <= worst)) worst = e2;
        }
        CHECK(worst < 1e-6);
        if (!(worst < 1e-6)) printf("    FAIL: an algorithm or a pair on 1-3 threads: rel.err %.1e\n", worst);
        free(C2);
    } else {
        printf("  %-22s refused: %s\n", spec, dm_last_error());
    }
    free(A); free(B); free(C); free(R);
    dm_graph_free(&g);
}

/* The layer's attention contraction through views of one stacked tensor. */
static void views(void) {
    dm_graph g;
    dm_graph_init(&g);
    set_dims(&g);
    int qkv = dm_graph_tensor(&g, "qkv", "bjqhp", DM_ROLE_ACT);
    int Q = dm_graph_view(&g, qkv, "Q", "bj0hp"), K = dm_graph_view(&g, qkv, "K", "bk1hp");
    int S = dm_graph_tensor(&g, "S", "bhjk", DM_ROLE_ACT);
    dm_op op = {.kind = DM_OP_CONTRACT, .nin = 2, .nout = 1, .alpha = 0.25f, .in = {Q, K}, .out = {S}};
    snprintf(op.spec, sizeof op.spec, "bjhp,bkhp->bhjk");
    size_t nq = (size_t)g.t[qkv].numel, ns = (size_t)g.t[S].numel;
    float *X = malloc(nq * 4), *C = malloc(ns * 4), *R = malloc(ns * 4);
    for (size_t e = 0; e < nq; e++) X[e] = (float)sin(0.1 * (double)e);
    dm_gemm gm;
    CHECK_OK(dm_gemm_prepare(&gm, &g, &op, X + g.t[Q].offset, X + g.t[K].offset, C));
    CHECK_OK(dm_gemm_run(&gm));
    dm_gemm_ref(&g, &op, X + g.t[Q].offset, X + g.t[K].offset, R);
    double e = rel_err(C, R, ns);
    CHECK(e < 1e-6);
    printf("  views of (b,j,q,h,p)   batch %3lld lda %d ldb %d: rel.err %.1e\n", (long long)gm.nbatch,
           gm.lda, gm.ldb, e);
    free(X); free(C); free(R);
    dm_graph_free(&g);
}

/* dm_sgemm_direct against a loop in double: C has ldc = n + 3 with its 3 extra columns
 * poisoned (they must stay so), the rest NaN (every element must be written). Each
 * element must lie within the standard error bound of a float dot product of length k,
 * gamma(k + 1) * alpha * sum |a b| (gamma(n) = n u / (1 - n u), u = 2^-24, the one more
 * for the product with alpha): the kernel sums in a different order than a loop but no
 * less accurately. Returns the worst error as a fraction of its bound (1: at the bound;
 * infinity: an element never written, or one outside the matrix written). */
/* C element (i, j) = c against alpha * sum_q op(A)(i, q) op(B)(q, j), as a fraction of its
 * error bound gamma(k + 1) * alpha * sum |a b| (NaN when c is). */
static double dot_err(const float *A, int ta, int lda, const float *B, int tb, int64_t ldb, int i, int j, int k,
                      double alpha, float c) {
    const double u = ldexp(1.0, -24), gamma = (k + 1) * u / (1 - (k + 1) * u);
    double r = 0, mag = 0;
    for (int q = 0; q < k; q++) {
        double p = (double)A[ta ? (size_t)q * (size_t)lda + (size_t)i : (size_t)i * (size_t)lda + (size_t)q] *
                   (double)B[tb ? (size_t)j * (size_t)ldb + (size_t)q : (size_t)q * (size_t)ldb + (size_t)j];
        r += p;
        mag += fabs(p);
    }
    return fabs((double)c - alpha * r) / (gamma * alpha * mag + 1e-30);
}

static double direct_case(int ta, int tb, int m, int n, int k, float *buf, int lda_given, float alpha) {
    int lda = lda_given ? lda_given : (ta ? m : k) + 5, ldb = (tb ? k : n) + 2, ldc = n + 3;
    size_t na = (size_t)(ta ? k : m) * (size_t)lda, nb = (size_t)(tb ? n : k) * (size_t)ldb,
           nc = (size_t)m * (size_t)ldc;
    float *A = malloc(na * 4 + 4), *B = malloc(nb * 4 + 4), *C = malloc(nc * 4 + 4);
    for (size_t e = 0; e < na; e++) A[e] = (float)sin(0.37 * (double)e + 0.1);
    for (size_t e = 0; e < nb; e++) B[e] = (float)cos(0.21 * (double)e);
    for (size_t e = 0; e < nc; e++) C[e] = (int)(e % (size_t)ldc) >= n ? 12345.0f : NAN;
    dm_sgemm_direct(ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, buf);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            float c = C[(size_t)i * (size_t)ldc + (size_t)j];
            if (j >= n) {
                if (c != 12345.0f) worst = INFINITY; /* wrote beyond the matrix */
                continue;
            }
            double e = dot_err(A, ta, lda, B, tb, ldb, i, j, k, alpha, c);
            if (!(e <= worst)) worst = e; /* NaN: never written */
        }
    free(A); free(B); free(C);
    return worst;
}

/* dm_sgemm_direct_rows: blocks reported in order, each exactly once, each final when
 * reported (within the dot-product bound of direct_case), nothing beyond n written;
 * op(B) packed whole into panels by dm_direct_pack_b (as the executor does), or read in
 * place (NoTrans, n a multiple of 64); checked against B as made. */
typedef struct {
    int next, bad, m, n, k, ta, lda, ldc;
    const float *A, *B, *Bp; /* B as made (transposed when tb, rows ldb apart); Bp: op(B) as the kernel
                              * reads it, Bp[k * ldbp + (j / 64) * pstride + j % 64] */
    int tb, ldb;
    int64_t ldbp, pstride;
    const float *C;
} rows_check;

static double rows_err(const rows_check *c, int i) { /* row i's worst error / bound */
    double worst = 0;
    for (int j = 0; j < c->n; j++) {
        double e = dot_err(c->A, c->ta, c->lda, c->B, c->tb, c->ldb, i, j, c->k, 0.5, c->C[(size_t)i * (size_t)c->ldc + (size_t)j]);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static void rows_seen(void *arg, int i0, int rows) {
    rows_check *c = arg;
    if (i0 != c->next || rows < 1 || rows > 24 || i0 + rows > c->m) c->bad++;
    for (int i = i0; i < i0 + rows && i < c->m; i++)
        if (!(rows_err(c, i) <= 1)) c->bad++;
    c->next = i0 + rows;
}

static void direct_rows(void) {
    /* k: within and across the 256- (AVX-512) and 384-deep (AVX2) blocks */
    const int ms[] = {1, 23, 24, 25, 100}, ns[] = {16, 64, 130, 256}, ks[] = {0, 1, 300, 797};
    int cases = 0, bad = 0;
    for (int t = 0; t < 6; t++) /* transA, and op(B) transposed / NoTrans packed / in place */
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
                    int ta = t & 1, mode = t >> 1, m = ms[a], n = ns[b], k = ks[c];
                    if (mode == 2 && n % 64) continue;
                    int lda = (ta ? m : k) + 3, ldb = (mode == 0 ? k : n) + 1, ldc = n + 5, ncp = (n + 63) / 64 * 64;
                    float *A = malloc(sizeof(float) * ((size_t)(ta ? k : m) * (size_t)lda + 1));
                    float *B = malloc(sizeof(float) * ((size_t)(mode == 0 ? n : k) * (size_t)ldb + 1));
                    float *Bp = aligned_alloc(64, sizeof(float) * ((size_t)k * (size_t)ncp + 16));
                    float *C = malloc(sizeof(float) * (size_t)m * (size_t)ldc);
                    for (int e = 0; e < (ta ? k : m) * lda; e++) A[e] = (float)sin(0.29 * e + 0.3);
                    for (int e = 0; e < (mode == 0 ? n : k) * ldb; e++) B[e] = (float)cos(0.17 * e);
                    for (int e = 0; e < m * ldc; e++) C[e] = e % ldc >= n ? 777.0f : NAN;
                    if (mode < 2 && k > 0) dm_direct_pack_b(Bp, (int64_t)64 * k, mode == 0, B, ldb, 0, k, 0, n);
                    rows_check rc = {.m = m, .n = n, .k = k, .ta = ta, .lda = lda, .ldc = ldc, .A = A, .B = B,
                                     .tb = mode == 0, .ldb = ldb, .Bp = mode < 2 ? Bp : B, .ldbp = mode < 2 ? 64 : ldb,
                                     .pstride = mode < 2 ? (int64_t)64 * k : 64, .C = C};
                    dm_sgemm_direct_rows(ta, m, n, k, 0.5f, A, lda, rc.Bp, rc.ldbp, rc.pstride, C, ldc, rows_seen, &rc);
                    for (int e = 0; e < m * ldc; e++)
                        if (e % ldc >= n && C[e] != 777.0f) rc.bad++;
                    if (rc.next != m) rc.bad++; /* every row reported */
                    cases++;
                    if (rc.bad) {
                        bad++;
                        printf("    FAIL direct rows transA %d mode %d m %d n %d k %d: %d bad\n", ta, mode, m, n, k, rc.bad);
                    }
                    free(A); free(B); free(Bp); free(C);
                }
    CHECK(bad == 0);
    printf("  direct kernel (%s) with row epilogue: %d cases, blocks in order, each final when handed over, "
           "nothing beyond n: %s\n", dm_isa_name(dm_gemm_direct_isa()), cases, bad ? "FAIL" : "ok");
}

static void direct(void) {
    float *buf = aligned_alloc(64, sizeof(float) * DM_GEMM_DIRECT_PACK_FLOATS);
    CHECK(buf != NULL);
    if (!buf) return;
    /* m: micro-tile rows (6) and their edges; n: 64-column tiles, ragged, over a 512
     * block; k: within and across 256-deep blocks, and none */
    const int ms[] = {1, 5, 6, 7, 13, 130}, ns[] = {1, 16, 63, 64, 65, 130, 600}, ks[] = {0, 1, 64, 255, 257, 520};
    int cases = 0, bad = 0;
    double worst = 0;
    for (int t = 0; t < 4; t++)
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
                    if (ms[a] * ns[b] * ks[c] > 130 * 600 * 64 && (a + b + c) % 3) continue; /* keep it quick */
                    /* alpha 1 too: the AMX variant then sums into C's tiles across KC blocks */
                    double e = direct_case(t & 1, t >> 1, ms[a], ns[b], ks[c], buf, 0, (a + b + c + t) % 2 ? 1.0f : 0.75f);
                    cases++;
                    if (!(e <= 1)) {
                        bad++;
                        printf("    FAIL direct transA %d transB %d m %d n %d k %d: error %.2f of its bound\n", t & 1, t >> 1,
                               ms[a], ns[b], ks[c], e);
                    }
                    if (!(e <= worst)) worst = e;
                }
    /* from DM_DIRECT_PANEL_M rows on, op(B) is packed into panels even where its rows could
     * be read in place */
    /* (and, for a transposed op(A), packed in blocks of 768 rows x 256 deep x 256 columns:
     * n = 600 and k = 517 cross them, with m = 1025; the AVX-512 variant packs it where n
     * is above 1024, as 1100, or above 512, as 600 (dm_direct_pack_at_always); so is op(A) NoTrans whose rows lie a multiple of 4 KiB apart,
     * as with lda 2048) */
    const int pm[] = {DM_DIRECT_PANEL_M, DM_DIRECT_PANEL_M + 1}, pn[] = {64, 600, 1100}, pk[] = {1, 517};
    for (int t = 0; t < 4; t++)
        for (int q = 0; q < 12; q++) {
            const int m = pm[q & 1], n = pn[(q >> 1) % 3], k = pk[q / 6];
            double e = direct_case(t & 1, t >> 1, m, n, k, buf, q == 9 ? 2048 : 0, q % 2 ? 1.0f : 0.75f);
            cases++;
            if (!(e <= 1)) {
                bad++;
                printf("    FAIL direct transA %d transB %d m %d n %d k %d: error %.2f of its bound\n", t & 1, t >> 1, m,
                       n, k, e);
            }
            if (!(e <= worst)) worst = e;
        }
    /* C split between threads by rows or by columns (as run_share does, each part told
     * the whole GEMM's m and n) gives the very floats of one call: each element is
     * computed alike wherever its tile lies, and the parts (20 rows, 64 columns: below the
     * AMX variant's shape on their own) run the whole GEMM's variant; t >= 8: a narrow C
     * (n 64, m and k 300: AMX as a whole, not as 20 rows or 32 columns) */
    for (int t = 0; t < 16; t++) {
        const int narrow = t >= 8, ta = t & 1, tb = (t >> 1) & 1, m = narrow ? 300 : 100, n = narrow ? 64 : 300,
                  k = narrow ? 300 : 600, lda = ta ? m : k, ldb = tb ? k : n, cut = narrow ? 32 : 236;
        const float alpha = t & 4 ? 1.0f : 0.5f;
        float *A = malloc(sizeof(float) * (size_t)m * k), *B = malloc(sizeof(float) * (size_t)k * n),
              *C1 = malloc(sizeof(float) * (size_t)m * n), *C2 = malloc(sizeof(float) * (size_t)m * n);
        CHECK(A && B && C1 && C2);
        if (!A || !B || !C1 || !C2) break;
        for (int e = 0; e < m * k; e++) A[e] = (float)sin(0.13 * e + 0.2);
        for (int e = 0; e < k * n; e++) B[e] = (float)cos(0.07 * e);
        dm_sgemm_direct(ta, tb, m, n, k, alpha, A, lda, B, ldb, C1, n, buf);
        dm_sgemm_direct_part(m, n, ta, tb, 20, n, k, alpha, A, lda, B, ldb, C2, n, buf);
        dm_sgemm_direct_part(m, n, ta, tb, m - 20, n, k, alpha, A + (ta ? 20 : 20 * lda), lda, B, ldb, C2 + 20 * n,
                             n, buf);
        const int by_rows = !memcmp(C1, C2, sizeof(float) * (size_t)m * n);
        dm_sgemm_direct_part(m, n, ta, tb, m, cut, k, alpha, A, lda, B, ldb, C2, n, buf);
        dm_sgemm_direct_part(m, n, ta, tb, m, n - cut, k, alpha, A, lda, B + (tb ? cut * ldb : cut), ldb, C2 + cut,
                             n, buf);
        const int by_cols = !memcmp(C1, C2, sizeof(float) * (size_t)m * n);
        if (!by_rows || !by_cols) {
            bad++;
            printf("    FAIL direct %dx%dx%d transA %d transB %d alpha %g: split by %s differs from one call\n", m, n,
                   k, ta, tb, (double)alpha, by_rows ? "columns" : "rows");
        }
        cases++;
        free(A); free(B); free(C1); free(C2);
    }
    /* exact where the products are: one op(A) row one-hot (1 at k = 7i mod K) gives rows of
     * op(B) bit for bit, one-hot op(B) columns give columns of op(A), every bit of a float's
     * 24 kept (the AMX variant's three bf16 parts: a missing one shows here) */
    for (int t = 0; t < 8; t++) {
        const int ta = t & 1, tb = (t >> 1) & 1, hot_b = t >> 2, m = 40, n = 70, k = 300;
        const int lda = ta ? m : k, ldb = tb ? k : n;
        float *A = calloc((size_t)m * k, sizeof(float)), *B = calloc((size_t)k * n, sizeof(float)),
              *C = malloc(sizeof(float) * (size_t)m * n);
        CHECK(A && B && C);
        if (!A || !B || !C) break;
        for (int i = 0; i < m; i++)
            for (int q = 0; q < k; q++) {
                const float v = hot_b ? (float)(sin(0.31 * (i * k + q)) * (1 + 0x1.fffffep-1 / 3)) : q == (7 * i) % k;
                A[ta ? q * lda + i : i * lda + q] = v;
            }
        for (int q = 0; q < k; q++)
            for (int j = 0; j < n; j++) {
                const float v = hot_b ? q == (5 * j) % k : (float)(cos(0.23 * (q * n + j)) * (1 + 0x1.fffffep-1 / 3));
                B[tb ? j * ldb + q : q * ldb + j] = v;
            }
        dm_sgemm_direct(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, C, n, buf);
        int wrong = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                const int q = hot_b ? (5 * j) % k : (7 * i) % k;
                const float want = hot_b ? A[ta ? q * lda + i : i * lda + q] : B[tb ? j * ldb + q : q * ldb + j];
                wrong += C[i * n + j] != want;
            }
        if (wrong) {
            bad++;
            printf("    FAIL direct transA %d transB %d, one-hot op(%c): %d of %d elements not exact\n", ta, tb,
                   hot_b ? 'B' : 'A', wrong, m * n);
        }
        cases++;
        free(A); free(B); free(C);
    }
    /* long sums: k = 8192 of positive terms (their rounding errors add up rather than cancel),
     * alpha 1 and 0.5: the rms error in units of 2^-24 sum |a b| stays that of sums restarted
     * every block of k, as the vector variants' are (the AMX variant measured 1.1-1.5; one
     * running sum through all of k, as it once kept with alpha 1, 4.4 at k = 4096) */
    for (int t = 0; t < 2; t++) {
        const int m = 32, n = 32, k = 8192;
        const float alpha = t ? 0.5f : 1.0f;
        float *A = malloc(sizeof(float) * (size_t)m * k), *B = malloc(sizeof(float) * (size_t)k * n),
              *C = malloc(sizeof(float) * (size_t)m * n);
        CHECK(A && B && C);
        if (!A || !B || !C) break;
        for (int e = 0; e < m * k; e++) A[e] = (float)(0.5 + 0.5 * sin(0.71 * e));
        for (int e = 0; e < k * n; e++) B[e] = (float)(0.5 + 0.5 * cos(0.37 * e + 1.0));
        dm_sgemm_direct(0, 0, m, n, k, alpha, A, k, B, n, C, n, buf);
        double ss = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double ref = 0, mag = 0;
                for (int q = 0; q < k; q++) {
                    const double ab = (double)A[i * k + q] * B[q * n + j];
                    ref += ab, mag += fabs(ab);
                }
                const double u = ((double)C[i * n + j] - alpha * ref) / (fabs(alpha) * mag * 0x1p-24);
                ss += u * u;
            }
        const double rms = sqrt(ss / (m * n));
        if (!(rms <= 3.0)) {
            bad++;
            printf("    FAIL direct k %d alpha %g: rms error %.2f units of 2^-24 sum |a b| (at most 3)\n", k,
                   (double)alpha, rms);
        }
        cases++;
        free(A); free(B); free(C);
    }
    /* inf in, inf out; NaN in, NaN out; sums past fp32's range inf, of the sign fp32 gives
     * them (the AMX variant hands all three to the AVX-512 one: its parts would make NaN) */
    {
        const int m = 4, n = 20, k = 300;
        float *A = malloc(sizeof(float) * (size_t)m * k), *B = malloc(sizeof(float) * (size_t)k * n),
              *C = malloc(sizeof(float) * (size_t)m * n);
        CHECK(A && B && C);
        if (A && B && C) {
            for (int e = 0; e < m * k; e++) A[e] = 0.25f;
            for (int e = 0; e < k * n; e++) B[e] = 0.5f + (float)(e % 7);
            A[3 * k + 5] = 1e30f; /* times B's row 5, 1e30: past FLT_MAX (the AMX parts' products
                                   * make inf and -inf of it, NaN summed) */
            for (int j = 0; j < n; j++) B[5 * n + j] = 1e30f;
            /* rows 0 and 3 alone first (no odd input to send the call to the AVX-512 variant
             * anyway), then all four */
            dm_sgemm_direct(0, 0, 1, n, k, 1.0f, A + 3 * k, k, B, n, C + 3 * n, n, buf);
            int wrong = 0;
            for (int j = 0; j < n; j++) wrong += !(isinf(C[3 * n + j]) && C[3 * n + j] > 0);
            A[1 * k + 17] = INFINITY;
            A[2 * k + 40] = NAN;
            dm_sgemm_direct(0, 0, m, n, k, 1.0f, A, k, B, n, C, n, buf);
            for (int j = 0; j < n; j++)
                wrong += !isfinite(C[j]) || !(isinf(C[n + j]) && C[n + j] > 0) || !isnan(C[2 * n + j]) ||
                         !(isinf(C[3 * n + j]) && C[3 * n + j] > 0);
            if (wrong) {
                bad++;
                printf("    FAIL direct: a row with inf, one with NaN, one past FLT_MAX: %d columns not finite / +inf / NaN "
                       "/ +inf\n", wrong);
            }
            cases++;
        }
        free(A); free(B); free(C);
    }
    /* the same on GEMMs the AMX variant takes, 300 columns (op(B) packed whole, 0.9 MB) and
     * 600 (op(A) packed once for 3 column blocks), k 600 (two blocks of k); each kind
     * compared element by element with the AVX-512 variant's answer (which the AMX one
     * hands the call to), NaN where it has NaN: 0, an inf and a NaN in op(A)'s second block
     * of k (met after the first block's products) and an inf in op(B) (k 100, column 280);
     * 1, that inf in op(B) alone; 2, no inf but a 1e36 there, whose sums could near fp32's
     * overflow (the largest |b| of every block counts); 3, op(A)'s inf and NaN alone */
    if (dm_gemm_direct_isa() >= DM_ISA_AVX512)
        for (int t = 0; t < 32; t++) {
            const int ta = t & 1, tb = t >> 1 & 1, kind = t >> 2 & 3, m = 64, n = t >> 4 ? 600 : 300, k = 600,
                      lda = ta ? m : k, ldb = tb ? k : n, a_odd = kind == 0 || kind == 3;
            float *A = malloc(sizeof(float) * (size_t)m * k), *B = malloc(sizeof(float) * (size_t)k * n),
                  *C = malloc(sizeof(float) * (size_t)m * n), *R = malloc(sizeof(float) * (size_t)m * n);
            CHECK(A && B && C && R);
            if (A && B && C && R) {
                for (int e = 0; e < m * k; e++) A[e] = (float)sin(0.11 * e) + 1.5f;
                for (int e = 0; e < k * n; e++) B[e] = (float)cos(0.05 * e) + 1.5f;
                if (a_odd) {
                    A[ta ? 550 * lda + 10 : 10 * lda + 550] = INFINITY; /* row 10, k 550 */
                    A[ta ? 560 * lda + 20 : 20 * lda + 560] = NAN;      /* row 20, k 560 */
                }
                if (kind != 3) B[tb ? 280 * ldb + 100 : 100 * ldb + 280] = kind == 2 ? 1e36f : INFINITY;
                dm_sgemm_direct(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, C, n, buf);
                dm_sgemm_direct_avx512(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, R, n, buf);
                int wrong = 0;
                for (int e = 0; e < m * n; e++) wrong += !(C[e] == R[e] || (isnan(C[e]) && isnan(R[e])));
                wrong += (a_odd && (!isinf(C[10 * n]) || !isnan(C[20 * n]))) ||
                         (kind >= 2 ? !isfinite(C[280]) : !isinf(C[280])) || !isfinite(C[n + 1]);
                if (wrong) {
                    static const char *const what[4] = {"inf and NaN in later blocks", "an inf in op(B) alone",
                                                        "1e36 in op(B)'s first block of k",
                                                        "inf and NaN in op(A) alone"};
                    bad++;
                    printf("    FAIL direct %dx%dx%d transA %d transB %d, %s: %d elements not the AVX-512 variant's\n",
                           m, n, k, ta, tb, what[kind], wrong);
                }
                cases++;
            }
            free(A); free(B); free(C); free(R);
        }
    CHECK(bad == 0);
    const int avx512 = dm_gemm_direct_isa() >= DM_ISA_AVX512; /* AMX's shallow GEMMs too */
    printf("  direct kernel (%s%s%s): %d shapes x transposes, worst error %.3f of the float dot-product bound, every "
           "element written, nothing beyond n: %s\n", dm_isa_name(dm_gemm_direct_isa()), avx512 ? ", " : "",
           avx512 ? dm_cpu_kernel_packing() : "", cases,
           worst, bad ? "FAIL" : "ok");
    free(buf);
}

int main(void) {
    const char *ok[] = {
        "bji,ui->bju", "bji,iu->bju", "jbi,ui->jbu", "ibj,ui->ubj", "bji,ui->ujb", "bij,ui->bju",
        "bju,bji->ui", "bju,bji->iu", "bji,qhpi->bjqhp", "bjqhp,qhpi->bji", "bjhp,ihp->bji",
        "bjhp,bkhp->bhjk", "hbjp,bhkp->bhjk", "bjhp,bkhp->jbhk", "bhjk,bkhp->bjhp",
        "bhjk,bjhp->bkhp", "bhjk,bkhp->bhjp", "hbkp,bhjk->bjhp",
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) one(ok[k], DM_OK);
    /* larger: m and n of 40 to 120, so that 2 and 3 threads each get rows or columns */
    g_scale = 8;
    const char *big[] = {"bji,ui->bju", "bju,bji->ui", "bji,iu->bju", "jbi,ui->jbu", "bju,ui->bji"};
    for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) one(big[k], DM_OK);
    g_scale = 1;
    one("bjhp,hip->bji", DM_ERR_UNSUPPORTED); /* summed (h,p) not contiguous in the weight */
    one("bji,ui->bui", DM_ERR_UNSUPPORTED);   /* i both summed and kept: not a contraction */
    views();
    /* the direct kernel on every instruction set this CPU has a variant for, the widest
     * first: the narrower ones forced as DMOVE_ISA would */
    const int widest = dm_cpu_isa_widest();
    if (widest == DM_ISA_NONE)
        printf("  direct kernel: SKIP, this CPU has neither AVX-512 nor AVX2 (the algorithm is refused here: "
               "tested above)\n");
    if (widest >= DM_ISA_AVX512 && widest < DM_ISA_AMX)
        printf("  direct kernel (amx): SKIP, this CPU has no AMX tiles with bf16 (or Linux does not grant them): "
               "its widest variant here is %s\n", dm_isa_name(widest));
    for (int isa = widest; isa >= DM_ISA_AVX2; isa--) {
        CHECK_OK(dm_gemm_direct_set_isa(isa));
        for (int pa = 0; pa < (isa == DM_ISA_AVX512 ? 2 : 1); pa++) { /* A^T packed from 3 blocks, from 2 */
            if (isa == DM_ISA_AVX512) dm_direct_set_pack_at(pa);
            direct();
        }
        dm_direct_set_pack_at(-1);
        direct_rows();
    }
    CHECK(dm_gemm_direct_set_isa(widest + 1) == (widest == DM_ISA_AMX ? DM_ERR_INVALID_ARG : DM_ERR_UNSUPPORTED));
    CHECK_OK(dm_gemm_direct_set_isa(DM_ISA_NONE));
    CHECK(!dm_gemm_direct_available());
    {
        dm_gemm gm = {0};
        gm.m = gm.n = gm.k = 1, gm.nbatch = 1;
        CHECK(dm_gemm_set_algo(&gm, DM_GEMM_DIRECT, 1) == DM_ERR_UNSUPPORTED); /* refused, with its reason */
    }
    CHECK_OK(dm_gemm_direct_set_isa(widest));
    /* the direct algorithms above ran the direct kernel, never BLAS for want of a buffer */
    CHECK(dm_gemm_direct_fallbacks() == 0);
    TEST_END();
}
