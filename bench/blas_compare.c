// bench/blas_compare.c: SGEMM throughput of one BLAS on the contractions of one BERT
// training step (forward, data and weight gradients, batched attention), so that the
// BLAS dmove links is chosen by measurement. Built twice from this source: once against
// the OpenMP build of OpenBLAS, once against the OpenMP build of BLIS (-DBENCH_BLIS).
// bench/blas_compare.sh builds both, runs them interleaved and writes the result.
//
// Usage: blas_compare [--batch B] [--seq J] [--hidden I] [--heads H] [--ffn U]
//                     [--reps R] [--warmup W] [--square N] [--thp] [--tsv]
// Every number printed is a median over R timed repetitions after W warm-up ones.
// --thp backs the operands with transparent huge pages (2 MiB-aligned, madvise).
// --tsv prints machine-readable rows "shape<TAB>calls<TAB>gflop<TAB>median_ms".
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifdef BENCH_BLIS
#include <blis.h>
#define LIB_NAME "blis-openmp"
#else
#include <cblas.h>
#define LIB_NAME "openblas-openmp"
#endif

typedef struct {
    int b, j, i, h, u;
    int reps, warmup, square;
    int tsv;
} config;

static int use_thp;  // --thp: back the operands with transparent huge pages (madvise)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *alloc_filled(size_t n, uint32_t seed) {
    size_t align = use_thp ? (size_t)2 << 20 : 64;
    size_t bytes = ((n * sizeof(float) + align - 1) / align) * align;
    float *p = aligned_alloc(align, bytes);
    if (p && use_thp) madvise(p, bytes, MADV_HUGEPAGE);
    if (!p) {
        fprintf(stderr, "blas_compare: out of memory (%zu floats)\n", n);
        exit(1);
    }
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t k = 0; k < n; k++) {  // xorshift values in [-1, 1): no denormals
        s ^= s << 13; s ^= s >> 17; s ^= s << 5;
        p[k] = (float)((double)s / 2147483648.0 - 1.0);
    }
    return p;
}

// One row-major SGEMM, C(m,n) = op(A) op(B), beta = 0.
typedef struct {
    int ta, tb;  // 1: transposed
    int m, n, k;
    const float *a, *b;
    float *c;
    int lda, ldb, ldc;
} gemm_args;

static void gemm(const gemm_args *g) {
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                g->m, g->n, g->k, 1.0f, g->a, g->lda, g->b, g->ldb, 0.0f, g->c, g->ldc);
}

// How a batch of per-(b,h) contractions is spread over the two cores.
enum batch_mode {
    BATCH_LOOP,         // a loop of multi-threaded BLAS calls
    BATCH_OMP,          // omp parallel for over (b,h), BLAS left as it is inside the region
    BATCH_OMP_SET1,     // BLIS: bli_thread_set_num_threads(1) before the region, restored after
    BATCH_OMP_RNTM1,    // BLIS: bli_sgemm_ex with a local rntm_t of one thread per call
};

static const char *batch_mode_name[] = {"loop-mt", "omp-for", "omp-for+set1", "omp-for+rntm1"};

// Batched attention contraction: for every (b,h), C_bh = op(A_bh) op(B_bh), with A, B and C
// addressed as offsets into (b, j, ...) buffers (see attn_* below).
typedef struct {
    const char *name;
    int ta, tb, m, n, k;
    const float *a, *b;
    float *c;
    int lda, ldb, ldc;
    // element offsets of the (b, h) block: base + bi*sb + hi*sh
    long sa_b, sa_h, sb_b, sb_h, sc_b, sc_h;
} batched;

#ifdef BENCH_BLIS
// The same product through BLIS's typed expert interface: row-major strides, and a
// runtime object that says "one thread" for this call only. (bli_thread_set_num_threads
// is process-global in BLIS 0.9: calling it inside a parallel region races.)
static void gemm_rntm1(const gemm_args *g) {
    rntm_t rntm;
    bli_rntm_init(&rntm);
    bli_rntm_set_num_threads_only(1, &rntm);
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(g->ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g->tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
                 g->m, g->n, g->k, &one, (float *)g->a, g->lda, 1, (float *)g->b, g->ldb, 1,
                 &zero, g->c, g->ldc, 1, NULL, &rntm);
}
#endif

