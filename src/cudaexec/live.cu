/* live.cu: the CUDA executor on its live rows (plan/live.h; the backend's set_rows): an
 * unpadded layer's tokens, the MLM head's scored positions. Per step, the host cuts each
 * following contraction's m, n or k and each embedding gradient's rows; the row programs
 * (interpreted and generated) read the step's row count from the device (one long long
 * that set_rows copies there on the main stream once the last step's side-stream groups
 * are joined, so every group of that step has run on its own count), and
 * an unpadded layer's rows draw their dropout words at their padded positions through a
 * key map beside it, as the CPU. The layer's outputs are zeroed past the live rows after
 * each group that writes them. A contraction that follows the rows takes no bias epilogue
 * (its cuBLASLt layouts are made for one size). */
#include <stdlib.h>
#include <string.h>

#include "cudaexec/exec.h" /* and plan/live.h */

/* Group gi's contraction operands in op order, for dm_live_group_of (NULL where not in
 * memory, or not a contraction). */
static void group_operands(const dm_cuda_exec *ex, int gi, float *p[3]) {
    const dm_op *op = dmx_op_at(ex->plan, &ex->plan->groups[gi], 0);
    for (int s = 0; s < 3 && op->kind == DM_OP_CONTRACT; s++) {
        int dt;
        p[s] = (float *)dmx_arena_ptr(ex, s < 2 ? op->in[s] : op->out[0], &dt);
    }
}

dm_status dmx_init_live(dm_cuda_exec *ex) {
    const dm_plan *plan = ex->plan;
    const dm_graph *g = plan->g;
    dm_live lv;
    DM_TRY(dm_live_init(&lv, plan));
    if (!lv.cap) return DM_OK;
    dm_status s = DM_OK;
    if (!(ex->liveg = (dm_live_group *)calloc((size_t)ex->ngroups, sizeof(dm_live_group))))
        s = dm_fail(DM_ERR_OOM, "out of memory preparing the live rows");
    for (int gi = 0; gi < ex->ngroups && s == DM_OK; gi++) {
        float *p[3] = {NULL, NULL, NULL};
        group_operands(ex, gi, p);
        s = dm_live_group_of(&lv, gi, p[0], p[1], p[2], &ex->liveg[gi]);
    }
    const int attn = lv.attn;
    const int64_t cap = lv.cap;
    dm_live_free(&lv);
    if (s == DM_ERR_UNSUPPORTED && !attn) { /* optional here: every step runs whole, set_rows says why */
        snprintf(ex->live_why, sizeof ex->live_why, "%s", dm_last_error());
        free(ex->liveg);
        ex->liveg = NULL;
        return DM_OK;
    }
    if (s != DM_OK) return attn ? dm_fail_context(s, "unpadded layer: ") : s;
    if (cap > INT32_MAX) return dm_fail(DM_ERR_UNSUPPORTED, "%lld live rows: more than the CUDA backend's", (long long)cap);
    /* the count (a long long, 256 bytes kept for it), then the keys; and the host's copy */
    const size_t bytes = 256 + sizeof(int) * (size_t)cap;
    DM_TRY(dmx_dev_alloc(ex, (void **)&ex->livebuf, bytes, "the live rows"));
    if (!(ex->livehost = (char *)malloc(bytes))) return dm_fail(DM_ERR_OOM, "out of memory preparing the live rows");
    ex->live_cap = ex->tokens = cap;
    const char *lr = getenv("DMOVE_CUDA_LIVE_ROUND");
    char *end = NULL;
    const long q = lr && *lr ? strtol(lr, &end, 10) : 64;
    if (lr && *lr && (*end || q < 1 || q > 65536))
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_LIVE_ROUND='%s': a whole number of rows from 1 (exact) to 65536", lr);
    ex->live_round = q;
    const char *rk = getenv("DMOVE_CUDA_LIVE_ROUND_K");
    if (rk && *rk && strcmp(rk, "0") && strcmp(rk, "1"))
        return dm_fail(DM_ERR_INVALID_ARG, "DMOVE_CUDA_LIVE_ROUND_K='%s': 1 (round k too, the default) or 0 (k exact)",
                       rk);
    ex->live_round_k = !(rk && !strcmp(rk, "0"));
    ex->live_bj = g->live[1] != 0;
    ex->live_attn = attn;
    *(long long *)ex->livehost = cap;
    int *key = (int *)(ex->livehost + 256);
    for (int64_t r = 0; r < cap; r++) key[r] = (int)r;
    DM_TRY(dmx_dev_copy(ex, ex->livebuf, ex->livehost, bytes, cudaMemcpyHostToDevice));
    for (int gi = 0; gi < ex->ngroups; gi++) { /* the row programs read the count (and keys) */
        const dmc_group *eg = &ex->groups[gi];
        const dm_live_group *lg = &ex->liveg[gi];
        for (int k = 0; k < eg->nsteps && lg->rpt; k++) {
            const dmc_step *st = &eg->steps[k];
            if (!dmx_step_rows(st)) continue;
            dmc_rowprog *hp = &ex->hprogs[st->prog];
            hp->live = (const long long *)ex->livebuf;
            hp->live_rpt = lg->rpt;
            hp->rowkey = ex->live_bj ? (const int *)((char *)ex->livebuf + 256) : NULL;
        }
    }
    return DM_OK;
}

