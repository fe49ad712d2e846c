/* epilogue.cu: a contraction followed by a lone bias add runs as one cuBLASLt call with
 * the bias in its epilogue (DM_CUDA_EPILOGUE), where cuBLASLt has an algorithm for it;
 * emulated on the host for the tests. */
#include <stdlib.h>
#include <string.h>

#include "cudaexec/exec.h"

static cudaDataType_t blas_type(int dtype) {
    return dtype == DM_CUDA_BF16 ? CUDA_R_16BF : dtype == DM_CUDA_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two (at most 256) that divides address p. */
static uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

/* The descriptors and algorithm of e for gm: D (n x m column-major) = alpha op(B)^T op(A)^T
 * + bias. DM_ERR_UNSUPPORTED if cuBLASLt has no algorithm for it. */
static dm_status epi_prepare(dm_cuda_exec *ex, const dm_gemm_map *gm, dmc_epi *e) {
    const cudaDataType_t ty = blas_type(ex->dtype);
    const cublasComputeType_t ct = (ex->flags & DM_CUDA_TF32) && ex->dtype == DM_CUDA_FP32
                                       ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t o1 = gm->transB ? CUBLAS_OP_T : CUBLAS_OP_N, o2 = gm->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = (int32_t)ty;
    DMC_BLAS(cublasLtMatmulDescCreate(&e->op, ct, CUDA_R_32F));
    e->have_op = 1;
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &o1, sizeof o1));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &o2, sizeof o2));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    DMC_BLAS(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    /* column-major storage: op N keeps (rows, cols) of op(X), op T swaps them */
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->l1, ty, gm->transB ? gm->k : gm->n, gm->transB ? gm->n : gm->k, gm->ldb));
    e->have_l1 = 1;
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->l2, ty, gm->transA ? gm->m : gm->k, gm->transA ? gm->k : gm->m, gm->lda));
    e->have_l2 = 1;
    DMC_BLAS(cublasLtMatrixLayoutCreate(&e->ld, ty, gm->n, gm->m, gm->ldc));
    e->have_ld = 1;
    cublasLtMatmulPreference_t pref;
    DMC_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ex->lt_ws_bytes;
    const uint32_t a1 = align_of(gm->B), a2 = align_of(gm->A), ad = align_of(e->D);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof a1);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof a2);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(ex->lt, e->op, e->l1, e->l2, e->ld, e->ld, pref, 1, &res, &nres);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || nres < 1)
        return dm_fail(DM_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for the bias epilogue (%s)",
                       cublasGetStatusString(st));
    e->algo = res.algo;
    return DM_OK;
}

/* Every lone contraction whose output only the next group reads, that group being one
 * bias add over the same rows x cols in the same pass, takes the bias into its epilogue
 * (DM_CUDA_EPILOGUE; DMOVE_CUDA_EPILOGUE=0 turns it off). Where cuBLASLt has no algorithm,
 * or the biased tensor shares bytes with an operand, both stay. A run of some classes
 * only (dm_layer_run's class mask) counts the bias with the contraction. */
