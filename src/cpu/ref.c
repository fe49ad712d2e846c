/* ref.c: naive references of the element-wise and normalization kernels, over whole
 * tensors in double, written straight from the definitions (no fusion, no
 * vectorization tricks), for the kernel tests. Operands follow the same conventions as
 * the row kernels (graph/ops.h: dm_arg_in / dm_arg_out). And the contractions', from the
 * einsum by loops over every letter. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "cpu/kernels.h"

/* Written with erfc and the logistic function, so the tails do not cancel (1 + erf(x) and
 * 1 + tanh(x) lose every digit for x << 0 even in double). */
static double act_ref(double x, dm_act a) {
    if (a == DM_ACT_RELU) return x > 0 ? x : 0;
    if (a == DM_ACT_TANH) return tanh(x);
    if (a == DM_ACT_GELU_TANH) /* x/2 (1 + tanh(s)) = x / (1 + exp(-2s)) */
        return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * erfc(-x / sqrt(2.0));
}

static double act_grad_ref(double x, dm_act a) {
    if (a == DM_ACT_RELU) return x > 0 ? 1 : 0;
    if (a == DM_ACT_TANH) return 1 / (cosh(x) * cosh(x));
    if (a == DM_ACT_GELU_TANH) { /* sg + x * 2 sg (1 - sg) * ds/dx, sg = 1 / (1 + exp(-2s)) */
        double c = sqrt(2 / M_PI), e = exp(-2 * c * (x + 0.044715 * x * x * x)), sg = 1 / (1 + e);
        return sg + 2 * x * e * sg * sg * c * (1 + 3 * 0.044715 * x * x);
    }
    return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

/* The whole model's kinds: gather, its scatter-add, cross-entropy and its backward. */
static void ref_model_op(const dm_op *op, const float *const *in, float *const *out) {
    const int64_t R = op->rows, C = op->cols;
    const float *a = in[0], *b = in[1];
    switch (op->kind) {
    case DM_OP_EMBED: { /* in: table (N, C), idx (R); a row outside the table: zeros */
        for (int64_t r = 0; r < R; r++) {
            int64_t n = dm_index_row(b[r], op->nindex);
            for (int64_t c = 0; c < C; c++) out[0][r * C + c] = n >= 0 ? a[n * C + c] : 0.0f;
        }
        break;
    }
    case DM_OP_EMBED_BWD: { /* in: dy (R, C), idx (R); out: dtable (N, C), every row */
        double *acc = calloc((size_t)(op->nindex * C > 0 ? op->nindex * C : 1), sizeof(double));
        if (!acc) return;
        for (int64_t r = 0; r < R; r++) {
            int64_t n = dm_index_row(b[r], op->nindex);
            if (n >= 0)
                for (int64_t c = 0; c < C; c++) acc[n * C + c] += a[r * C + c];
        }
        for (int64_t e = 0; e < op->nindex * C; e++) out[0][e] = (float)acc[e];
        free(acc);
        break;
    }
    case DM_OP_XENT: /* in: logits, labels; out: loss, lse */
        for (int64_t r = 0; r < R; r++) {
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < C; c++) m = fmax(m, a[r * C + c]);
            for (int64_t c = 0; c < C; c++) s += exp(a[r * C + c] - m);
            double lse = m + log(s);
            int64_t l = dm_index_row(b[r], C);
            out[0][r] = l >= 0 ? (float)(lse - a[r * C + l]) : 0.0f;
            out[1][r] = (float)lse;
        }
        break;
    case DM_OP_XENT_BWD: /* in: logits, lse, labels, dloss */
        for (int64_t r = 0; r < R; r++) {
            int64_t l = dm_index_row(in[2][r], C);
            for (int64_t c = 0; c < C; c++)
                out[0][r * C + c] = l < 0 ? 0.0f
                                          : (float)(in[3][r] * (exp((double)a[r * C + c] - in[1][r]) - (c == l)));
        }
        break;
    default:
        break;
    }
}

/* The logits of row r of LINEAR_XENT's in: t (m, e), W (v, e), bias (v), in double. */
static void ref_logits(const float *const *in, int64_t r, int64_t e, int64_t v, double *x) {
    for (int64_t c = 0; c < v; c++) {
        double s = in[2][c];
        for (int64_t k = 0; k < e; k++) s += (double)in[0][r * e + k] * in[1][c * e + k];
        x[c] = s;
    }
}

