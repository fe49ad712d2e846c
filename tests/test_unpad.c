/* test_unpad.c: the unpadded layer (dm_layer_options.unpad, issue 25) against the padded
 * one. For each variant (post-LN and pre-LN, causal, dropout 0 and 0.1, the input's
 * gradient or not, fused and unfused schedules) and each set of lengths (full, mixed, an
 * empty sequence, one token), both layers get the same parameters, the padded one its
 * inputs at every position with attention_mask 1 on the first lengths[s] positions and
 * grad_output 0 on the others, the unpadded one the real tokens packed from row 0 and the
 * rows after them NaN. Then:
 *  - output and grad_hidden_states on the real tokens, and every parameter gradient, agree
 *    (rel.err < 2e-5; dropout too: its masks are keyed by the padded positions);
 *  - the outputs' rows after the real tokens are 0 (they were NaN before the step) and
 *    no input row after them was read (the results are finite);
 *  - a second step with other lengths on the same layer agrees too (the lengths are read
 *    each step);
 *  - bad lengths (negative, above j, fractional, all 0) fail with DM_ERR_INVALID_ARG, and
 *    unpad with recompute or with a plan file is refused;
 *  - a whole BERT (dm_model: embeddings, 2 layers, the MLM head; the classifier too) built
 *    unpadded gives the padded model's loss, hidden states (padding rows 0) and every
 *    parameter gradient, dropout 0 and 0.1 (every dropout keyed by the padded positions,
 *    the embeddings' too), over two batches of other lengths; a mask that is not 1s then
 *    0s is refused and leaves the last batch;
 *  - where the CUDA backend is built, the same on it, emulated on the host: layer variants
 *    with the interpreted and the generated row kernels (one with the generated kernels'
 *    device text lane by lane), and the model's MLM head and classifier;
 *  - and there, the flash attention kernels (flash.cu, bf16 and fp16, head widths 64 and
 *    128, causal and dropout), lane by lane, against fp32 as closely as the path they
 *    replace (flash_variant);
 *  - a padded layer's attention as one op (attention_op, ops.def's keymask: any mask,
 *    one sequence all masked) against its ops one by one: on the CPU and CUDA (emulated)
 *    in fp32 within 2e-5, on the flash kernels in 16 bits as close to fp32 as the ops
 *    (attn_op_variant, attn_op_flash); a causal one refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmove.h"
#include "layerutil.h"
#include "testutil.h"
#include "cpu/backend.h"
#include "layer/backends.h"
#include "layer/layer_internal.h"
#include "train/model.h"

static float *T_(dm_layer *L, const char *name, int64_t *n) {
    float *p = NULL;
    int nd = 0;
    int64_t sh[4] = {0};
    if (dm_layer_tensor(L, name, &p, &nd, sh) != DM_OK) return NULL;
    *n = 1;
    for (int d = 0; d < nd; d++) *n *= sh[d];
    return p;
}

static double param_errs(dm_layer *P, dm_layer *U, int narrow, double *each, double worst);

/* One step of both layers on lengths len; returns the worst relative error (each, when
 * given: the outputs' and every parameter gradient's, in that order). */