dm_status dmx_init_epilogues(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    const char *off = getenv("DMOVE_CUDA_EPILOGUE");
    if (off && !strcmp(off, "0")) return DM_OK;
    for (int gi = 0; gi + 1 < ex->ngroups; gi++) {
        dmc_group *eg = &ex->groups[gi], *nx = &ex->groups[gi + 1];
        const dm_group *pg = &plan->groups[gi], *pn = &plan->groups[gi + 1];
        if (eg->nsteps != 1 || !eg->steps[0].gemm || eg->steps[0].ptrs || pg->nbatch > 1 || pn->nops != 1 ||
            pn->nbatch > 1 || nx->nsteps != 1 || nx->fused || dmx_live_scaled(ex, gi) || dmx_live_scaled(ex, gi + 1))
            continue;
        const dm_gemm_map *gm = &eg->steps[0].gm;
        const dm_op *c = dmx_op_at(plan, pg, 0), *b = dmx_op_at(plan, pn, 0);
        if (b->kind != DM_OP_BIAS_ADD || gm->nbd != 0 || gm->beta != 0.0f || b->rows != gm->m || b->cols != gm->n ||
            gm->ldc != gm->n)
            continue;
        const int pre = dm_tensor_root(g, c->out[0]);
        int dt = 0, dtb = 0, dto = 0;
        if (dm_tensor_root(g, b->in[0]) != pre || dmx_arena_ptr(ex, b->in[0], &dt) != (void *)gm->C) continue;
        const void *bias = dmx_arena_ptr(ex, b->in[1], &dtb);
        void *D = dmx_arena_ptr(ex, b->out[0], &dto);
        if (!bias || !D || dtb != ex->dtype || dto != ex->dtype || dm_tensor_root(g, b->out[0]) == pre) continue;
        int read_elsewhere = 0; /* the pre-bias tensor: read by the bias group alone */
        for (int o = 0; o < g->nop && !read_elsewhere; o++) {
            if (&g->op[o] == b) continue;
            for (int s = 0; s < g->op[o].nin; s++) read_elsewhere |= dm_tensor_root(g, g->op[o].in[s]) == pre;
        }
        if (read_elsewhere || pg->pass != pn->pass) continue;
        /* the memory planner may give the biased tensor the bytes of an input that dies
         * at the contraction: written while it is read, as one call */
        int overlap = 0;
        const int dr = dm_tensor_root(g, b->out[0]);
        const int64_t d0 = plan->offset[dr], d1 = d0 + g->t[dr].numel * (int64_t)sizeof(float);
        const int ins[3] = {c->in[0], c->in[1], b->in[1]};
        for (int q = 0; q < 3; q++) {
            const int r = dm_tensor_root(g, ins[q]);
            const int64_t a0 = plan->offset[r], a1 = a0 + g->t[r].numel * (int64_t)sizeof(float);
            overlap |= a0 < d1 && d0 < a1;
        }
        if (overlap) continue;
        if (!dmx_emulated(ex) && !ex->have_lt) {
            DMC_BLAS(cublasLtCreate(&ex->lt));
            ex->have_lt = 1;
            ex->lt_ws_bytes = (size_t)32 << 20;
            DM_TRY(dmx_dev_alloc(ex, &ex->lt_ws, ex->lt_ws_bytes, "cuBLASLt's workspace"));
        }
        dmc_epi *e = (dmc_epi *)calloc(1, sizeof *e);
        if (!e) return dm_fail(DM_ERR_OOM, "out of memory preparing the CUDA plan");
        e->bias = bias;
        e->D = D;
        if (!dmx_emulated(ex) && epi_prepare(ex, gm, e) != DM_OK) {
            dmx_epi_free(e);
            dm_clear_error(); /* no algorithm (or no descriptor): the two groups run as before */
            continue;
        }
        eg->epi = e;
        nx->skip = 1;
        ex->nepi++;
    }
    return DM_OK;
}

/* The contraction of group eg with its bias epilogue. Emulating: the GEMM into D, then
 * the bias added (and rounded to the storage type again: the GPU rounds once). */
dm_status dmx_run_epi(const dm_cuda_exec *ex, const dmc_group *eg) {
    const dm_gemm_map *gm = &eg->steps[0].gm;
    const dmc_epi *e = eg->epi;
    const float alpha = gm->alpha, beta = 0.0f;
    if (!dmx_emulated(ex)) {
        DMC_BLAS(cublasLtMatmul(ex->lt, e->op, &alpha, gm->B, e->l1, gm->A, e->l2, &beta, e->D, e->ld, e->D,
                                e->ld, &e->algo, ex->lt_ws, ex->lt_ws_bytes, ex->stream));
        return DM_OK;
    }
    dmc_emu_gemm(ex->dtype, gm->transB, gm->transA, gm->n, gm->m, gm->k, alpha, gm->B, gm->ldb, 0, gm->A,
                 gm->lda, 0, 0.0f, e->D, gm->ldc, 0, 1);
    for (int64_t r = 0; r < gm->m; r++)
        for (int64_t c = 0; c < gm->n; c++) {
            const size_t at = (size_t)(r * gm->ldc + c);
            float y, b;
            dmx_widen(ex->dtype, (const char *)e->D + at * ex->esz, &y, 1);
            dmx_widen(ex->dtype, (const char *)e->bias + (size_t)c * ex->esz, &b, 1);
            y += b;
            dmx_narrow(ex->dtype, &y, (char *)e->D + at * ex->esz, 1);
        }
    return DM_OK;
}

int dm_cuda_exec_epilogues(const dm_cuda_exec *ex) { return ex ? ex->nepi : 0; }

int dm_cuda_exec_group_absorbed(const dm_cuda_exec *ex, int gi) {
    return ex && ex->groups && gi >= 0 && gi < ex->ngroups && ex->groups[gi].skip;
}

/* Frees what init made, ignoring errors (there is nobody left to tell). */
void dmx_epi_free(dmc_epi *e) {
    if (!e) return;
    if (e->have_op) (void)cublasLtMatmulDescDestroy(e->op);
    if (e->have_l1) (void)cublasLtMatrixLayoutDestroy(e->l1);
    if (e->have_l2) (void)cublasLtMatrixLayoutDestroy(e->l2);
    if (e->have_ld) (void)cublasLtMatrixLayoutDestroy(e->ld);
    free(e);
}
