/* probe_direct.c: dm_profile_measure_direct (dmove_tools.h): dmove's own GEMM kernel on
 * the probe's square problem at each thread count the probe timed SGEMM at, so that the
 * roofline's contraction rate is the faster of the two (an AMX CPU runs fp32 GEMMs on its
 * tile unit through it, far past OpenBLAS's SGEMM on the FMA units: without it a step's
 * contractions sat below their "floor"). Timed as the probe times SGEMM: the best of at
 * least 4 timed runs and 1 s, after a warm-up run. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis_api.h"
#include "core/status.h"
#include "cpu/contract.h"

dm_status dm_profile_measure_direct(dm_profile *prof, void (*progress)(const char *line)) {
    if (!prof) return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_measure_direct: NULL argument");
    dm_cpu_profile *p = &prof->p;
    if (!dm_gemm_direct_available() || p->nsgemm < 1 || p->sgemm_n < 1) return DM_OK;
    if (p->sgemm_n > 8192)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_profile_measure_direct: the profile's GEMM is %d^3; the kernel is "
                       "timed on 8192^3 at most (the probe's is 2048^3)", p->sgemm_n);
    const int n = p->sgemm_n;
    int most = 1;
    for (int k = 0; k < p->nsgemm; k++) most = p->sgemm_threads[k] > most ? p->sgemm_threads[k] : most;
    const size_t sq = (size_t)n * (size_t)n;
    float *A = aligned_alloc(64, sq * sizeof(float)), *B = aligned_alloc(64, sq * sizeof(float)),
          *C = aligned_alloc(64, sq * sizeof(float)),
          *pack = aligned_alloc(64, sizeof(float) * (size_t)DM_GEMM_DIRECT_PACK_FLOATS * (size_t)most);
    if (!A || !B || !C || !pack) {
        free(A), free(B), free(C), free(pack);
        return dm_fail(DM_ERR_OOM, "cannot allocate %.0f MiB for the direct kernel's probe",
                       (3.0 * (double)sq * 4 + (double)DM_GEMM_DIRECT_PACK_FLOATS * 4 * most) / (1 << 20));
    }
    for (size_t i = 0; i < sq; i++) A[i] = (float)(i % 17) * 0.01f, B[i] = (float)(i % 13) * 0.01f, C[i] = 0;
    dm_status st = DM_OK;
    const char *kernel = dm_isa_name(dm_gemm_direct_isa());
    for (int k = 0; k < p->nsgemm && st == DM_OK; k++) {
        dm_gemm gm;
        memset(&gm, 0, sizeof gm);
        gm.A = A, gm.B = B, gm.C = C, gm.m = gm.n = gm.k = n, gm.lda = gm.ldb = gm.ldc = n;
        gm.alpha = 1.0f, gm.beta = 0.0f, gm.nbatch = 1, gm.pack = pack, gm.pack_threads = most;
        st = dm_gemm_set_algo(&gm, DM_GEMM_DIRECT, p->sgemm_threads[k]);
        double best = 1e30, start = omp_get_wtime();
        for (int rep = 0; st == DM_OK && rep < 200 && (rep < 5 || omp_get_wtime() - start < 1.0); rep++) {
            const double t0 = omp_get_wtime();
            st = dm_gemm_run(&gm);
            const double t = omp_get_wtime() - t0;
            if (rep > 0 && t < best) best = t; /* rep 0: warm-up */
        }
        if (st != DM_OK) break;
        p->direct_flops[k] = 2.0 * n * (double)n * n / best;
        if (progress) {
            char line[160];
            snprintf(line, sizeof line, "dmove's GEMM kernel (%s) %dx%dx%d, %d thread%s: %.1f GFLOP/s", kernel, n, n,
                     n, p->sgemm_threads[k], p->sgemm_threads[k] > 1 ? "s" : "", p->direct_flops[k] / 1e9);
            progress(line);
        }
    }
    if (st == DM_OK) snprintf(p->direct_kernel, sizeof p->direct_kernel, "%s", kernel);
    else { /* no rates, no name: the profile as SGEMM alone */
        memset(p->direct_flops, 0, sizeof p->direct_flops);
        p->direct_kernel[0] = 0;
    }
    free(A), free(B), free(C), free(pack);
    return st;
}