static double step_pair(dm_layer *P, dm_layer *U, const dm_layer_config *cfg, const int64_t *len, int grads,
                        uint64_t seed, int narrow, double *each) {
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden;
    int64_t n;
    float *px = T_(P, "hidden_states", &n), *pm = T_(P, "attention_mask", &n), *pdy = grads ? T_(P, "grad_output", &n) : NULL;
    float *ux = T_(U, "hidden_states", &n), *ul = T_(U, "seq_lengths", &n), *udy = grads ? T_(U, "grad_output", &n) : NULL;
    CHECK(px && pm && ux && ul && (!grads || (pdy && udy)));
    if (!px || !pm || !ux || !ul || (grads && (!pdy || !udy))) return INFINITY;
    int64_t tok = 0;
    for (int64_t r = 0; r < B * J * I; r++) {
        ux[r] = NAN;
        if (udy) udy[r] = NAN;
    }
    for (int64_t s = 0; s < B; s++) {
        ul[s] = (float)len[s];
        for (int64_t j = 0; j < J; j++) {
            const int real = j < len[s];
            pm[s * J + j] = (float)real;
            for (int64_t c = 0; c < I; c++) {
                const int64_t e = (s * J + j) * I + c;
                px[e] = (float)sin(0.37 * (double)e + (double)seed);
                if (pdy) pdy[e] = real ? (float)cos(0.23 * (double)e + 2.0 * (double)seed) : 0.0f;
                if (real) {
                    ux[tok * I + c] = px[e];
                    if (udy) udy[tok * I + c] = pdy[e];
                }
            }
            tok += real;
        }
    }
    const char *outs[2] = {"output", "grad_hidden_states"}; /* poisoned: the rows after the tokens become 0 */
    for (int k = 0; k < 2; k++) {
        float *o = T_(U, outs[k], &n);
        for (int64_t e = 0; o && e < n; e++) o[e] = NAN;
    }
    CHECK_OK(dm_layer_set_seed(P, seed));
    CHECK_OK(dm_layer_set_seed(U, seed));
    CHECK_OK(dm_layer_to_device(P)); /* (the CUDA backend's; nothing to move on the CPU) */
    CHECK_OK(dm_layer_to_device(U));
    CHECK_OK(dm_layer_forward(P));
    CHECK_OK(dm_layer_forward(U));
    if (grads) {
        CHECK_OK(dm_layer_backward(P));
        CHECK_OK(dm_layer_backward(U));
    }
    CHECK_OK(dm_layer_to_host(P));
    CHECK_OK(dm_layer_to_host(U));
    double worst = 0;
    for (int k = 0; k < 2; k++) {
        float *pa = T_(P, outs[k], &n), *ua = T_(U, outs[k], &n);
        if (!pa || !ua) continue; /* no input gradient */
        float *packed = malloc(sizeof(float) * (size_t)(tok ? tok * I : 1));
        int64_t t = 0, finite = 1, zeroed = 1;
        for (int64_t s = 0; s < B; s++)
            for (int64_t j = 0; j < len[s]; j++, t++) memcpy(packed + t * I, pa + (s * J + j) * I, sizeof(float) * (size_t)I);
        for (int64_t e = 0; e < tok * I; e++) finite &= isfinite(ua[e]) != 0;
        for (int64_t e = tok * I; e < B * J * I; e++) zeroed &= ua[e] == 0.0f;
        CHECK(finite);
        CHECK(zeroed);
        if (each) each[k] = rel_err(ua, packed, (size_t)(tok * I));
        worst = worst_of(worst, rel_err(ua, packed, (size_t)(tok * I)));
        free(packed);
    }
    return grads ? param_errs(P, U, narrow, each, worst) : worst;
}

/* The worst of `worst` and U's parameter gradients' errors against P's (each[2 + q], when
 * given). */
static double param_errs(dm_layer *P, dm_layer *U, int narrow, double *each, double worst) {
    int64_t n;
    for (int q = 0; q < dm_layer_num_params(P); q++) {
        char name[128];
        snprintf(name, sizeof name, "%s.grad", dm_layer_param_name(P, q));
        float *pa = T_(P, name, &n), *ua = T_(U, name, &n);
        CHECK(pa && ua);
        if (!pa || !ua) continue;
        double e = rel_err(ua, pa, (size_t)n);
        if (strstr(name, "key.bias")) { /* zero in exact arithmetic: rounding noise, relative to 1e-3
                                          * (narrow, 16-bit storage: to the query bias's gradient) */
            double d = 0, qn = 0;
            for (int64_t i = 0; i < n; i++) d += ((double)ua[i] - pa[i]) * ((double)ua[i] - pa[i]);
            float *qb = narrow ? T_(P, "attention.self.query.bias.grad", &n) : NULL;
            for (int64_t i = 0; qb && i < n; i++) qn += (double)qb[i] * qb[i];
            e = sqrt(d) / (narrow ? sqrt(qn) : 1e-3);
        }
        if (each) each[2 + q] = e;
        worst = worst_of(worst, e);
    }
    return worst;
}

/* dev: the backend both layers run on (CUDA: emulated without a GPU), rows its row kernels */
static void variant(int pre, int causal, double p, int input_grad, dm_schedule sched, dm_device_kind dev, dm_rows rows) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 4;
    cfg.seq = 19;
    cfg.hidden = 48;
    cfg.heads = 3;
    cfg.ffn = 80;
    cfg.dropout = p;
    cfg.norm = pre ? DM_NORM_PRE : DM_NORM_POST;
    cfg.causal = causal;
    dm_layer_options po = {.device = dev, .rows = rows, .schedule = sched, .threads = 2, .no_input_grad = !input_grad},
                     uo = po;
    uo.unpad = 1;
    dm_layer *P = NULL, *U = NULL;
    CHECK_OK(dm_layer_new(&P, &cfg, &po));
    CHECK_OK(dm_layer_new(&U, &cfg, &uo));
    if (!P || !U) {
        dm_layer_free(P);
        dm_layer_free(U);
        return;
    }
    CHECK_OK(dm_layer_init_params(P, 7));
    CHECK_OK(dm_layer_init_params(U, 7));
    for (int q = 0; q < dm_layer_num_params(P); q++) { /* non-trivial biases and LayerNorm parameters */
        int64_t n;
        float *a = T_(P, dm_layer_param_name(P, q), &n), *b = T_(U, dm_layer_param_name(U, q), &n);
        for (int64_t i = 0; a && b && i < n; i++) {
            if (n == cfg.hidden || n == cfg.ffn) a[i] += 0.1f * (float)cos(1.3 * (double)i + q);
            b[i] = a[i];
        }
    }
    const int64_t lens[5][4] = {{19, 19, 19, 19}, {19, 5, 11, 1}, {0, 7, 19, 3}, {1, 0, 0, 0}, {12, 19, 2, 17}};
    for (int k = 0; k < 5; k++) {
        double e = step_pair(P, U, &cfg, lens[k], 1, 100 + (uint64_t)k, 0, NULL);
        printf("  %s%s%s%s p=%.1f%s %s lengths %lld %lld %lld %lld: worst rel.err %.2e\n",
               dev == DM_DEVICE_CUDA ? "cuda (emulated) rows " : "", dev == DM_DEVICE_CUDA ? dm_rows_name(rows) : "",
               pre ? " pre-LN" : " post-LN", causal ? " causal" : "", p, input_grad ? "" : " no-input-grad",
               sched == DM_SCHED_FUSED ? "fused" : "unfused", (long long)lens[k][0], (long long)lens[k][1],
               (long long)lens[k][2], (long long)lens[k][3], e);
        CHECK(e < 2e-5);
    }
    dm_layer_free(P);
    dm_layer_free(U);
}