/* ATTN (out: ctx, probs) and its backward (in also probs, dctx; out: dQ, dK, dV) over
 * sequences of B lengths packed from row 0, Q, K, V and the others dense (b, j, h, p),
 * heads H = rows / (B J), head size P = nindex: per sequence and head, from the
 * definitions in double (ops.def). Rows past the tokens, and probabilities outside each
 * sequence's L x L block, are left as they are. keymask: every sequence J long, in[3] the
 * mask (B, J) added as MASK_ADD does, in fp32 to the score rounded to fp32. */
static void ref_attn(const dm_op *op, uint64_t seed, int64_t B, const float *const *in, float *const *out) {
    const int64_t J = op->cols, H = op->rows / (B * J), P = op->nindex, W = H * P;
    const int bwd = op->kind == DM_OP_ATTN_BWD;
    const uint32_t thr = dm_dropout_threshold(op->p);
    const double keep = op->p > 0 ? 1.0 / (1.0 - op->p) : 1.0;
    double *pr = malloc(sizeof(double) * (size_t)(J * J)), *dr = malloc(sizeof(double) * (size_t)(J * J));
    double *ds = malloc(sizeof(double) * (size_t)(J * J));
    if (!pr || !dr || !ds) goto done;
    for (int64_t s = 0, o = 0; s < B; o += op->keymask ? J : (int64_t)in[3][s], s++) {
        const int64_t L = op->keymask ? J : (int64_t)in[3][s];
        const float *km = op->keymask ? in[3] + s * J : NULL;
        for (int64_t h = 0; h < H; h++) {
            const float *q = in[0] + o * W + h * P, *k = in[1] + o * W + h * P, *v = in[2] + o * W + h * P;
            for (int64_t j = 0; j < L; j++) { /* probabilities (bwd: the kept ones), dropped */
                const int64_t n = op->causal ? j + 1 : L;
                double m = -INFINITY, sum = 0;
                for (int64_t c = 0; c < L; c++) {
                    double x = 0;
                    for (int64_t e = 0; e < P; e++) x += (double)q[j * W + e] * k[c * W + e];
                    pr[j * J + c] = c >= n ? -INFINITY
                                    : km ? (double)((float)(x * op->alpha) + (1.0f - km[c]) * -FLT_MAX)
                                         : x * op->alpha;
                    m = fmax(m, pr[j * J + c]);
                }
                for (int64_t c = 0; c < L; c++) sum += (pr[j * J + c] = exp(pr[j * J + c] - m));
                for (int64_t c = 0; c < L; c++) {
                    const int64_t e = ((s * H + h) * J + j) * J + c;
                    const uint32_t w = dm_dropout_uniform_ref(seed, (uint32_t)op->stream, (uint64_t)e);
                    pr[j * J + c] = bwd ? in[4][e] : pr[j * J + c] / sum;
                    dr[j * J + c] = op->p > 0 && w < thr ? 0.0 : pr[j * J + c] * keep;
                    if (!bwd) out[1][e] = (float)pr[j * J + c];
                }
            }
            for (int64_t j = 0; j < L && !bwd; j++) /* ctx = dropped V */
                for (int64_t e = 0; e < P; e++) {
                    double x = 0;
                    for (int64_t c = 0; c < L; c++) x += dr[j * J + c] * v[c * W + e];
                    out[0][(o + j) * W + h * P + e] = (float)x;
                }
            if (!bwd) continue;
            const float *dc = in[5] + o * W + h * P;
            for (int64_t j = 0; j < L; j++) { /* dS = P (dP - rowsum(dP P)), dP through the dropout */
                double dot = 0;
                for (int64_t c = 0; c < L; c++) {
                    double x = 0;
                    for (int64_t e = 0; e < P; e++) x += (double)dc[j * W + e] * v[c * W + e];
                    ds[j * J + c] = x;
                }
                for (int64_t c = 0; c < L; c++) {
                    const int64_t e = ((s * H + h) * J + j) * J + c;
                    const uint32_t w = dm_dropout_uniform_ref(seed, (uint32_t)op->stream, (uint64_t)e);
                    ds[j * J + c] = op->p > 0 && w < thr ? 0.0 : ds[j * J + c] * keep;
                    dot += ds[j * J + c] * pr[j * J + c];
                }
                for (int64_t c = 0; c < L; c++) ds[j * J + c] = pr[j * J + c] * (ds[j * J + c] - dot);
            }
            for (int64_t j = 0; j < L; j++)
                for (int64_t e = 0; e < P; e++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int64_t c = 0; c < L; c++) {
                        dq += ds[j * J + c] * k[c * W + e];
                        dk += ds[c * J + j] * q[c * W + e];
                        dv += dr[c * J + j] * dc[c * W + e];
                    }
                    out[0][(o + j) * W + h * P + e] = (float)(dq * op->alpha);
                    out[1][(o + j) * W + h * P + e] = (float)(dk * op->alpha);
                    out[2][(o + j) * W + h * P + e] = (float)dv;
                }
        }
    }
