// bench/model_ops.c: the whole model's operators on the CPU backend at BERT's sizes (a
// batch of B x J tokens, hidden I, vocabulary V, 15% of the tokens masked): the word
// lookup (embed), its gradient (embed_bwd: the whole table written), the masked-LM loss
// (xent over masked rows x V) and its backward (xent_bwd, in place over the logits as the
// fused plan runs it), each a one-op plan run through the executor. Every time is a median
// over R runs after W warm-up ones; beside each, the bytes the cost model counts for it,
// the rate that makes, and the same run's memcpy of as many bytes (its ratio: how far the
// operator is from the copy floor on this machine). Then BERT's embeddings forward (three
// lookups, two adds, LayerNorm) as the fused plan runs it (one group) and unfused.
//
// Build (one line): make CUDA=0 BUILD=build-cpu build-cpu/libdmove.a && cc -O3 -march=native
//   -fopenmp -Iinclude -Isrc bench/model_ops.c build-cpu/libdmove.a -o build-cpu/bench_model_ops
//   $(pkg-config --libs openblas) -lcjson -lm
// Usage: build-cpu/bench_model_ops [--batch B] [--seq J] [--hidden I] [--vocab V]
//                                  [--threads T] [--reps R]
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/exec.h"
#include "graph/graph.h"
#include "plan/plan.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* One op of kind k: rows x cols, table n rows; in-place (xent_bwd over its logits) with
 * a fused plan. Prints its median time, bytes and rate against memcpy of those bytes. */
static void bench(dm_op_kind k, const char *what, int64_t rows, int64_t cols, int64_t n, int threads, int reps) {
    dm_graph g;
    dm_graph_init(&g);
    g.dim['r' - 'a'] = rows, g.dim['c' - 'a'] = cols, g.dim['n' - 'a'] = n;
    dm_op op = {.kind = k, .nin = dm_op_nin(k), .nout = dm_op_nout(k), .rows = rows, .cols = cols,
                .nindex = dm_op_indexed(k) ? n : 0};
    snprintf(op.name, sizeof op.name, "%s", what);
    for (int io = 0; io < 2; io++)
        for (int s = 0; s < (io ? op.nout : op.nin); s++) {
            dm_arg_kind a = io ? dm_arg_out(k, s) : dm_arg_in(k, s);
            const char *l = a == DM_ARG_INDEXED || a == DM_ARG_SCATTER ? "nc" : a == DM_ARG_ROWSCALAR ? "r" : "rc";
            char name[16];
            snprintf(name, sizeof name, "%s%d", io ? "out" : "in", s);
            /* xent_bwd's logits die in it: an activation, so its output may take their bytes */
            dm_role role = io ? DM_ROLE_OUTPUT : (k == DM_OP_XENT_BWD && s == 0 ? DM_ROLE_ACT : DM_ROLE_INPUT);
            int t = dm_graph_tensor(&g, name, l, role);
            if (io) op.out[s] = t;
            else op.in[s] = t;
        }
    dm_plan plan;
    if (dm_graph_op(&g, &op) < 0 || dm_plan_build(&g, 1, 0, 0, &plan) != DM_OK) {
        fprintf(stderr, "%s: %s\n", what, dm_last_error());
        exit(1);
    }
    char *arena = aligned_alloc(64, (plan.arena_bytes + 64) / 64 * 64);
    for (int s = 0; s < op.nin; s++) {
        float *p = dm_cpu_tensor_ptr(&plan, arena, op.in[s]);
        const int64_t m = g.t[op.in[s]].numel;
        const int index = dm_arg_in(k, s) == DM_ARG_ROWSCALAR && (s == dm_op_index_slot(k) || k == DM_OP_XENT ||
                                                                    (k == DM_OP_XENT_BWD && s == 2));
        const int64_t range = dm_op_indexed(k) ? n : cols;
        for (int64_t e = 0; e < m; e++) p[e] = index ? (float)(g_rng % (uint64_t)range) + 0 * frand() : frand();
        if (k == DM_OP_XENT_BWD && s == 1)
            for (int64_t e = 0; e < m; e++) p[e] = 12.0f; /* a logsumexp above every logit */
    }
    dm_cpu_exec ex;
    if (dm_cpu_exec_init(&ex, &plan, arena, threads) != DM_OK) {
        fprintf(stderr, "%s: %s\n", what, dm_last_error());
        exit(1);
    }
    const double bytes = dm_op_bytes(&g, &op);
    char *src = aligned_alloc(64, (size_t)bytes / 2 + 64), *dst = aligned_alloc(64, (size_t)bytes / 2 + 64);
    memset(src, 1, (size_t)bytes / 2);
    memset(dst, 0, (size_t)bytes / 2);
    double t[64], c[64];
    if (reps > 64) reps = 64;
    for (int q = -2; q < reps; q++) {
        double t0 = now();
        for (int gi = 0; gi < plan.ngroups; gi++) dm_cpu_exec_group(&ex, gi, 1, 0);
        double t1 = now();
#pragma omp parallel num_threads(threads)
        { /* the copy floor: read bytes/2, write bytes/2, split over the threads */
            const size_t half = (size_t)bytes / 2, T = (size_t)omp_get_num_threads(), i = (size_t)omp_get_thread_num();
            const size_t lo = half * i / T, hi = half * (i + 1) / T;
            memcpy(dst + lo, src + lo, hi - lo);
        }
        double t2 = now();
        if (q >= 0) t[q] = t1 - t0, c[q] = t2 - t1;
    }
    const double mt = median(t, reps), mc = median(c, reps);
    printf("%-10s %-34s %9.3f ms %9.1f MB %7.2f GB/s   memcpy %7.3f ms  ratio %5.2f\n", dm_op_kind_name(k), what,
           1e3 * mt, bytes / 1e6, bytes / mt / 1e9, 1e3 * mc, mt / mc);
    dm_cpu_exec_free(&ex);
    free(arena);
    free(src);
    free(dst);
    dm_plan_free(&plan);
    dm_graph_free(&g);
}