/* where the CUDA layers run: the host's emulation (lane by lane for the flash kernels) or
 * a GPU (DMOVE_CUDA_EMULATE=0) */
static const char *flash_where(void) {
    const char *e = getenv("DMOVE_CUDA_EMULATE");
    return e && strcmp(e, "0") ? "emulated, flash lane by lane" : "on the GPU";
}

/* The flash kernels (flash.cu: CUDA, bf16 or fp16, head widths 64 and 128), emulated
 * lane by lane: the unpadded layer on them (forward and backward) and on the path they
 * replace (DMOVE_CUDA_FLASH=0: cuBLAS over padded copies, scores stored in the storage
 * type), both against the same layer in fp32 (padded), sequences across two 64-token
 * tiles, a ragged last one, one token and none. In 16 bits the layer's gradients are far
 * from fp32 on either path (up to 0.7 relative on these small sizes): the outputs and
 * every gradient on the flash kernels must be as close to fp32 as the other path's
 * (within 1.5x + 5e-3), tensor by tensor. */
static void flash_variant(int P, int causal, double p, dm_dtype dt, int64_t J) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 3;
    cfg.seq = J;
    cfg.hidden = 2 * P;
    cfg.heads = 2;
    cfg.ffn = 64;
    cfg.dropout = p;
    cfg.causal = causal;
    dm_layer_options ro = {.device = DM_DEVICE_CUDA, .rows = DM_ROWS_INTERP, .schedule = DM_SCHED_FUSED,
                           .threads = 2},
                     uo = ro;
    uo.unpad = 1;
    uo.dtype = dt;
    dm_layer *L[3] = {NULL, NULL, NULL}; /* fp32 padded; flash; not */
    CHECK_OK(dm_layer_new(&L[0], &cfg, &ro));
    CHECK_OK(dm_layer_new(&L[1], &cfg, &uo));
    setenv("DMOVE_CUDA_FLASH", "0", 1);
    CHECK_OK(dm_layer_new(&L[2], &cfg, &uo));
    unsetenv("DMOVE_CUDA_FLASH");
    if (L[0] && L[1] && L[2]) {
        CHECK(dm_layer_note_value(L[1], "attention_flash", 0) == 2); /* ATTN and ATTN_BWD */
        CHECK(!dm_layer_note_text(L[1], "flash_unavailable")[0]);
        CHECK(dm_layer_note_value(L[2], "attention_flash", -1) == 0);
        CHECK(strstr(dm_layer_note_text(L[2], "flash_unavailable"), "DMOVE_CUDA_FLASH=0") != NULL);
        for (int k = 0; k < 3; k++) CHECK_OK(dm_layer_init_params(L[k], 11));
        /* past 128 (DMOVE_CUDA_FLASH_MT=2's block of queries) at j > 128 */
        const int64_t lens[3][3] = {{J < 70 ? J : 70, J < 70 ? J : 70, J}, {J < 70 ? J : 70, 1, 37},
                                    {0, 64, J > 128 ? J - 5 : 65}};
        for (int k = 0; k < 3; k++) {
            double tf[64] = {0}, to[64] = {0};
            const int nt = 2 + dm_layer_num_params(L[0]);
            CHECK(nt <= 64);
            const double ef = step_pair(L[0], L[1], &cfg, lens[k], 1, 200 + (uint64_t)k, 1, tf),
                         eo = step_pair(L[0], L[2], &cfg, lens[k], 1, 200 + (uint64_t)k, 1, to);
            int worse = 0; /* tensor by tensor */
            for (int q = 0; q < nt && q < 64; q++) worse += !(tf[q] <= 1.5 * to[q] + 5e-3);
            CHECK(worse == 0);
            printf("  cuda (%s%s) %s p=%d j=%lld%s dropout %.1f lengths %lld %lld %lld: worst "
                   "rel.err against fp32 %.2e (without the flash kernels %.2e), tensors further: %d\n",
                   flash_where(), getenv("DMOVE_CUDA_FLASH_MT") ? ", 32 queries a warp" : "", dm_dtype_name(dt), P,
                   (long long)J, causal ? " causal" : "", p, (long long)lens[k][0],
                   (long long)lens[k][1],
                   (long long)lens[k][2], ef, eo, worse);
        }
    }
    for (int k = 0; k < 3; k++) dm_layer_free(L[k]);
}