done:
    free(pr);
    free(dr);
    free(ds);
}

/* LINEAR_XENT (out: loss, lse, pred) and its backward (in also lse, dloss; out: dt, dW,
 * dbias): the decoder's logits, then XENT and XENT_BWD as above, and the two products. */
static void ref_linear_xent(const dm_op *op, const float *const *in, float *const *out) {
    const int64_t R = op->rows, V = op->cols, E = op->nindex;
    const int bwd = op->kind == DM_OP_LINEAR_XENT_BWD;
    double *x = malloc(sizeof(double) * (size_t)(V > 0 ? V : 1));
    double *dt = bwd ? calloc((size_t)(R * E > 0 ? R * E : 1), sizeof(double)) : NULL;
    double *dw = bwd ? calloc((size_t)(V * E > 0 ? V * E : 1), sizeof(double)) : NULL;
    double *db = bwd ? calloc((size_t)(V > 0 ? V : 1), sizeof(double)) : NULL;
    if (!x || (bwd && (!dt || !dw || !db))) goto done;
    for (int64_t r = 0; r < R; r++) {
        ref_logits(in, r, E, V, x);
        const int64_t l = dm_index_row(in[3][r], V);
        if (!bwd) {
            double m = -INFINITY, s = 0;
            int64_t arg = 0;
            for (int64_t c = 0; c < V; c++)
                if (x[c] > m) m = x[c], arg = c; /* ties: the lowest id */
            for (int64_t c = 0; c < V; c++) s += exp(x[c] - m);
            out[0][r] = l >= 0 ? (float)(m + log(s) - x[l]) : 0.0f;
            out[1][r] = (float)(m + log(s));
            out[2][r] = (float)arg;
            continue;
        }
        if (l < 0) continue;
        for (int64_t c = 0; c < V; c++) {
            const double d = in[5][r] * (exp(x[c] - in[4][r]) - (c == l));
            db[c] += d;
            for (int64_t k = 0; k < E; k++) {
                dt[r * E + k] += d * in[1][c * E + k];
                dw[c * E + k] += d * in[0][r * E + k];
            }
        }
    }
    for (int64_t q = 0; bwd && q < R * E; q++) out[0][q] = (float)dt[q];
    for (int64_t q = 0; bwd && q < V * E; q++) out[1][q] = (float)dw[q];
    for (int64_t c = 0; bwd && c < V; c++) out[2][c] = (float)db[c];
done:
    free(x);
    free(dt);
    free(dw);
    free(db);
}

