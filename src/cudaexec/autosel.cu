/* autosel.cu: --rows auto (DM_CUDA_AUTO): when the executor is made, each choice of the
 * generator (a fused attention kernel, a bias epilogue, a generated row kernel) is timed
 * against what it replaces, with CUDA events, and kept only where it is faster. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudaexec/exec.h"

static double host_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Sorts n (a handful of) timings ascending, in place: insertion sort. */
static void sort_small(double *t, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
}

/* The median time of `reps` runs of group gi as it is set up now, after two warm-ups
 * (one emulating):
 * on the GPU the runs are enqueued back to back with an event between each two (so the
 * host's launch gaps, which a step hides, are not counted), and read after one wait;
 * emulating, host time. */
static dm_status time_group(dm_cuda_exec *ex, int gi, int reps, double *ms) {
    enum { MAXR = 9 };
    double t[MAXR];
    cudaEvent_t ev[MAXR + 1] = {0};
    if (reps > MAXR) reps = MAXR;
    dm_status s = DM_OK;
    for (int r = 0; r <= reps && s == DM_OK && !dmx_emulated(ex); r++) {
        cudaError_t ce = cudaEventCreate(&ev[r]);
        if (ce != cudaSuccess) {
            ev[r] = NULL;
            s = dm_fail(DM_ERR_BACKEND, "cudaEventCreate failed: %s", cudaGetErrorString(ce));
        }
    }
    for (int r = 0; r < (dmx_emulated(ex) ? 1 : 2) && s == DM_OK; r++) s = dm_cuda_exec_group(ex, gi, 0, 0);
    if (s == DM_OK && !dmx_emulated(ex) && cudaEventRecord(ev[0], ex->stream) != cudaSuccess)
        s = dm_fail(DM_ERR_BACKEND, "cudaEventRecord failed");
    for (int r = 0; r < reps && s == DM_OK; r++) {
        const double h0 = host_now();
        s = dm_cuda_exec_group(ex, gi, 0, 0);
        if (s == DM_OK && dmx_emulated(ex)) t[r] = (host_now() - h0) * 1e3;
        else if (s == DM_OK && cudaEventRecord(ev[r + 1], ex->stream) != cudaSuccess)
            s = dm_fail(DM_ERR_BACKEND, "cudaEventRecord failed");
    }
    if (s == DM_OK && !dmx_emulated(ex)) {
        cudaError_t ce = cudaEventSynchronize(ev[reps]);
        for (int r = 0; r < reps && ce == cudaSuccess; r++) {
            float f = 0;
            ce = cudaEventElapsedTime(&f, ev[r], ev[r + 1]);
            t[r] = f;
        }
        if (ce != cudaSuccess) s = dm_fail(DM_ERR_BACKEND, "timing group %d: %s", gi, cudaGetErrorString(ce));
    }
    for (int r = 0; r <= reps; r++)
        if (ev[r]) (void)cudaEventDestroy(ev[r]);
    DM_TRY(s);
    sort_small(t, reps);
    *ms = t[reps / 2];
    return DM_OK;
}

/* One choice auto weighs: a fused attention kernel (FUSED), a bias epilogue (EPI: off,
 * the contraction and then the bias group gi + 1 run), a generated row kernel (GEN). */
enum { CH_FUSED, CH_EPI, CH_GEN };
typedef struct {
    int kind, gi;
    int fused;   /* CH_FUSED: the group's fused index */
    dmc_epi *epi;
    int prog, k; /* CH_GEN: the program and its kernel */
} dmc_choice;

static void choice_set(dm_cuda_exec *ex, const dmc_choice *c, int on) {
    dmc_group *eg = &ex->groups[c->gi];
    switch (c->kind) {
    case CH_FUSED: eg->fused = on ? c->fused : 0; break;
    case CH_EPI:
        eg->epi = on ? c->epi : NULL;
        ex->groups[c->gi + 1].skip = on;
        break;
    default: ex->gen_of[c->prog] = on ? c->k : -1; break;
    }
}

/* Median time of the choice on and off, timed in alternation (on, off, off, on, on, off)
 * so that neither side always runs first, on a cold or a warm GPU. */
static dm_status time_choice(dm_cuda_exec *ex, const dmc_choice *c, double *on_ms, double *off_ms) {
    enum { ROUNDS = 6, REPS = 3 };
    double t[2][ROUNDS];
    /* emulating, host timings mean little and each run is slow: two rounds of one */
    const int rounds = dmx_emulated(ex) ? 2 : ROUNDS, reps = dmx_emulated(ex) ? 1 : REPS;
    for (int r = 0; r < rounds; r++) {
        const int first = (r + 1) / 2 % 2 == 0; /* on first in rounds 0, 3, 4 */
        for (int q = 0; q < 2; q++) {
            const int on = q == 0 ? first : !first;
            choice_set(ex, c, on);
            double a = 0, b = 0;
            dm_status s = time_group(ex, c->gi, reps, &a);
            if (s == DM_OK && c->kind == CH_EPI && !on) s = time_group(ex, c->gi + 1, reps, &b);
            if (s != DM_OK) {
                choice_set(ex, c, 1);
                return s;
            }
            t[on][r] = a + b;
        }
    }
    for (int on = 0; on < 2; on++) sort_small(t[on], rounds); /* then the middle pair */
    *on_ms = 0.5 * (t[1][rounds / 2 - 1] + t[1][rounds / 2]);
    *off_ms = 0.5 * (t[0][rounds / 2 - 1] + t[0][rounds / 2]);
    return DM_OK;
}