/* BERT's embeddings forward: three lookups (word, position, token type), two adds and the
 * LayerNorm, as the fused plan runs them (one group: the lookups' rows never reach
 * memory) and unfused (an op per group). Prints both medians and their ratio. */
static void bench_embeddings(int64_t B, int64_t J, int64_t I, int64_t V, int threads, int reps) {
    double med[2];
    int ngroups[2];
    for (int fused = 0; fused < 2; fused++) {
        dm_graph g;
        dm_graph_init(&g);
        g.dim['b' - 'a'] = B, g.dim['j' - 'a'] = J, g.dim['i' - 'a'] = I, g.dim['v' - 'a'] = V;
        g.dim['m' - 'a'] = 512, g.dim['t' - 'a'] = 2;
        const char *tabl[3] = {"vi", "mi", "ti"};
        const int64_t rows[3] = {V, 512, 2};
        int ids[3], tab[3], e[3], s1, s2, y, mean, rstd, gm, bt;
        char name[16];
        for (int q = 0; q < 3; q++) {
            snprintf(name, sizeof name, "ids%d", q);
            ids[q] = dm_graph_tensor(&g, name, "bj", DM_ROLE_INPUT);
            snprintf(name, sizeof name, "table%d", q);
            tab[q] = dm_graph_tensor(&g, name, tabl[q], DM_ROLE_PARAM);
            snprintf(name, sizeof name, "e%d", q);
            e[q] = dm_graph_tensor(&g, name, "bji", DM_ROLE_ACT);
        }
        s1 = dm_graph_tensor(&g, "s1", "bji", DM_ROLE_ACT);
        s2 = dm_graph_tensor(&g, "s2", "bji", DM_ROLE_ACT);
        y = dm_graph_tensor(&g, "y", "bji", DM_ROLE_OUTPUT);
        mean = dm_graph_tensor(&g, "mean", "bj", DM_ROLE_ACT);
        rstd = dm_graph_tensor(&g, "rstd", "bj", DM_ROLE_ACT);
        gm = dm_graph_tensor(&g, "gamma", "i", DM_ROLE_PARAM);
        bt = dm_graph_tensor(&g, "beta", "i", DM_ROLE_PARAM);
        int ok = 1;
        for (int q = 0; q < 3; q++) {
            dm_op op = {.kind = DM_OP_EMBED, .nin = 2, .nout = 1, .rows = B * J, .cols = I, .nindex = rows[q],
                        .in = {tab[q], ids[q]}, .out = {e[q]}};
            snprintf(op.name, sizeof op.name, "embed%d", q);
            ok &= dm_graph_op(&g, &op) >= 0;
        }
        dm_op a1 = {.kind = DM_OP_ADD, .name = "add1", .nin = 2, .nout = 1, .rows = B * J, .cols = I,
                    .in = {e[0], e[1]}, .out = {s1}};
        dm_op a2 = {.kind = DM_OP_ADD, .name = "add2", .nin = 2, .nout = 1, .rows = B * J, .cols = I,
                    .in = {s1, e[2]}, .out = {s2}};
        dm_op ln = {.kind = DM_OP_LAYERNORM, .name = "ln", .nin = 3, .nout = 3, .rows = B * J, .cols = I,
                    .eps = 1e-12, .in = {s2, gm, bt}, .out = {y, mean, rstd}};
        ok &= dm_graph_op(&g, &a1) >= 0 && dm_graph_op(&g, &a2) >= 0 && dm_graph_op(&g, &ln) >= 0;
        dm_plan plan;
        dm_cpu_exec ex;
        if (!ok || dm_plan_build(&g, fused, 0, 0, &plan) != DM_OK) {
            fprintf(stderr, "embeddings: %s\n", dm_last_error());
            exit(1);
        }
        char *arena = aligned_alloc(64, (plan.arena_bytes + 64) / 64 * 64);
        for (int q = 0; q < 3; q++) {
            float *p = dm_cpu_tensor_ptr(&plan, arena, ids[q]), *t = dm_cpu_tensor_ptr(&plan, arena, tab[q]);
            for (int64_t k = 0; k < B * J; k++) p[k] = (float)(g_rng % (uint64_t)rows[q]), frand();
            for (int64_t k = 0; k < rows[q] * I; k++) t[k] = frand();
        }
        float *pg = dm_cpu_tensor_ptr(&plan, arena, gm), *pb = dm_cpu_tensor_ptr(&plan, arena, bt);
        for (int64_t k = 0; k < I; k++) pg[k] = 1.0f, pb[k] = 0.0f;
        if (dm_cpu_exec_init(&ex, &plan, arena, threads) != DM_OK) {
            fprintf(stderr, "embeddings: %s\n", dm_last_error());
            exit(1);
        }
        double t[64];
        for (int q = -2; q < reps; q++) {
            double t0 = now();
            for (int gi = 0; gi < plan.ngroups; gi++) dm_cpu_exec_group(&ex, gi, 1, 0);
            if (q >= 0) t[q] = now() - t0;
        }
        med[fused] = median(t, reps);
        ngroups[fused] = plan.ngroups;
        dm_cpu_exec_free(&ex);
        free(arena);
        dm_plan_free(&plan);
        dm_graph_free(&g);
    }
    printf("embeddings forward (3 lookups, 2 adds, LayerNorm) %lldx%lld: unfused %d groups %.3f ms, fused %d group%s "
           "%.3f ms, ratio %.2f\n", (long long)(B * J), (long long)I, ngroups[0], 1e3 * med[0], ngroups[1],
           ngroups[1] > 1 ? "s" : "", 1e3 * med[1], med[0] / med[1]);
}

