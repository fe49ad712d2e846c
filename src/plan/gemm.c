/* gemm.c: a contraction mapped to GEMM calls (gemm.h). An einsum "A,B->C" is classified
 * into batch letters (in A, B and C), M (A and C), N (B and C) and K (A and B). Each of M,
 * N, K must collapse to one (size, stride) per operand; M or N letters that cannot are
 * looped over like batch letters. The result is one GEMM per batch index with the
 * transposes and leading dimensions the strides imply: layouts never cost a copy. */
#include "plan/gemm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

typedef struct {
    int64_t size;
    int64_t st[3]; /* stride in A, B, C (0 where absent) */
} dim;

static int64_t stride_of(const dm_tensor *t, char c, int64_t *size) {
    for (int d = 0; d < t->ndim; d++)
        if (t->letters[d] == c) {
            if (size) *size = t->size[d];
            return t->stride[d];
        }
    return -1;
}

/* Collapse dims[0..n) (outermost first) into one; 1 on success. */
static int merge(const dim *d, int n, dim *out) {
    out->size = 1;
    out->st[0] = out->st[1] = out->st[2] = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (d[i].size == 1) continue;
        if (last >= 0)
            for (int o = 0; o < 3; o++)
                if (d[last].st[o] != d[i].st[o] * d[i].size) return 0;
        last = i;
        out->size *= d[i].size;
    }
    if (last >= 0)
        for (int o = 0; o < 3; o++) out->st[o] = d[last].st[o];
    return 1;
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

dm_status dm_gemm_map_prepare(dm_gemm_map *gm, const dm_graph *g, const dm_op *op, float *A, float *B,
                              float *C) {
    memset(gm, 0, sizeof *gm);
    const dm_tensor *t[3] = {&g->t[op->in[0]], &g->t[op->in[1]], &g->t[op->out[0]]};
    char sa[16], sb[16], sc[16];
    if (sscanf(op->spec, "%15[a-z],%15[a-z]->%15[a-z]", sa, sb, sc) != 3 ||
        strcmp(sa, t[0]->letters) || strcmp(sb, t[1]->letters) || strcmp(sc, t[2]->letters))
        return dm_fail(DM_ERR_INTERNAL, "contraction %s: spec '%s' does not match operands",
                       op->name, op->spec);
    dim bt[DM_MAX_DIMS * 3], M[DM_MAX_DIMS], N[DM_MAX_DIMS], K[DM_MAX_DIMS];
    int nb = 0, nm = 0, nn = 0, nk = 0;
    const char *order[2] = {sc, sa}; /* M, N, batch follow C's order; K follows A's */
    for (int pass = 0; pass < 2; pass++)
        for (const char *c = order[pass]; *c; c++) {
            int64_t sz = 0, s3[3];
            for (int o = 0; o < 3; o++) { int64_t z = 0; s3[o] = stride_of(t[o], *c, &z); if (s3[o] >= 0) sz = z; }
            int inA = s3[0] >= 0, inB = s3[1] >= 0, inC = s3[2] >= 0;
            dim d = {.size = sz, .st = {inA ? s3[0] : 0, inB ? s3[1] : 0, inC ? s3[2] : 0}};
            if (pass == 0) {
                if (inA && inB) bt[nb++] = d;
                else if (inA) M[nm++] = d;
                else if (inB) N[nn++] = d;
                else return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: letter %c only in the output", op->name, *c);
            } else if (!inC) {
                if (!inB) return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: letter %c summed in one operand only", op->name, *c);
                K[nk++] = d;
            }
        }
    for (const char *c = sb; *c; c++)
        if (!strchr(sa, *c) && !strchr(sc, *c))
            return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: letter %c summed in one operand only", op->name, *c);
    dim m, n, k;
    while (!merge(M, nm, &m)) { bt[nb++] = M[0]; memmove(M, M + 1, sizeof(dim) * (size_t)--nm); }
    while (!merge(N, nn, &n)) { bt[nb++] = N[0]; memmove(N, N + 1, sizeof(dim) * (size_t)--nn); }
    if (!merge(K, nk, &k))
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: the summed letters are not contiguous in this layout", op->name);
    /* C row-major needs unit stride along n; else compute C^T = B^T A^T */
    int64_t Am = m.st[0], Ak = k.st[0], Bk = k.st[1], Bn = n.st[1], Cm = m.st[2], Cn = n.st[2];
    int64_t msz = m.size, nsz = n.size;
    float *pa = A, *pb = B;
    int swap = 0;
    if (!(Cn == 1 || nsz == 1)) {
        if (!(Cm == 1 || msz == 1))
            return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: output has no unit stride", op->name);
        swap = 1;
        int64_t t1;
        t1 = Am; Am = Bn; Bn = t1;
        t1 = Ak; Ak = Bk; Bk = t1;
        t1 = Cm; Cm = Cn; Cn = t1;
        t1 = msz; msz = nsz; nsz = t1;
        pa = B;
        pb = A;
        gm->swapped = 1;
    }
    int64_t ksz = k.size;
    int64_t lda, ldb, ldc = msz == 1 ? nsz : Cm;
    if (Ak == 1 || ksz == 1) { gm->transA = 0; lda = msz == 1 ? ksz : Am; if (lda < ksz) lda = -1; }
    else if (Am == 1 || msz == 1) { gm->transA = 1; lda = Ak; if (lda < msz) lda = -1; }
    else lda = -1;
    if (Bn == 1 || nsz == 1) { gm->transB = 0; ldb = ksz == 1 ? nsz : Bk; if (ldb < nsz) ldb = -1; }
    else if (Bk == 1 || ksz == 1) { gm->transB = 1; ldb = Bn; if (ldb < ksz) ldb = -1; }
    else ldb = -1;
    if (lda < 1 || ldb < 1 || ldc < nsz)
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: operand layout needs a copy", op->name);
    if (!fits_int(msz) || !fits_int(nsz) || !fits_int(ksz) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc))
        return dm_fail(DM_ERR_UNSUPPORTED, "contraction %s: a matrix dimension exceeds BLAS int range", op->name);
    gm->A = pa;
    gm->B = pb;
    gm->C = C;
    gm->m = (int)msz;
    gm->n = (int)nsz;
    gm->k = (int)ksz;
    gm->lda = (int)lda;
    gm->ldb = (int)ldb;
    gm->ldc = (int)ldc;
    gm->alpha = op->alpha;
    gm->beta = 0.0f;
    gm->nbatch = 1;
    for (int i = 0; i < nb; i++) {
        if (bt[i].size == 1) continue;
        int d = gm->nbd++;
        gm->bsize[d] = bt[i].size;
        gm->bsA[d] = bt[i].st[swap ? 1 : 0];
        gm->bsB[d] = bt[i].st[swap ? 0 : 1];
        gm->bsC[d] = bt[i].st[2];
        gm->nbatch *= bt[i].size;
    }
    return DM_OK;
}