/* Every group once in order, repeated for at least `ms` of GPU time: clocks up, caches
 * and lazily loaded modules warm, before the first choice is timed. */
static dm_status warm_up(dm_cuda_exec *ex, double ms) {
    if (dmx_emulated(ex)) return DM_OK;
    const double t0 = host_now();
    for (int round = 0; round < 1000 && (host_now() - t0) * 1e3 < ms; round++) {
        for (int gi = 0; gi < ex->ngroups; gi++) DM_TRY(dm_cuda_exec_group(ex, gi, 0, 0));
        DMC_CUDA(cudaStreamSynchronize(ex->stream));
    }
    return DM_OK;
}

/* DM_CUDA_AUTO: each choice the generator made, measured against what it replaces, kept
 * only where it is faster: a fused attention kernel against cuBLAS around the row
 * program's own generated kernel (or the interpreter, where the generator does not take
 * it), which, if the fused kernel loses, is timed against the interpreter next; a bias
 * epilogue against the contraction and the bias group; a generated row kernel against
 * the interpreter. The arena is zeroed again after. */
dm_status dmx_auto_select(dm_cuda_exec *ex) {
    /* the tests' way to make every choice one way (the timings decide otherwise):
     * DMOVE_TEST_AUTO=gen keeps every generated choice, =interp drops every one,
     * =unfused drops the fused kernels only */
    const char *force = getenv("DMOVE_TEST_AUTO");
    const int f_gen = force && !strcmp(force, "gen"), f_interp = force && !strcmp(force, "interp"),
              f_unfused = force && !strcmp(force, "unfused"); /* =unfused: cuBLAS + generated */
    int choices = ex->nfused + ex->nepi;
    for (int i = 0; i < ex->nprogs && ex->gen_of; i++) choices += ex->gen_of[i] >= 0;
    if (choices && !(f_gen || f_interp || f_unfused)) DM_TRY(warm_up(ex, 200.0));
    for (int gi = 0; gi < ex->ngroups; gi++) {
        dmc_group *eg = &ex->groups[gi];
        if (eg->skip) continue; /* a bias in the epilogue before it: nothing runs */
        /* the group's row program, if it has exactly one */
        int prog = -1, rows = 0;
        for (int k = 0; k < eg->nsteps; k++)
            if (dmx_step_rows(&eg->steps[k])) prog = eg->steps[k].prog, rows++;
        if (rows != 1) prog = -1;
        for (int pass = 0; pass < 2; pass++) {
            dmc_choice c;
            memset(&c, 0, sizeof c);
            c.gi = gi;
            if (pass == 0 && eg->fused) {
                c.kind = CH_FUSED;
                c.fused = eg->fused;
            } else if (pass == 0 && eg->epi && gi + 1 < ex->ngroups) {
                c.kind = CH_EPI;
                c.epi = eg->epi;
            } else if (!eg->fused && !eg->epi && prog >= 0 && ex->gen_of && ex->gen_of[prog] >= 0) {
                /* pass 0: a row group; pass 1: the row program of a group whose fused kernel
                 * lost, between the GEMMs */
                c.kind = CH_GEN;
                c.prog = prog;
                c.k = ex->gen_of[prog];
            } else {
                continue;
            }
            if (pass == 1 && c.kind != CH_GEN) continue;
            double on = 0, off = 0;
            DM_TRY(time_choice(ex, &c, &on, &off));
            const int keep = (f_gen || f_interp || f_unfused)
                                 ? f_gen || (f_unfused && c.kind != CH_FUSED)
                                 : on <= off;
            choice_set(ex, &c, keep);
            if (keep) break;
            if (c.kind == CH_FUSED) ex->nfused--;
            else if (c.kind == CH_EPI) {
                dmx_epi_free(c.epi);
                ex->nepi--;
            }
        }
    }
    if (!ex->nepi && ex->have_lt) { /* no epilogue kept: cuBLASLt's handle and workspace go */
        dmx_dev_free(ex, ex->lt_ws);
        ex->lt_ws = NULL;
        ex->dev_bytes -= ex->lt_ws_bytes ? ex->lt_ws_bytes : 256; /* as dev_alloc counted it */
        (void)cublasLtDestroy(ex->lt);
        ex->have_lt = 0;
    }
    const size_t bytes = ex->arena_bytes / 4 * (size_t)ex->esz;
    if (dmx_emulated(ex)) {
        memset(ex->arena, 0, bytes);
        if (ex->side) memset(ex->side, 0, ex->side_floats * sizeof(float));
    } else {
        DMC_CUDA(cudaMemsetAsync(ex->arena, 0, bytes ? bytes : 256, ex->stream));
        if (ex->side) DMC_CUDA(cudaMemsetAsync(ex->side, 0, ex->side_floats * sizeof(float), ex->stream));
        DMC_CUDA(cudaStreamSynchronize(ex->stream));
    }
    return DM_OK;
}