/* Inputs for a padded layer: hidden states and grad_output from seed, attention mask
 * kind mk over the b sequences: 0 every key; 1 sequence s: s % 4 == 0 whole, 1 its first
 * 5 keys, 2 every key but those at c % 3 == 1 (not 1s then 0s), 3 none (every key masked:
 * the queries spread evenly over all j keys, as Hugging Face's). */
static void padded_inputs(dm_layer *L, const dm_layer_config *cfg, int mk, uint64_t seed) {
    int64_t n;
    float *x = T_(L, "hidden_states", &n), *m = T_(L, "attention_mask", &n), *dy = T_(L, "grad_output", &n);
    CHECK(x && m && dy);
    if (!x || !m || !dy) return;
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden;
    for (int64_t e = 0; e < B * J * I; e++) {
        x[e] = (float)sin(0.37 * (double)e + (double)seed);
        dy[e] = (float)cos(0.23 * (double)e + 2.0 * (double)seed);
    }
    for (int64_t s = 0; s < B; s++)
        for (int64_t c = 0; c < J; c++) {
            const int k = mk ? (int)(s % 4) : 0;
            m[s * J + c] = (float)(k == 0 || (k == 1 && c < 5) || (k == 2 && c % 3 != 1));
        }
    CHECK_OK(dm_layer_set_seed(L, seed));
    CHECK_OK(dm_layer_to_device(L));
}

/* L[1..n-1] against L[0] after a step of each on the same inputs: the worst relative error
 * of each (err[k - 1]) and tensor by tensor (each[k - 1]: output, grad_hidden_states, the
 * parameter gradients). */
static void step_same(dm_layer *const *L, int n, const dm_layer_config *cfg, int mk, uint64_t seed, int narrow,
                      double *err, double (*each)[64]) {
    for (int k = 0; k < n; k++) {
        padded_inputs(L[k], cfg, mk, seed);
        CHECK_OK(dm_layer_forward(L[k]));
        CHECK_OK(dm_layer_backward(L[k]));
        CHECK_OK(dm_layer_to_host(L[k]));
    }
    const char *outs[2] = {"output", "grad_hidden_states"};
    for (int k = 1; k < n; k++) {
        double worst = 0;
        for (int q = 0; q < 2; q++) {
            int64_t na = 0, nb = 0;
            float *a = T_(L[0], outs[q], &na), *b = T_(L[k], outs[q], &nb);
            CHECK(a && b && na == nb);
            if (!a || !b || na != nb) continue;
            each[k - 1][q] = rel_err(b, a, (size_t)na);
            worst = worst_of(worst, each[k - 1][q]);
        }
        err[k - 1] = param_errs(L[0], L[k], narrow, each[k - 1], worst);
    }
}

/* 1 if layer L's graph runs its attention as one ATTN op */
static int has_attn_op(const dm_layer *L) {
    int n = 0;
    for (int o = 0; o < L->g.nop; o++) n += L->g.op[o].kind == DM_OP_ATTN && L->g.op[o].keymask;
    return n == 1;
}

/* A padded layer's attention as one op (dm_layer_options.attention_op, ops.def's keymask)
 * against its ops one by one, fp32, on dev (CUDA: emulated, varlen.cu's cuBLAS steps):
 * every output and gradient within 2e-5, whatever the mask; the default (0) takes it on the
 * CPU in a training layer's fused schedule (not forward-only, not unfused), on CUDA not in
 * fp32. */