void dm_gemm_ref(const dm_graph *g, const dm_op *op, const float *A, const float *B, float *C) {
    const dm_tensor *t[3] = {&g->t[op->in[0]], &g->t[op->in[1]], &g->t[op->out[0]]};
    char all[3 * DM_MAX_DIMS];
    int na = 0;
    for (int o = 0; o < 3; o++)
        for (int d = 0; d < t[o]->ndim; d++)
            if (!memchr(all, t[o]->letters[d], (size_t)na)) all[na++] = t[o]->letters[d];
    int64_t sz[3 * DM_MAX_DIMS], st[3][3 * DM_MAX_DIMS], idx[3 * DM_MAX_DIMS] = {0};
    int64_t tot = 1, span = 1;
    for (int a = 0; a < na; a++) {
        sz[a] = g->dim[all[a] - 'a'];
        tot *= sz[a];
        for (int o = 0; o < 3; o++) {
            int64_t s = stride_of(t[o], all[a], NULL);
            st[o][a] = s < 0 ? 0 : s;
        }
        span += (sz[a] - 1) * st[2][a];
    }
    double *acc = calloc((size_t)span, sizeof(double));
    if (!acc) return;
    for (int64_t e = 0; e < tot; e++) {
        int64_t oa = 0, ob = 0, oc = 0;
        for (int a = 0; a < na; a++) {
            oa += idx[a] * st[0][a];
            ob += idx[a] * st[1][a];
            oc += idx[a] * st[2][a];
        }
        acc[oc] += (double)A[oa] * (double)B[ob];
        for (int a = na - 1; a >= 0; a--) {
            if (++idx[a] < sz[a]) break;
            idx[a] = 0;
        }
    }
    /* write every element of C (odometer over C's letters) */
    int64_t cidx[DM_MAX_DIMS] = {0};
    for (int64_t e = 0; e < t[2]->numel; e++) {
        int64_t oc = 0;
        for (int d = 0; d < t[2]->ndim; d++) oc += cidx[d] * t[2]->stride[d];
        C[oc] = (float)(op->alpha * acc[oc]);
        for (int d = t[2]->ndim - 1; d >= 0; d--) {
            if (++cidx[d] < t[2]->size[d]) break;
            cidx[d] = 0;
        }
    }
    free(acc);
}
