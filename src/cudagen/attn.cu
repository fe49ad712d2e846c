/* attn.cu: attention's batched groups as one fused kernel each (bf16/fp16, tensor cores
 * through wmma): per batch item and 16 of its rows a warp computes the scores into shared
 * memory, runs the group's row program over them (gen.cu's row function, reading the
 * scores from the tile and writing the probabilities over them), and multiplies the
 * probabilities by the next operand; the backward kernel, a block per item, adds the
 * third GEMM over P^T after a block barrier. Scores never go to memory. */
#include <stdio.h>
#include <string.h>

#include <memory>
#include <new>
#include <string>

#include "cudagen/gen.h"

/* Offsets of batch item q in the operands of one GEMM, as C++ statements. */
static void batch_code(std::string &src, const dmc_batches &bt, const char *oa, const char *ob, const char *oc) {
    gen_add(src, "    long long %s = 0, %s = 0, %s = 0;\n    {\n        long long t = q;\n", oa, ob, oc);
    for (int d = bt.nd - 1; d >= 0; d--)
        gen_add(src, "        { const long long i = t %% %lldLL; t /= %lldLL; %s += i * %lldLL; %s += i * %lldLL; %s += i * %lldLL; }\n",
            (long long)bt.sz[d], (long long)bt.sz[d], oa, (long long)bt.sa[d], ob, (long long)bt.sb[d], oc,
            (long long)bt.sc[d]);
    gen_add(src, "        (void)t;\n    }\n    (void)%s; (void)%s; (void)%s;\n", oa, ob, oc);
}

/* 1 if every matrix of operand X (base + batch offsets) starts `align`-byte aligned. */
static int batch_aligned(const void *base, const dmc_batches &bt, int which, int esz, int align) {
    if ((uintptr_t)base % (uintptr_t)align) return 0;
    for (int d = 0; d < bt.nd; d++) {
        int64_t st = which == 0 ? bt.sa[d] : which == 1 ? bt.sb[d] : bt.sc[d];
        if (bt.sz[d] > 1 && (st * esz) % align) return 0;
    }
    return 1;
}

/* The tile shape of fused kernel a. Per warp: its 16 rows of C1 rounded to the storage
 * type, LD elements a row, which the row ops overwrite with P in place (each lane its own
 * chunks), then a 16 x 16 fp32 tile through which accumulators are stored. A block: its
 * warps' rows, consecutive (GEMM 3 reads all of them), then their fp32 tiles. */
typedef struct {
    int warps, ld;
    int64_t block_floats, tiles;
} attn_shape;

static dm_status attn_check(const dmc_attn *a, attn_shape *sh) {
    const dm_gemm_map *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;
    const int esz = 2;
    if (a->dt != DMC_BF16 && a->dt != DMC_F16)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: tensor cores need bf16 or fp16 storage");
    if (g1->m % 16 || g1->n % 16 || g1->k % 16 || g2->n % 16 || g2->m != g1->m || g2->k != g1->n)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: sizes not multiples of 16");
    if (g1->k > 128 || g2->n > 128)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: head width above 128");
    if (g1->lda % 8 || g1->ldb % 8 || g2->ldb % 8)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: leading dimensions not multiples of 8");
    if (!batch_aligned(g1->A, a->b1, 0, esz, 32) || !batch_aligned(g1->B, a->b1, 1, esz, 32) ||
        !batch_aligned(g2->B, a->b2, 1, esz, 32))
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: operands not 32-byte aligned");
    if (a->has3 && (g3->m != g1->n || g3->k != g1->m || g3->n % 16 || g3->n > 128 || g3->ldb % 8 ||
                    !batch_aligned(g3->B, a->b3, 1, esz, 32)))
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the third GEMM's sizes or alignment");
    if (a->prog->nacc) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: column sums in the row ops");
    /* 8 elements of padding: rows 16 bytes apart modulo 128, so the 8 rows a tensor-core
     * load reads at once (16 bytes each) fall in different banks; every tile base stays
     * 32-byte aligned (16 rows of LD are a multiple of 256 bytes) and LD a multiple of 8 */
    sh->ld = (int)(g1->n + 8);
    sh->tiles = a->b1.count * (g1->m / 16);
    const int64_t warp_bytes = 16 * (int64_t)sh->ld * esz + 256 * 4;
    if (a->has3) { /* a block per batch item: its rows of P are all GEMM 3 needs; at most
                    * 112 KiB of shared memory, so that two blocks share an SM (228 KiB on an
                    * H100, 1 KiB of it reserved per block) */
        sh->warps = g1->m / 16;
        if (sh->warps > 32 || sh->warps * warp_bytes > (int64_t)a->smem_max || sh->warps * warp_bytes > 112 * 1024)
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: %d rows of one item exceed a block", g1->m);
    } else {
        for (sh->warps = 4; sh->warps > 1; sh->warps /= 2)
            if (sh->warps * warp_bytes <= 100 * 1024 && sh->warps * warp_bytes <= (int64_t)a->smem_max) break;
        if (sh->warps * warp_bytes > (int64_t)a->smem_max)
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: rows of %d scores exceed shared memory", g1->n);
    }
    sh->block_floats = sh->warps * warp_bytes / 4;
    return DM_OK;
}