static void attn_op_variant(int pre, double p, dm_device_kind dev) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 4, cfg.seq = 19, cfg.hidden = 48, cfg.heads = 3, cfg.ffn = 80, cfg.dropout = p;
    cfg.norm = pre ? DM_NORM_PRE : DM_NORM_POST;
    dm_layer_options o = {.device = dev, .rows = dev == DM_DEVICE_CUDA ? DM_ROWS_INTERP : DM_ROWS_DEFAULT,
                          .threads = 2, .attention_op = -1};
    dm_layer *L[3] = {NULL, NULL, NULL}; /* ops one by one; one op; the default */
    CHECK_OK(dm_layer_new(&L[0], &cfg, &o));
    o.attention_op = 1;
    CHECK_OK(dm_layer_new(&L[1], &cfg, &o));
    o.attention_op = 0;
    CHECK_OK(dm_layer_new(&L[2], &cfg, &o));
    for (int v = 0; v < 2; v++) { /* the default's other cases: its ops */
        dm_layer_options d = o;
        if (v) d.schedule = DM_SCHED_UNFUSED;
        else d.forward_only = 1;
        dm_layer *X = NULL;
        CHECK_OK(dm_layer_new(&X, &cfg, &d));
        CHECK(X && !has_attn_op(X));
        dm_layer_free(X);
    }
    if (L[0] && L[1] && L[2]) {
        CHECK(!has_attn_op(L[0]) && has_attn_op(L[1]) && has_attn_op(L[2]) == (dev == DM_DEVICE_CPU));
        for (int k = 0; k < 2; k++) CHECK_OK(dm_layer_init_params(L[k], 5));
        for (int mk = 0; mk < 2; mk++) {
            double err[1], each[1][64];
            step_same(L, 2, &cfg, mk, 300 + (uint64_t)mk, 0, err, each);
            printf("  %s%s p=%.1f attention as one op, %s: worst rel.err %.2e\n", dm_device_kind_name(dev),
                   pre ? " pre-LN" : " post-LN", p, mk ? "masks of every kind (one all masked)" : "no mask", err[0]);
            CHECK(err[0] < 2e-5);
        }
    }
    for (int k = 0; k < 3; k++) dm_layer_free(L[k]);
    o.attention_op = 1; /* a causal layer: unpadded, or unfused */
    cfg.causal = 1;
    dm_layer *C = NULL;
    CHECK(dm_layer_new(&C, &cfg, &o) == DM_ERR_UNSUPPORTED && strstr(dm_last_error(), "causal"));
    dm_layer_free(C);
}

/* The same on the flash kernels (CUDA emulated lane by lane, 16-bit; on a GPU with
 * DMOVE_CUDA_EMULATE=0): both 16-bit layers (one op, and ops one by one) against fp32, the one op within
 * 1.5x + 5e-3 of the other's error, tensor by tensor (as flash_variant). Masks: none, and
 * padded_inputs' four kinds (1s then 0s, not, none: the row statistics the backward reads
 * must keep the all-masked rows' 1/j). */
static void attn_op_flash(int P, double p, dm_dtype dt, int64_t seq) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 4, cfg.seq = seq, cfg.hidden = 2 * P, cfg.heads = 2, cfg.ffn = 64, cfg.dropout = p;
    dm_layer_options o = {.device = DM_DEVICE_CUDA, .rows = DM_ROWS_INTERP, .threads = 2, .attention_op = -1};
    dm_layer *L[3] = {NULL, NULL, NULL}; /* fp32; 16-bit, one op (flash); 16-bit, ops one by one */
    CHECK_OK(dm_layer_new(&L[0], &cfg, &o));
    o.dtype = dt;
    CHECK_OK(dm_layer_new(&L[2], &cfg, &o));
    o.attention_op = 1;
    CHECK_OK(dm_layer_new(&L[1], &cfg, &o));
    dm_layer *D[2] = {NULL, NULL}; /* the default: its ops; with DMOVE_CUDA_ATTN_OP=1, the one op */
    o.attention_op = 0;
    CHECK_OK(dm_layer_new(&D[0], &cfg, &o));
    setenv("DMOVE_CUDA_ATTN_OP", "1", 1);
    CHECK_OK(dm_layer_new(&D[1], &cfg, &o));
    unsetenv("DMOVE_CUDA_ATTN_OP");
    CHECK(D[0] && D[1] && !has_attn_op(D[0]) && has_attn_op(D[1]));
    for (int k = 0; k < 2; k++) dm_layer_free(D[k]);
    if (L[0] && L[1] && L[2]) {
        CHECK(has_attn_op(L[1]) && dm_layer_note_value(L[1], "attention_flash", 0) == 2);
        for (int k = 0; k < 3; k++) CHECK_OK(dm_layer_init_params(L[k], 13));
        for (int mk = 0; mk < 2; mk++) {
            double err[2], each[2][64];
            const int nt = 2 + dm_layer_num_params(L[0]);
            CHECK(nt <= 64);
            step_same(L, 3, &cfg, mk, 400 + (uint64_t)mk, 1, err, each);
            int worse = 0;
            for (int q = 0; q < nt && q < 64; q++) worse += !(each[0][q] <= 1.5 * each[1][q] + 5e-3);
            CHECK(worse == 0);
            printf("  cuda (%s) %s p=%d j=%lld dropout %.1f padded, %s: worst rel.err against fp32 "
                   "%.2e (its ops one by one %.2e), tensors further: %d\n", flash_where(), dm_dtype_name(dt), P,
                   (long long)seq, p,
                   mk ? "masked" : "no mask", err[0], err[1], worse);
        }
    }
    for (int k = 0; k < 3; k++) dm_layer_free(L[k]);
}