int main(int argc, char **argv) {
    int64_t B = 32, J = 128, I = 768, V = 30522;
    int threads = omp_get_max_threads(), reps = 11;
    for (int a = 1; a + 1 < argc; a += 2) {
        long long v = atoll(argv[a + 1]);
        if (!strcmp(argv[a], "--batch")) B = v;
        else if (!strcmp(argv[a], "--seq")) J = v;
        else if (!strcmp(argv[a], "--hidden")) I = v;
        else if (!strcmp(argv[a], "--vocab")) V = v;
        else if (!strcmp(argv[a], "--threads")) threads = (int)v;
        else if (!strcmp(argv[a], "--reps")) reps = (int)v;
        else {
            fprintf(stderr, "unknown option %s (see the header of bench/model_ops.c)\n", argv[a]);
            return 2;
        }
    }
    const int64_t R = B * J, Km = (R * 15 + 99) / 100;
    printf("whole-model operators, B %lld x J %lld tokens, hidden %lld, vocabulary %lld, %lld masked rows, %d "
           "threads, median of %d\n", (long long)B, (long long)J, (long long)I, (long long)V, (long long)Km, threads,
           reps);
    char w[64];
    snprintf(w, sizeof w, "word lookup %lldx%lld of %lld", (long long)R, (long long)I, (long long)V);
    bench(DM_OP_EMBED, w, R, I, V, threads, reps);
    snprintf(w, sizeof w, "word table grad %lldx%lld", (long long)V, (long long)I);
    bench(DM_OP_EMBED_BWD, w, R, I, V, threads, reps);
    snprintf(w, sizeof w, "MLM loss %lldx%lld", (long long)Km, (long long)V);
    bench(DM_OP_XENT, w, Km, V, 0, threads, reps);
    snprintf(w, sizeof w, "MLM dlogits %lldx%lld (in place)", (long long)Km, (long long)V);
    bench(DM_OP_XENT_BWD, w, Km, V, 0, threads, reps);
    bench_embeddings(B, J, I, V, threads, reps);
    return 0;
}