/* Accumulator tile ACC to DST (16 x 16 of the storage type, rows LD apart; 16-byte stores
 * if vec), through the warp's fp32 tile F: lanes lane, lane + 32, ... take 8 elements. */
static void emit_tile_out(std::string &src, const char *acc, const char *dst, const char *ld, int vec) {
    gen_add(src, "        dmg_store_c(F, %s, 16);\n        DMG_WSYNC();\n", acc);
    gen_add(src, "        for (int e = lane * 8; e < 256; e += TPW * TEAM * 8) {\n"
             "            float v[8];\n"
             "            dmg_ld8<1>(v, F + e, 8);\n"
             "            dmg_st8<%d>(%s + (long long)(e / 16) * (%s) + e %% 16, v, 8);\n"
             "        }\n        DMG_WSYNC();\n", vec, dst, ld);
}

/* C[16 x NN] = alpha * A op(B) over K: A a 16 x K tile of the storage type in shared memory
 * (akind declares and loads fragment pa for step kk), B streamed from memory. */
static void emit_gemm_out(std::string &src, const char *ST, const char *akind, int K, int NN, int TB, int LDB,
                          const char *B, float alpha, const char *C, int LDC, int vec) {
    gen_add(src, "    {\n        dmg_fc acc[%d];\n        DMC_UNROLL for (int c2 = 0; c2 < %d; c2++) dmg_zero(acc[c2]);\n", NN / 16,
        NN / 16);
    gen_add(src, "        for (int kk = 0; kk < %d; kk++) {\n", K / 16);
    gen_add(src, "            %s\n", akind);
    gen_add(src, "            DMC_UNROLL for (int c2 = 0; c2 < %d; c2++) {\n"
             "                dmg_fb<%s, %d> fb;\n"
             "                dmg_load_b(fb, %s + (%d ? (long long)c2 * 16 * %d + kk * 16 : (long long)kk * 16 * %d + c2 * 16), %d);\n"
             "                dmg_mma(acc[c2], pa, fb);\n            }\n        }\n",
        NN / 16, ST, TB, B, TB, LDB, LDB, LDB);
    gen_add(src, "        for (int c2 = 0; c2 < %d; c2++) {\n        dmg_scale(acc[c2], %.9ef);\n", NN / 16, (double)alpha);
    char dst[64], ld[32];
    snprintf(dst, sizeof dst, "%s + c2 * 16", C);
    snprintf(ld, sizeof ld, "%d", LDC);
    emit_tile_out(src, "acc[c2]", dst, ld, vec);
    gen_add(src, "        }\n    }\n");
}