static void refusals(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2;
    cfg.seq = 8;
    cfg.hidden = 32;
    cfg.heads = 2;
    cfg.ffn = 64;
    dm_layer_options o = {.unpad = 1, .threads = 1};
    dm_layer *U = NULL;
    CHECK_OK(dm_layer_new(&U, &cfg, &o));
    if (U) {
        CHECK_OK(dm_layer_init_params(U, 1));
        int64_t n;
        float *l = T_(U, "seq_lengths", &n);
        CHECK(l && n == 2 && l[0] == 8 && l[1] == 8); /* default: every sequence whole */
        CHECK(T_(U, "attention_mask", &n) == NULL);
        const float bad[5][2] = {{-1, 3}, {9, 1}, {2.5f, 1}, {0, 0}, {NAN, 1}};
        for (int k = 0; l && k < 5; k++) {
            l[0] = bad[k][0];
            l[1] = bad[k][1];
            CHECK(dm_layer_forward(U) == DM_ERR_INVALID_ARG);
            CHECK(strstr(dm_last_error(), "seq_lengths") != NULL);
        }
        dm_layer_free(U);
    }
    dm_layer_options r = o;
    r.recompute = 1;
    CHECK(dm_layer_new(&U, &cfg, &r) == DM_ERR_INVALID_ARG && !U);
    r = o;
    r.plan = "any.json";
    CHECK(dm_layer_new(&U, &cfg, &r) == DM_ERR_INVALID_ARG && !U);
    r = o;
    r.unpad = 2;
    CHECK(dm_layer_new(&U, &cfg, &r) == DM_ERR_INVALID_ARG && !U);
    dm_trainer *T = NULL; /* a stack of layers trains padded */
    CHECK(dm_trainer_new(&T, &cfg, 2, &o, NULL) == DM_ERR_UNSUPPORTED && !T);
}

/* The whole model, padded and unpadded, on the same batches (dropout 0). */
/* Every segment's parameters to the backend (up), or its outputs and gradients back (the
 * CUDA backend's; nothing moves on the CPU). */
static void model_sync(dm_model *m, int up) {
    dm_layer *seg[16] = {m->emb, m->head};
    int n = 2;
    for (int l = 0; l < m->c.layers && n < 16; l++) seg[n++] = m->enc[l];
    for (int q = 0; q < n; q++)
        if (seg[q]) CHECK_OK(up ? dm_layer_to_device(seg[q]) : dm_layer_to_host(seg[q]));
}