int dmx_live_scaled(const dm_cuda_exec *ex, int gi) {
    const dm_live_group *lg = ex->liveg ? &ex->liveg[gi] : NULL;
    return lg && (lg->rpt || lg->tok_mnk[0] || lg->tok_mnk[1] || lg->tok_mnk[2]);
}

/* Every contraction and embedding gradient over the live rows cut to ex->tokens. A
 * contraction whose m or n counts them runs on them rounded up to a multiple of
 * live_round (at most the plan's rows): a step's shapes then come from a few, where cuBLAS
 * chooses a kernel once for each (on an H200 a new token count every step cost several
 * milliseconds a step: bench/results/gpu-h200-2026-11-28.txt). The rows past the tokens so
 * computed are rows no later step reads (a contraction's k, a column sum, a row program all
 * take the exact count), and the layer's outputs there are zeroed after the group as
 * before. Rows past the tokens hold anything (NaN included) and a sum over them would count
 * it, so a lone contraction with both operands' rows over k (op(A) = A^T, op(B) = B, the
 * weight gradients) runs on the rounded k with its operands' rows past the tokens zeroed
 * first (dmx_run_gemm, step ktail; live_round_k, the default): every weight gradient's shape
 * then comes from a few too. DMOVE_CUDA_LIVE_ROUND_K=0 keeps k exact instead (on the H200,
 * b=8 j=512, lengths uniform 128-384: 1.23 ms a step against 1.03 rounded; the same at fixed
 * lengths, 0.85 and 0.84: bench/results/gpu-h200-2026-11-28b.txt). */
static void cut_steps(dm_cuda_exec *ex) {
    const int64_t q = ex->live_round > 1 ? ex->live_round : 1;
    int64_t rounded = (ex->tokens + q - 1) / q * q;
    if (rounded > ex->live_cap) rounded = ex->live_cap;
    for (int gi = 0; gi < ex->ngroups; gi++) {
        const dm_live_group *lg = &ex->liveg[gi];
        dmc_group *eg = &ex->groups[gi];
        for (int k = 0; k < eg->nsteps; k++) {
            dmc_step *st = &eg->steps[k];
            if (st->scatter && lg->rpt) st->sc.rows = ex->tokens * lg->rpt;
            if (st->xent && lg->rpt) st->xe.m_run = ex->tokens * lg->rpt;
            if (!st->gemm) continue;
            int *mnk[3] = {&st->gm.m, &st->gm.n, &st->gm.k};
            for (int d = 0; d < 3; d++)
                if (lg->tok_mnk[d]) *mnk[d] = (int)(lg->tok_mnk[d] * (d < 2 ? rounded : ex->tokens));
            st->ktail = 0;
            if (lg->tok_mnk[2] && ex->live_round_k && st->gm.transA && !st->gm.transB && !st->gm.nbd &&
                !st->ptrs && !eg->epi && rounded > ex->tokens) {
                st->ktail = st->gm.k;
                st->gm.k = (int)(lg->tok_mnk[2] * rounded);
            }
        }
    }
}