/* Appends fused kernel number idx for a to src; shape into k. */
dm_status gen_attn(const dmc_attn *a, int idx, dmc_genk *k, std::string &src) {
    attn_shape sh = {};
    DM_TRY(attn_check(a, &sh));
    std::unique_ptr<gen_ctx> holder(new gen_ctx());
    gen_ctx *G = holder.get();
    G->p = a->prog;
    G->s_base = a->g1.C;
    G->p_base = a->g2.A;
    G->p_global = a->p_in_memory;
    std::string rows;
    DM_TRY(gen_rows_fn(G, idx, sh.ld, sh.ld, rows));
    /* the row program reads C1 (S) and writes P, whole rows of both; the row ops write
     * nothing the GEMMs read from memory (other warps do) */
    const gen_val *S = NULL, *Pv = NULL;
    for (int i = 0; i < G->nv; i++) {
        const gen_val *x = &G->v[i];
        if (x->loc != DMC_LOC_GLOBAL) continue;
        if (x->base == G->s_base) {
            if (x->kind != DM_ARG_FULL || x->def_seg >= 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops write the scores");
            S = x;
        }
        if (x->base == G->p_base) {
            if (x->kind != DM_ARG_FULL || x->def_seg < 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops do not make GEMM 2's operand");
            Pv = x;
        }
        if (x->def_seg >= 0 && (x->base == a->g1.A || x->base == a->g1.B || x->base == a->g2.B ||
                                (a->has3 && (x->base == a->g3.B || x->base == a->g3.C)) || x->base == a->g2.C))
            return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops write a GEMM operand");
    }
    if (!S || !Pv) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: the row ops do not join the GEMMs");
    /* P overwrites S in place, each lane its own chunks: S's first read must come no later
     * than the op that makes P (then its load precedes P's store in every lane) */
    if (S->first_read_op > Pv->def_op)
        return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: P made before the scores are read");
    if (G->nparam + 6 > DMG_MAXP) return dm_fail(DM_ERR_UNSUPPORTED, "fused attention: too many operands");
    const int pa1 = G->nparam, pb1 = pa1 + 1, pb2 = pa1 + 2, pc2 = pa1 + 3, pb3 = pa1 + 4, pc3 = pa1 + 5;
    G->params[pa1] = a->g1.A;
    G->params[pb1] = a->g1.B;
    G->params[pb2] = a->g2.B;
    G->params[pc2] = a->g2.C;
    G->params[pb3] = a->has3 ? a->g3.B : NULL;
    G->params[pc3] = a->has3 ? a->g3.C : NULL;
    const int np = G->nparam + 6;
    const int vec2 = batch_aligned(a->g2.C, a->b2, 2, 2, 16) && (a->g2.ldc * 2) % 16 == 0;
    const int vec3 = a->has3 && batch_aligned(a->g3.C, a->b3, 2, 2, 16) && (a->g3.ldc * 2) % 16 == 0;
    const char *ST = gen_type_name(a->dt);
    const dm_gemm_map *g1 = &a->g1, *g2 = &a->g2, *g3 = &a->g3;

    src += rows;
    gen_add(src, "/* fused kernel %d: per batch item (%lld) and 16 of its %d rows: [%d x %d] = %.9g op(A1) op(B1) "
             "(k %d) in shared memory, the row ops, [%d x %d] = %.9g P op(B2)", idx, (long long)a->b1.count, g1->m,
        g1->m, g1->n, (double)g1->alpha, g1->k, g2->m, g2->n, (double)g2->alpha);
    if (a->has3) gen_add(src, "; then per item [%d x %d] = %.9g P^T op(B3)", g3->m, g3->n, (double)g3->alpha);
    gen_add(src, " */\n");
    /* a warp's rows: GEMM 1, the row ops, GEMM 2 */
    gen_add(src, "template <int TEAM, int NCH, int TPW> __host__ __device__ void dmg_att%d(const dmg_ptrs &P, "
             "unsigned long long seed, long long T, int lt, int tw, int lane, %s *Sw, float *F) {\n", idx, ST);
    gen_add(src, "    enum { M = %d, N = %d, K1 = %d, LD = %d, MT = M / 16 };\n", g1->m, g1->n, g1->k, sh.ld);
    gen_add(src, "    enum { LDA1 = %d, LDB1 = %d, TA1 = %d, TB1 = %d };\n", g1->lda, g1->ldb, g1->transA, g1->transB);
    gen_add(src, "    const long long q = T / MT, i0 = (T %% MT) * 16, RB = q * M + i0;\n");
    batch_code(src, a->b1, "oa1", "ob1", "oc1");
    batch_code(src, a->b2, "oa2", "ob2", "oc2");
    gen_add(src, "    const %s *A1 = (const %s *)P.p[%d] + oa1 + (TA1 ? i0 : i0 * LDA1);\n", ST, ST, pa1);
    gen_add(src, "    const %s *B1 = (const %s *)P.p[%d] + ob1;\n", ST, ST, pb1);
    gen_add(src, "    const %s *B2 = (const %s *)P.p[%d] + ob2;\n", ST, ST, pb2);
    gen_add(src, "    %s *C2 = (%s *)P.p[%d] + oc2 + i0 * %d;\n", ST, ST, pc2, g2->ldc);
    /* GEMM 1: the warp's 16 rows of A1 held, B1 streamed per 16 columns */
    gen_add(src, "    dmg_fa<%s, TA1> fa[K1 / 16];\n", ST);
    gen_add(src, "    DMC_UNROLL for (int kk = 0; kk < K1 / 16; kk++) dmg_load_a(fa[kk], A1 + (TA1 ? (long long)kk * 16 * LDA1 : kk * 16), LDA1);\n");
    gen_add(src, "    for (int ct = 0; ct < N / 16; ct++) {\n"
             "        dmg_fc acc;\n        dmg_zero(acc);\n"
             "        DMC_UNROLL for (int kk = 0; kk < K1 / 16; kk++) {\n"
             "            dmg_fb<%s, TB1> fb;\n"
             "            dmg_load_b(fb, B1 + (TB1 ? (long long)ct * 16 * LDB1 + kk * 16 : (long long)kk * 16 * LDB1 + ct * 16), LDB1);\n"
             "            dmg_mma(acc, fa[kk], fb);\n        }\n"
             "        dmg_scale(acc, %.9ef);\n", ST, (double)g1->alpha);
    emit_tile_out(src, "acc", "Sw + ct * 16", "LD", 1);
    gen_add(src, "    }\n");
    gen_add(src, "    dmg_rows%d<TEAM, NCH>(P, seed, 0, lt, RB, TPW, tw, RB + 16, Sw, Sw);\n", idx);
    gen_add(src, "    DMG_WSYNC();\n");
    /* GEMM 2: P from shared memory (row-major), B2 streamed */
    char akind[160];
    snprintf(akind, sizeof akind, "dmg_fa<%s, 0> pa;\n            dmg_load_a(pa, Sw + kk * 16, LD);", ST);
    emit_gemm_out(src, ST, akind, g1->n, g2->n, g2->transB, g2->ldb, "B2", g2->alpha, "C2", g2->ldc, vec2);
    gen_add(src, "}\n");
    if (a->has3) {
        /* GEMM 3, after every warp's rows: 16 rows t0.. of P^T (P column-major) over all
         * M rows of the item, times B3 */
        gen_add(src, "template <int TEAM, int TPW> __host__ __device__ void dmg_att%d_3(const dmg_ptrs &P, long long q, "
                 "int t, int lane, const %s *Pall, float *F) {\n", idx, ST);
        gen_add(src, "    enum { LD = %d };\n    const long long t0 = (long long)t * 16;\n", sh.ld);
        batch_code(src, a->b3, "oa3", "ob3", "oc3");
        gen_add(src, "    const %s *B3 = (const %s *)P.p[%d] + ob3;\n", ST, ST, pb3);
        gen_add(src, "    %s *C3 = (%s *)P.p[%d] + oc3 + t0 * %d;\n", ST, ST, pc3, g3->ldc);
        snprintf(akind, sizeof akind, "dmg_fa<%s, 1> pa;\n            dmg_load_a(pa, Pall + (long long)kk * 16 * LD + t0, LD);", ST);
        emit_gemm_out(src, ST, akind, g1->m, g3->n, g3->transB, g3->ldb, "B3", g3->alpha, "C3", g3->ldc, vec3);
        gen_add(src, "}\n");
    }

    const int64_t items = a->b1.count;
    const int64_t blocks = a->has3 ? items : (sh.tiles + sh.warps - 1) / sh.warps;
    k->threads = 32 * sh.warps;
    k->teams = 0;
    k->blocks = (int)(blocks < 65535 ? blocks : 65535);
    k->smem = (size_t)(sh.block_floats * 4);
    k->nparams = np;
    for (int q = 0; q < np; q++) k->params[q] = (void *)G->params[q];
    k->acc_floats = 0;
    const int64_t rows_floats = (int64_t)sh.warps * 16 * sh.ld / 2; /* the block's rows, in floats */
    gen_add(src, "#if defined(__CUDACC_RTC__) || defined(DMG_SIM)\n");
    gen_add(src, "DMG_KERNEL(%d) dmg_k%d(const dmg_ptrs P, unsigned long long seed, float *part) {\n", k->threads, idx);
    gen_add(src, "    enum { TEAM = %d, NCH = %d, TPW = 32 / TEAM, W = %d };\n", G->team, G->nch, sh.warps);
    gen_add(src, "    (void)part;\n    DMG_SMEM(dmg_smem);\n");
    gen_add(src, "    const int lane = DMG_TID %% 32, w = DMG_TID / 32;\n");
    gen_add(src, "    %s *Pall = (%s *)dmg_smem, *Sw = Pall + (long long)w * 16 * %d;\n", ST, ST, sh.ld);
    gen_add(src, "    float *F = dmg_smem + %lld + w * 256;\n", (long long)rows_floats);
    if (a->has3) {
        gen_add(src, "    for (long long q = DMG_BID; q < %lldLL; q += DMG_NBLK) {\n", (long long)items);
        gen_add(src, "        dmg_att%d<TEAM, NCH, TPW>(P, seed, q * W + w, lane %% TEAM, lane / TEAM, lane, Sw, F);\n", idx);
        gen_add(src, "        DMG_SYNC();\n");
        gen_add(src, "        for (int t = w; t < %d; t += W) dmg_att%d_3<TEAM, TPW>(P, q, t, lane, Pall, F);\n", g3->m / 16, idx);
        gen_add(src, "        DMG_SYNC();\n    }\n");
    } else {
        gen_add(src, "    for (long long T = (long long)DMG_BID * W + w; T < %lldLL; T += (long long)DMG_NBLK * W)\n"
                 "        dmg_att%d<TEAM, NCH, TPW>(P, seed, T, lane %% TEAM, lane / TEAM, lane, Sw, F);\n",
            (long long)sh.tiles, idx);
    }
    gen_add(src, "}\n#endif\n");
    /* the host: the simulation, or each warp's part by a team of one, in order */
    gen_add(src, "#ifndef __CUDACC_RTC__\n");
    gen_add(src, "extern \"C\" int dmg_h%d(const dmg_ptrs *P, unsigned long long seed, float *part, int blocks) {\n", idx);
    gen_add(src, "#ifdef DMG_SIM\n    dmg_sim_run(%d, blocks, %lld, [&] { dmg_k%d(*P, seed, part); });\n    return 0;\n#else\n",
        k->threads, (long long)sh.block_floats, idx);
    gen_add(src, "    (void)part; (void)blocks;\n"
             "    float *S = (float *)malloc(sizeof(float) * %lld);\n    if (!S) return 1;\n"
             "    %s *Pall = (%s *)S;\n    float *F = S + %lld;\n", (long long)sh.block_floats, ST, ST, (long long)rows_floats);
    if (a->has3)
        gen_add(src, "    for (long long q = 0; q < %lldLL; q++) {\n"
                 "        for (int w = 0; w < %d; w++) dmg_att%d<1, %d, 1>(*P, seed, q * %d + w, 0, 0, 0, Pall + w * 16 * %d, F);\n"
                 "        for (int t = 0; t < %d; t++) dmg_att%d_3<1, 1>(*P, q, t, 0, Pall, F);\n    }\n",
            (long long)items, sh.warps, idx, G->chunks, sh.warps, sh.ld, g3->m / 16, idx);
    else
        gen_add(src, "    for (long long T = 0; T < %lldLL; T++) dmg_att%d<1, %d, 1>(*P, seed, T, 0, 0, 0, Pall, F);\n",
            (long long)sh.tiles, idx, G->chunks);
    gen_add(src, "    free(S);\n    return 0;\n#endif\n}\n#endif\n");
    return DM_OK;
}

dm_status dmc_gen_attn_eligible(const dmc_attn *a) {
    try {
        std::string src;
        dmc_genk k;
        return gen_attn(a, 0, &k, src);
    } catch (const std::bad_alloc &) {
        return dm_fail(DM_ERR_OOM, "out of memory generating a fused attention kernel");
    }
}