static void model_pair(dm_model_head head, dm_xent_mode xent, double dropout, dm_device_kind dev) {
    dm_model_config mc = {.layers = 2, .head = head, .pad_id = 0};
    dm_layer_config_default(&mc.layer);
    mc.layer.batch = 3, mc.layer.seq = 12, mc.layer.hidden = 32, mc.layer.heads = 2, mc.layer.ffn = 64;
    mc.layer.dropout = dropout;
    mc.sizes = (dm_bert_sizes){.vocab = 50, .positions = 16, .types = 2, .predictions = 8, .classes = 3,
                               .xent = xent};
    dm_model *M[2] = {NULL, NULL};
    for (int u = 0; u < 2; u++) {
        dm_layer_options o = {.device = dev, .threads = 2, .unpad = u};
        CHECK_OK(dm_model_new(&M[u], &mc, &o));
        if (M[u]) CHECK_OK(dm_model_init_params(M[u], 5));
        if (M[u]) model_sync(M[u], 1);
    }
    if (!M[0] || !M[1]) goto done;
    const int64_t B = 3, J = 12, n = B * J;
    const int64_t lens[2][3] = {{12, 5, 9}, {3, 12, 1}};
    int32_t ids[36], types[36], labels[36];
    float mask[36];
    for (int k = 0; k < 2; k++) {
        for (int64_t r = 0; r < n; r++) {
            const int real = r % J < lens[k][r / J];
            ids[r] = real ? 1 + (int32_t)((r * 7 + k) % 49) : 0;
            types[r] = real && r % J > 4;
            mask[r] = (float)real;
            labels[r] = head == DM_MODEL_HEAD_CLS ? (r < B ? (int32_t)((r + k) % 3) : -1)
                                                  : real && r % 3 == 1 ? (int32_t)((r * 5) % 50) : -100;
        }
        double loss[2];
        const float *hid[2];
        for (int u = 0; u < 2; u++) {
            CHECK_OK(dm_model_set_batch(M[u], ids, types, mask, labels));
            CHECK_OK(dm_model_forward(M[u], k, &loss[u], NULL));
            CHECK_OK(dm_model_hidden(M[u], &hid[u]));
            CHECK_OK(dm_model_backward(M[u]));
            model_sync(M[u], 0);
        }
        /* the steps ran on the live rows: the embeddings on the packed tokens, the MLM head on
         * the scored positions (both models) */
        const dm_cpu_exec *ee = dev == DM_DEVICE_CPU ? dm_cpu_backend_exec(M[1]->bk, M[1]->emb->st) : NULL;
        CHECK(dev != DM_DEVICE_CPU || (ee && ee->tok_cap == n && ee->tokens == lens[k][0] + lens[k][1] + lens[k][2]));
        for (int u = 0; u < 2 && head == DM_MODEL_HEAD_MLM; u++) {
            const dm_cpu_exec *he = dev == DM_DEVICE_CPU ? dm_cpu_backend_exec(M[u]->bk, M[u]->head->st) : NULL;
            CHECK(dev != DM_DEVICE_CPU || (he && he->tok_cap == 8 && he->tokens == M[u]->counted));
            CHECK(M[u]->counted > 0);
            float *lr; /* the loss rows past the scored ones: 0, not the last batch's */
            int64_t nl = 0;
            lr = T_(M[u]->head, "loss", &nl);
            CHECK(lr && nl == 8);
            for (int64_t r = M[u]->counted; lr && r < nl; r++) CHECK(lr[r] == 0.0f);
        }
        double worst = fabs(loss[1] - loss[0]) / fabs(loss[0]);
        int pad_zero = 1;
        for (int64_t r = 0; r < n; r++) {
            if (r % J < lens[k][r / J]) /* a real token: the padded model's (not its padding's) */
                worst = worst_of(worst, rel_err(hid[1] + r * 32, hid[0] + r * 32, 32));
            for (int64_t c = 0; c < 32 && r % J >= lens[k][r / J]; c++) pad_zero &= hid[1][r * 32 + c] == 0.0f;
        }
        CHECK(pad_zero);
        const char *names[] = {"bert.embeddings.word_embeddings.weight.grad",
                               "bert.embeddings.position_embeddings.weight.grad",
                               "bert.embeddings.token_type_embeddings.weight.grad",
                               "bert.embeddings.LayerNorm.weight.grad",
                               "bert.encoder.layer.0.attention.self.query.weight.grad",
                               "bert.encoder.layer.1.output.dense.bias.grad",
                               head == DM_MODEL_HEAD_CLS ? "classifier.weight.grad" : "cls.predictions.bias.grad"};
        for (int q = 0; q < 7; q++) {
            float *a, *b;
            int nd;
            int64_t sh[4];
            CHECK_OK(dm_model_tensor(M[0], names[q], &a, &nd, sh));
            CHECK_OK(dm_model_tensor(M[1], names[q], &b, &nd, sh));
            int64_t m = 1;
            for (int d = 0; d < nd; d++) m *= sh[d];
            worst = worst_of(worst, rel_err(b, a, (size_t)m));
            if (rel_err(b, a, (size_t)m) > 2e-5) printf("    %s rel.err %.2e\n", names[q], rel_err(b, a, (size_t)m));
        }
        printf("  %smodel (%s head%s, dropout %.1f) batch %d: loss %.6f / %.6f, worst rel.err %.2e\n",
               dev == DM_DEVICE_CUDA ? "cuda (emulated) " : "", head == DM_MODEL_HEAD_CLS ? "classifier" : "MLM",
               head == DM_MODEL_HEAD_MLM && xent == DM_XENT_FUSED ? ", fused cross-entropy" : "", dropout, k,
               loss[0], loss[1], worst);
        CHECK(worst < 2e-5);
    }
    double last, again;
    CHECK_OK(dm_model_forward(M[1], 1, &last, NULL));
    mask[1] = 0.0f; /* a hole: not 1s then 0s */
    CHECK(dm_model_set_batch(M[1], ids, types, mask, labels) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "--no-unpad") != NULL);
    CHECK_OK(dm_model_forward(M[1], 1, &again, NULL)); /* the refused batch left the last one */
    CHECK(again == last);
done:
    dm_model_free(M[0]);
    dm_model_free(M[1]);
}