static void run_batched(const batched *x, int nb, int nh, enum batch_mode mode) {
    int nbh = nb * nh;
    if (mode == BATCH_LOOP) {
        for (int t = 0; t < nbh; t++) {
            int bi = t / nh, hi = t % nh;
            gemm_args g = {x->ta, x->tb, x->m, x->n, x->k,
                           x->a + bi * x->sa_b + hi * x->sa_h, x->b + bi * x->sb_b + hi * x->sb_h,
                           x->c + bi * x->sc_b + hi * x->sc_h, x->lda, x->ldb, x->ldc};
            gemm(&g);
        }
        return;
    }
#ifdef BENCH_BLIS
    dim_t saved = bli_thread_get_num_threads();
    if (mode == BATCH_OMP_SET1) bli_thread_set_num_threads(1);
#endif
#pragma omp parallel for schedule(static)
    for (int t = 0; t < nbh; t++) {
        int bi = t / nh, hi = t % nh;
        gemm_args g = {x->ta, x->tb, x->m, x->n, x->k,
                       x->a + bi * x->sa_b + hi * x->sa_h, x->b + bi * x->sb_b + hi * x->sb_h,
                       x->c + bi * x->sc_b + hi * x->sc_h, x->lda, x->ldb, x->ldc};
#ifdef BENCH_BLIS
        if (mode == BATCH_OMP_RNTM1) { gemm_rntm1(&g); continue; }
#endif
        gemm(&g);
    }
#ifdef BENCH_BLIS
    if (mode == BATCH_OMP_SET1) bli_thread_set_num_threads(saved);
#endif
}

// Time fn(arg) reps times after warmup calls; returns the median in seconds.
typedef void (*timed_fn)(const void *arg);

static double time_median(timed_fn fn, const void *arg, const config *c) {
    for (int r = 0; r < c->warmup; r++) fn(arg);
    double *t = malloc((size_t)c->reps * sizeof *t);
    if (!t) exit(1);
    for (int r = 0; r < c->reps; r++) {
        double t0 = now_s();
        fn(arg);
        t[r] = now_s() - t0;
    }
    double m = median(t, c->reps);
    free(t);
    return m;
}

static void gemm_fn(const void *arg) { gemm(arg); }

typedef struct {
    const batched *x;
    int nb, nh;
    enum batch_mode mode;
} batched_call;

static void batched_fn(const void *arg) {
    const batched_call *bc = arg;
    run_batched(bc->x, bc->nb, bc->nh, bc->mode);
}

static void report(const config *c, const char *shape, int calls, double flop, double sec) {
    if (c->tsv)
        printf("%s\t%d\t%.6f\t%.4f\n", shape, calls, flop * 1e-9, sec * 1e3);
    else
        printf("  %-34s %5d  %8.3f ms  %7.1f GFLOP/s\n", shape, calls, sec * 1e3, flop / sec * 1e-9);
}

// Peak: a large square SGEMM, timed at the start and again at the end of the run.
static void peak(const config *c, const char *when) {
    int n = c->square;
    float *a = alloc_filled((size_t)n * n, 21), *b = alloc_filled((size_t)n * n, 22);
    float *cc = alloc_filled((size_t)n * n, 23);
    gemm_args g = {0, 0, n, n, n, a, b, cc, n, n, n};
    char nm[64];
    snprintf(nm, sizeof nm, "%s %dx%dx%d", when, n, n, n);
    report(c, nm, 1, 2.0 * n * n * n, time_median(gemm_fn, &g, c));
    free(a); free(b); free(cc);
}