dm_status dm_cuda_exec_set_rows(dm_cuda_exec *ex, int64_t rows, const float *lengths) {
    if (!ex) return dm_fail(DM_ERR_INVALID_ARG, "dm_cuda_exec_set_rows: NULL executor");
    if (!ex->live_cap)
        return dm_fail(DM_ERR_UNSUPPORTED, "this plan runs whole%s%s", ex->live_why[0] ? ": " : " (no live rows)",
                       ex->live_why);
    const dm_graph *g = ex->plan->g;
    /* the side stream's groups of the last step first: they read the count and their cuts */
    DM_TRY(dmx_join_all(ex));
    int *key = (int *)(ex->livehost + 256);
    int64_t tokens;
    if (!lengths) {
        if (ex->live_attn) return dm_fail(DM_ERR_INVALID_ARG, "an unpadded layer takes its sequences' lengths");
        if (rows < 1 || rows > ex->live_cap)
            return dm_fail(DM_ERR_INVALID_ARG, "%lld live rows: from 1 to %lld", (long long)rows,
                           (long long)ex->live_cap);
        tokens = rows;
        for (int64_t r = 0; ex->live_bj && r < rows; r++) key[r] = (int)r; /* no sequences: the rows' own keys */
    } else {
        /* an unpadded layer's sequences, or live rows "bj" packed from sequences of these
         * lengths (an unpadded model's embeddings: their dropout keyed by the padded rows) */
        if (!ex->live_bj) return dm_fail(DM_ERR_INVALID_ARG, "sequence lengths are for the tokens of sequences");
        const int64_t B = g->dim[g->live[0] - 'a'], J = g->dim[g->live[1] - 'a'];
        int64_t *off = (int64_t *)malloc(sizeof(int64_t) * (size_t)(B + 1));
        if (!off) return dm_fail(DM_ERR_OOM, "out of memory for the sequence offsets");
        dm_status s = dm_live_offsets(B, J, lengths, off);
        if (s == DM_OK && off[B] == 0) s = dm_fail(DM_ERR_INVALID_ARG, "seq_lengths are all 0: a step needs at least one token");
        tokens = s == DM_OK ? off[B] : 0;
        for (int64_t q = 0; s == DM_OK && q < B; q++)
            for (int64_t t = off[q]; t < off[q + 1]; t++) key[t] = (int)(q * J + (t - off[q]));
        free(off);
        DM_TRY(s);
    }
    *(long long *)ex->livehost = tokens;
    const size_t bytes = 256 + sizeof(int) * (size_t)tokens;
    if (dmx_emulated(ex)) memcpy(ex->livebuf, ex->livehost, bytes);
    else DMC_CUDA(cudaMemcpyAsync(ex->livebuf, ex->livehost, bytes, cudaMemcpyHostToDevice, ex->stream));
    ex->tokens = tokens;
    cut_steps(ex);
    return DM_OK;
}

dm_status dmx_zero_tail(const dm_cuda_exec *ex, int gi, cudaStream_t stream) {
    const dm_live_group *lg = ex->liveg ? &ex->liveg[gi] : NULL;
    for (int z = 0; lg && z < lg->nout && ex->tokens < ex->live_cap; z++) {
        int dt;
        char *p = (char *)dmx_arena_ptr(ex, lg->out[z], &dt);
        const size_t es = dt == DMC_F32 ? 4 : 2, at = (size_t)(ex->tokens * lg->ld[z]) * es,
                     n = (size_t)((ex->live_cap - ex->tokens) * lg->ld[z]) * es;
        if (dmx_emulated(ex)) memset(p + at, 0, n);
        else DMC_CUDA(cudaMemsetAsync(p + at, 0, n, stream));
    }
    return DM_OK;
}