int main(void) {
    model_pair(DM_MODEL_HEAD_MLM, DM_XENT_UNFUSED, 0.0, DM_DEVICE_CPU);
    model_pair(DM_MODEL_HEAD_MLM, DM_XENT_FUSED, 0.1, DM_DEVICE_CPU);
    model_pair(DM_MODEL_HEAD_CLS, DM_XENT_AUTO, 0.1, DM_DEVICE_CPU);
    const dm_device_kind cpu = DM_DEVICE_CPU;
    for (int pre = 0; pre < 2; pre++)
        for (int causal = 0; causal < 2; causal++) variant(pre, causal, 0.1, 1, DM_SCHED_FUSED, cpu, DM_ROWS_DEFAULT);
    variant(0, 0, 0.0, 1, DM_SCHED_FUSED, cpu, DM_ROWS_DEFAULT);
    variant(0, 0, 0.1, 0, DM_SCHED_FUSED, cpu, DM_ROWS_DEFAULT);
    variant(0, 0, 0.1, 1, DM_SCHED_UNFUSED, cpu, DM_ROWS_DEFAULT);
    variant(1, 1, 0.0, 0, DM_SCHED_UNFUSED, cpu, DM_ROWS_DEFAULT);
    attn_op_variant(0, 0.1, cpu);
    attn_op_variant(1, 0.0, cpu);
    /* the CUDA backend (emulated without a GPU): the interpreted and the generated row
     * kernels, which read the step's rows and the dropout's keys from the device */
    const dm_backend *cb;
    if (dm_backend_find(DM_DEVICE_CUDA, &cb) == DM_OK) {
        if (!getenv("DMOVE_CUDA_EMULATE")) setenv("DMOVE_CUDA_EMULATE", "1", 1);
        variant(0, 0, 0.1, 1, DM_SCHED_FUSED, DM_DEVICE_CUDA, DM_ROWS_INTERP);
        variant(1, 1, 0.1, 1, DM_SCHED_UNFUSED, DM_DEVICE_CUDA, DM_ROWS_INTERP);
        variant(0, 0, 0.1, 0, DM_SCHED_FUSED, DM_DEVICE_CUDA, DM_ROWS_GEN);
        variant(0, 1, 0.1, 1, DM_SCHED_UNFUSED, DM_DEVICE_CUDA, DM_ROWS_GEN);
        model_pair(DM_MODEL_HEAD_MLM, DM_XENT_UNFUSED, 0.1, DM_DEVICE_CUDA);
        model_pair(DM_MODEL_HEAD_MLM, DM_XENT_FUSED, 0.1, DM_DEVICE_CUDA); /* over the scored rows: xent.cu */
        model_pair(DM_MODEL_HEAD_CLS, DM_XENT_AUTO, 0.1, DM_DEVICE_CUDA);
        /* the runs above round the weight gradients' k past the tokens too (the default),
         * over rows zeroed first: the rows past the tokens hold NaN (variant), which must not
         * reach a gradient; these keep k exact */
        setenv("DMOVE_CUDA_LIVE_ROUND_K", "0", 1);
        printf("  with DMOVE_CUDA_LIVE_ROUND_K=0:\n");
        variant(0, 0, 0.1, 1, DM_SCHED_FUSED, DM_DEVICE_CUDA, DM_ROWS_INTERP);
        variant(1, 1, 0.1, 1, DM_SCHED_UNFUSED, DM_DEVICE_CUDA, DM_ROWS_INTERP);
        model_pair(DM_MODEL_HEAD_MLM, DM_XENT_UNFUSED, 0.1, DM_DEVICE_CUDA);
        unsetenv("DMOVE_CUDA_LIVE_ROUND_K");
        attn_op_variant(0, 0.1, DM_DEVICE_CUDA);
        /* the flash kernels and the device text, lane by lane, are the host's emulation of
         * GPU code, where the CPU's GEMM kernel never runs: `make test`'s second and third
         * runs with the kernel narrowed (DMOVE_ISA=avx2, none) leave them to the first */
        const char *isa = getenv("DMOVE_ISA");
        if (isa && *isa) {
            printf("  the flash kernels and the device text lane by lane: in the run without DMOVE_ISA (GPU "
                   "code emulated, no CPU GEMM kernel in it)\n");
            refusals();
            TEST_END();
        }
        /* j = 70 and 67, not multiples of 8: each lane draws its own uniforms (at the odd
         * 67, P = 64 below as one op, a pair of them falls across two Philox blocks); 72 and
         * 136: every 8 keys of a row one block (the lanes share them: fl_keep_rows/cols) */
        flash_variant(64, 0, 0.1, DM_DTYPE_BF16, 72);
        flash_variant(64, 1, 0.0, DM_DTYPE_FP16, 70);
        flash_variant(128, 1, 0.1, DM_DTYPE_BF16, 70);
        flash_variant(128, 1, 0.1, DM_DTYPE_BF16, 72);
        /* the forward's warps on 32 queries each (blocks of 128), across two blocks */
        setenv("DMOVE_CUDA_FLASH_MT", "2", 1);
        flash_variant(64, 0, 0.1, DM_DTYPE_BF16, 136);
        flash_variant(64, 1, 0.0, DM_DTYPE_FP16, 70);
        unsetenv("DMOVE_CUDA_FLASH_MT");
        attn_op_flash(64, 0.1, DM_DTYPE_BF16, 67); /* odd j: a pair of scores across two Philox blocks */
        attn_op_flash(64, 0.1, DM_DTYPE_BF16, 72);
        attn_op_flash(128, 0.0, DM_DTYPE_FP16, 70);
        if (!strcmp(getenv("DMOVE_CUDA_EMULATE"), "1")) { /* the generated kernels' device text, lane by lane */
            setenv("DMOVE_CUDA_EMULATE", "lanes", 1);
            variant(1, 0, 0.1, 1, DM_SCHED_FUSED, DM_DEVICE_CUDA, DM_ROWS_GEN);
            setenv("DMOVE_CUDA_EMULATE", "1", 1);
        }
    } else {
        printf("SKIP: the CUDA backend is not built (%s)\n", dm_last_error());
    }
    refusals();
    TEST_END();
}