static int parse_int(const char *s, const char *opt) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v <= 0 || v > 1000000) {
        fprintf(stderr, "blas_compare: %s wants a positive integer, got '%s'\n", opt, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    config c = {8, 128, 768, 12, 3072, 15, 3, 2048, 0};
    for (int a = 1; a < argc; a++) {
        const char *o = argv[a];
        if (!strcmp(o, "--tsv")) { c.tsv = 1; continue; }
        if (!strcmp(o, "--thp")) { use_thp = 1; continue; }
        if (a + 1 >= argc) { fprintf(stderr, "blas_compare: %s needs a value\n", o); return 2; }
        int v = parse_int(argv[a + 1], o);
        if (!strcmp(o, "--batch")) c.b = v;
        else if (!strcmp(o, "--seq")) c.j = v;
        else if (!strcmp(o, "--hidden")) c.i = v;
        else if (!strcmp(o, "--heads")) c.h = v;
        else if (!strcmp(o, "--ffn")) c.u = v;
        else if (!strcmp(o, "--reps")) c.reps = v;
        else if (!strcmp(o, "--warmup")) c.warmup = v;
        else if (!strcmp(o, "--square")) c.square = v;
        else { fprintf(stderr, "blas_compare: unknown option %s\n", o); return 2; }
        a++;
    }
    if (c.i % c.h) { fprintf(stderr, "blas_compare: hidden %d not divisible by heads %d\n", c.i, c.h); return 2; }
    const int rows = c.b * c.j, hid = c.i, ffn = c.u, seq = c.j, hp = c.i / c.h, q3 = 3 * c.i;

#ifdef BENCH_BLIS
    const char *version = bli_info_get_version_str();
    int blas_threads = (int)bli_thread_get_num_threads();
#else
    const char *version = openblas_get_config();
    int blas_threads = openblas_get_num_threads();
#endif
    if (!c.tsv)
        printf("# %s (%s): BLAS threads %d, omp_get_max_threads %d; b=%d j=%d i=%d h=%d u=%d; median of %d after %d warm-up\n",
               LIB_NAME, version, blas_threads, omp_get_max_threads(), c.b, c.j, c.i, c.h, c.u, c.reps, c.warmup);
    else
        printf("#lib\t%s\t%s\tblas_threads=%d\tomp_max=%d\n", LIB_NAME, version, blas_threads, omp_get_max_threads());

    if (!c.tsv) printf("peak\n");
    peak(&c, "square (start)");

    // Buffers of one step, in the layouts dmove uses: activations (b*j, features) row-major,
    // weights (out, in) as torch.nn.Linear, Q/K/V stacked as (b, j, q, h, p).
    size_t maxf = (size_t)(ffn > q3 ? ffn : q3);
    float *x = alloc_filled((size_t)rows * maxf, 1);     // layer inputs (b*j, in)
    float *y = alloc_filled((size_t)rows * maxf, 2);     // layer outputs / output gradients (b*j, out)
    float *dx = alloc_filled((size_t)rows * maxf, 3);    // input gradients (b*j, in)
    float *w = alloc_filled((size_t)ffn * hid, 4);        // weight (out, in)
    float *dw = alloc_filled((size_t)ffn * hid, 5);       // weight gradient (out, in)
    float *qkv = alloc_filled((size_t)rows * q3, 6);     // (b, j, q, h, p)
    float *dqkv = alloc_filled((size_t)rows * q3, 7);    // (b, j, q, h, p)
    size_t nscore = (size_t)c.b * c.h * seq * seq;
    float *s = alloc_filled(nscore, 8);               // scores / probabilities (b, h, j, k)
    float *ds = alloc_filled(nscore, 9);              // their gradient (b, h, j, k)
    float *o = alloc_filled((size_t)rows * hid, 10);       // context (b, j, h, p)
    float *dout = alloc_filled((size_t)rows * hid, 11);    // its gradient (b, j, h, p)

    struct { const char *name; int out, in; } lin[] = {
        {"qkv", q3, hid}, {"attn_out", hid, hid}, {"ffn1", ffn, hid}, {"ffn2", hid, ffn},
    };
    double total_linear = 0, total_flop_linear = 0;
    if (!c.tsv) printf("linear layers (M=%d rows)                  calls    median    throughput\n", rows);
    for (int l = 0; l < 4; l++) {
        int N = lin[l].out, K = lin[l].in;
        char nm[96];
        double flop = 2.0 * rows * N * K;
        // forward: Y(M,N) = X(M,K) W(N,K)^T
        gemm_args f = {0, 1, rows, N, K, x, w, y, K, K, N};
        // data gradient: dX(M,K) = dY(M,N) W(N,K)
        gemm_args d = {0, 0, rows, K, N, y, w, dx, N, K, K};
        // weight gradient: dW(N,K) = dY(M,N)^T X(M,K)
        gemm_args g = {1, 0, N, K, rows, y, x, dw, N, K, K};
        const gemm_args *v[3] = {&f, &d, &g};
        const char *kind[3] = {"fwd   Y=X.W^T", "dgrad dX=dY.W", "wgrad dW=dY^T.X"};
        for (int t = 0; t < 3; t++) {
            snprintf(nm, sizeof nm, "%s %s %dx%dx%d", lin[l].name, kind[t], v[t]->m, v[t]->n, v[t]->k);
            double sec = time_median(gemm_fn, v[t], &c);
            report(&c, nm, 1, flop, sec);
            total_linear += sec;
            total_flop_linear += flop;
        }
    }

    // Attention, per (b, h): strides as they fall out of the stacked QKV layout.
    long qkv_b = (long)seq * q3, sc_b = (long)c.h * seq * seq, o_b = (long)seq * hid;
    const float *Qp = qkv, *Kp = qkv + hid, *Vp = qkv + 2 * hid;
    float *dQp = dqkv, *dKp = dqkv + hid, *dVp = dqkv + 2 * hid;
    batched att[] = {
        // S(j,k) = Q(j,p) K(k,p)^T
        {"scores S=Q.K^T", 0, 1, seq, seq, hp, Qp, Kp, s, q3, q3, seq, qkv_b, hp, qkv_b, hp, sc_b, (long)seq * seq},
        // O(j,p) = P(j,k) V(k,p)
        {"context O=P.V", 0, 0, seq, hp, seq, s, Vp, o, seq, q3, hid, sc_b, (long)seq * seq, qkv_b, hp, o_b, hp},
        // dP(j,k) = dO(j,p) V(k,p)^T
        {"bwd dP=dO.V^T", 0, 1, seq, seq, hp, dout, Vp, ds, hid, q3, seq, o_b, hp, qkv_b, hp, sc_b, (long)seq * seq},
        // dV(k,p) = P(j,k)^T dO(j,p)
        {"bwd dV=P^T.dO", 1, 0, seq, hp, seq, s, dout, dVp, seq, hid, q3, sc_b, (long)seq * seq, o_b, hp, qkv_b, hp},
        // dQ(j,p) = dS(j,k) K(k,p)
        {"bwd dQ=dS.K", 0, 0, seq, hp, seq, ds, Kp, dQp, seq, q3, q3, sc_b, (long)seq * seq, qkv_b, hp, qkv_b, hp},
        // dK(k,p) = dS(j,k)^T Q(j,p)
        {"bwd dK=dS^T.Q", 1, 0, seq, hp, seq, ds, Qp, dKp, seq, q3, q3, sc_b, (long)seq * seq, qkv_b, hp, qkv_b, hp},
    };
    int nmodes = 2;
#ifdef BENCH_BLIS
    nmodes = 4;
#endif
    double total_att[4] = {0, 0, 0, 0}, total_flop_att = 0;
    for (int mode = 0; mode < nmodes; mode++) {
        if (!c.tsv) printf("attention, %d batches, %s\n", c.b * c.h, batch_mode_name[mode]);
        for (int t = 0; t < 6; t++) {
            char nm[96];
            snprintf(nm, sizeof nm, "att[%s] %s %dx%dx%d", batch_mode_name[mode], att[t].name, att[t].m, att[t].n, att[t].k);
            batched_call bc = {&att[t], c.b, c.h, (enum batch_mode)mode};
            double flop = 2.0 * att[t].m * att[t].n * att[t].k * c.b * c.h;
            double sec = time_median(batched_fn, &bc, &c);
            report(&c, nm, c.b * c.h, flop, sec);
            total_att[mode] += sec;
            if (mode == 0) total_flop_att += flop;
        }
    }

    peak(&c, "square (end)");

    int best = 0;
    for (int mode = 1; mode < nmodes; mode++) if (total_att[mode] < total_att[best]) best = mode;
    double step = total_linear + total_att[best];
    double flop = total_flop_linear + total_flop_att;
    if (c.tsv) {
        printf("total_linear\t12\t%.6f\t%.4f\n", total_flop_linear * 1e-9, total_linear * 1e3);
        for (int mode = 0; mode < nmodes; mode++) {
            char nm[64];
            snprintf(nm, sizeof nm, "total_attention[%s]", batch_mode_name[mode]);
            printf("%s\t%d\t%.6f\t%.4f\n", nm, 6 * c.b * c.h, total_flop_att * 1e-9, total_att[mode] * 1e3);
        }
        printf("total_step\t%d\t%.6f\t%.4f\n", 12 + 6 * c.b * c.h, flop * 1e-9, step * 1e3);
    } else {
        printf("totals\n");
        report(&c, "linear (12 calls)", 12, total_flop_linear, total_linear);
        for (int mode = 0; mode < nmodes; mode++) {
            char nm[64];
            snprintf(nm, sizeof nm, "attention [%s]", batch_mode_name[mode]);
            report(&c, nm, 6 * c.b * c.h, total_flop_att, total_att[mode]);
        }
        char nm[64];
        snprintf(nm, sizeof nm, "step (attention %s)", batch_mode_name[best]);
        report(&c, nm, 12 + 6 * c.b * c.h, flop, step);
    }
    free(x); free(y); free(dx); free(w); free(dw); free(qkv); free(dqkv);
    free(s); free(ds); free(o); free(dout);
    return 0;
}