void dm_ref_op(const dm_op *op, uint64_t seed, int64_t mask_groups, const float *const *in,
               float *const *out) {
    int64_t R = op->rows, C = op->cols;
    const float *a = in[0], *b = op->nin > 1 ? in[1] : NULL;
    switch (op->kind) {
    case DM_OP_BIAS_ADD:
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) out[0][r * C + c] = (float)((double)a[r * C + c] + b[c]);
        break;
    case DM_OP_ADD:
        for (int64_t e = 0; e < R * C; e++) out[0][e] = (float)((double)a[e] + b[e]);
        break;
    case DM_OP_MASK_ADD: {
        /* mask (G, C): row r belongs to group r / (R / G); G = batch */
        int64_t per = R / mask_groups;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                out[0][r * C + c] = a[r * C + c] +
                                    (op->causal && c > r % C ? 1.0f : 1.0f - b[(r / per) * C + c]) * -FLT_MAX;
        break;
    }
    case DM_OP_DROPOUT:
    case DM_OP_DROPOUT_BWD: {
        uint32_t thr = dm_dropout_threshold(op->p);
        for (int64_t e = 0; e < R * C; e++) {
            const uint32_t w = dm_dropout_uniform_ref(seed, (uint32_t)op->stream, (uint64_t)e);
            out[0][e] = (op->p > 0 && w < thr) ? 0.0f : (float)(a[e] / (1.0 - op->p));
        }
        break;
    }
    case DM_OP_DROPOUT_BWD_NZ: /* in: dy, y */
        for (int64_t e = 0; e < R * C; e++)
            out[0][e] = b[e] != 0 ? (float)(a[e] / (op->p > 0 ? 1.0 - op->p : 1.0)) : 0.0f;
        break;
    case DM_OP_ACT:
        for (int64_t e = 0; e < R * C; e++) out[0][e] = (float)act_ref(a[e], op->act);
        break;
    case DM_OP_ACT_BWD:
        for (int64_t e = 0; e < R * C; e++) out[0][e] = (float)(a[e] * act_grad_ref(b[e], op->act));
        break;
    case DM_OP_ACT_DERIV: /* in: x; out: act(x), act'(x) */
        for (int64_t e = 0; e < R * C; e++) {
            out[0][e] = (float)act_ref(a[e], op->act);
            out[1][e] = (float)act_grad_ref(a[e], op->act);
        }
        break;
    case DM_OP_MUL:
        for (int64_t e = 0; e < R * C; e++) out[0][e] = (float)((double)a[e] * b[e]);
        break;
    case DM_OP_SOFTMAX:
        for (int64_t r = 0; r < R; r++) {
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < C; c++) m = fmax(m, a[r * C + c]);
            for (int64_t c = 0; c < C; c++) s += exp(a[r * C + c] - m);
            for (int64_t c = 0; c < C; c++) out[0][r * C + c] = (float)(exp(a[r * C + c] - m) / s);
        }
        break;
    case DM_OP_SOFTMAX_BWD: /* in: dy, y */
        for (int64_t r = 0; r < R; r++) {
            double s = 0;
            for (int64_t c = 0; c < C; c++) s += (double)a[r * C + c] * b[r * C + c];
            for (int64_t c = 0; c < C; c++)
                out[0][r * C + c] = (float)(b[r * C + c] * (a[r * C + c] - s));
        }
        break;
    case DM_OP_LAYERNORM: /* in: x, gamma, beta; out: y, mean, rstd */
        for (int64_t r = 0; r < R; r++) {
            double m = 0, v = 0;
            for (int64_t c = 0; c < C; c++) m += a[r * C + c];
            m /= (double)C;
            for (int64_t c = 0; c < C; c++) v += (a[r * C + c] - m) * (a[r * C + c] - m);
            double rs = 1.0 / sqrt(v / (double)C + op->eps);
            for (int64_t c = 0; c < C; c++)
                out[0][r * C + c] = (float)((a[r * C + c] - m) * rs * in[1][c] + in[2][c]);
            out[1][r] = (float)m;
            out[2][r] = (float)rs;
        }
        break;
    case DM_OP_LAYERNORM_BWD: { /* in: dy, x, mean, rstd, gamma; out: dx, dgamma, dbeta */
        double *dg = calloc((size_t)C, sizeof(double)), *db = calloc((size_t)C, sizeof(double));
        if (!dg || !db) { free(dg); free(db); return; }
        for (int64_t r = 0; r < R; r++) {
            double m = in[2][r], rs = in[3][r], sg = 0, sgx = 0;
            for (int64_t c = 0; c < C; c++) {
                double xh = (b[r * C + c] - m) * rs, gg = (double)a[r * C + c] * in[4][c];
                sg += gg;
                sgx += gg * xh;
                dg[c] += (double)a[r * C + c] * xh;
                db[c] += a[r * C + c];
            }
            for (int64_t c = 0; c < C; c++) {
                double xh = (b[r * C + c] - m) * rs;
                out[0][r * C + c] =
                    (float)(rs * ((double)a[r * C + c] * in[4][c] - sg / (double)C - xh * sgx / (double)C));
            }
        }
        for (int64_t c = 0; c < C; c++) {
            out[1][c] = (float)dg[c];
            out[2][c] = (float)db[c];
        }
        free(dg);
        free(db);
        break;
    }
    case DM_OP_COLSUM:
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t r = 0; r < R; r++) s += a[r * C + c];
            out[0][c] = (float)s;
        }
        break;
    case DM_OP_EMBED:
    case DM_OP_EMBED_BWD:
    case DM_OP_XENT:
    case DM_OP_XENT_BWD:
        ref_model_op(op, in, out);
        break;
    case DM_OP_LINEAR_XENT:
    case DM_OP_LINEAR_XENT_BWD:
        ref_linear_xent(op, in, out);
        break;
    case DM_OP_ATTN: /* mask_groups: the sequences */
    case DM_OP_ATTN_BWD:
        ref_attn(op, seed, mask_groups, in, out);
        break;
    default:
        break;
    }
}
