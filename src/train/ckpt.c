/* ckpt.c: the trainer's checkpoints (safetensors: every parameter and both AdamW moments
 * under Hugging Face BertEncoder names, the configuration and step count in the metadata,
 * and a checksum over both), and loading a pretrained encoder's parameters. A file is
 * validated whole before the trainer changes; writing goes through a temporary file. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "dist/dist.h"
#include "dmove_tools.h"
#include "graph/encoder.h"
#include "train/hfload.h"
#include "train/model.h"
#include "train/trainer_internal.h"

#define CKPT_FORMAT "dmove-trainer-checkpoint"
#define CKPT_VERSION "2"

/* The checkpoint's version (1 or 2) from its metadata, 0 when it is neither. Version 2
 * differs only in its checksum: version 1's left a change in a word's top bits in the top
 * bits, so two sign flips cancelled. */
static int ckpt_version(const char *ver) { return !ver ? 0 : !strcmp(ver, "2") ? 2 : !strcmp(ver, "1") ? 1 : 0; }

/* FNV-1a over 8-byte words (then the tail bytes), each step followed in version 2 by an
 * xor-shift that carries the high bits down (each step a bijection of h, so any one changed
 * word changes h, and two changes cancel by chance alone): fast enough for gigabytes. */
uint64_t dm_train_hash_bytes(uint64_t h, const void *data, size_t n, int ver) {
    const unsigned char *p = data;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 0x100000001b3ull;
        if (ver >= 2) h ^= h >> 29;
    }
    for (; k < n; k++) {
        h = (h ^ p[k]) * 0x100000001b3ull;
        if (ver >= 2) h ^= h >> 29;
    }
    return h;
}

static uint64_t hash_str(uint64_t h, const char *s, int ver) { return dm_train_hash_bytes(h, s, strlen(s) + 1, ver); }

/* The metadata: up to M_MODEL the architecture (the parameters fit only it), up to M_ADAMW
 * the run (resuming with other values would not continue it: other masks, data or
 * optimizer), then what may change (the decay's last step, with a longer --steps) and the
 * step itself. */
enum { M_LAYERS, M_HIDDEN, M_HEADS, M_FFN, M_ACT, M_NORM, M_CAUSAL, M_EPS, M_MODEL, M_DROPOUT, M_SEED, M_BATCH,
       M_SEQ, M_RUN, M_ADAMW, M_TOTAL, M_STEP, M_SKIPPED, M_N };
static const char *const k_meta[M_N] = {"layers", "hidden", "heads", "ffn",  "act", "norm",
                                        "causal", "eps",    "model", "dropout", "seed", "batch",
                                        "seq",    "run",    "adamw", "adamw_total", "step", "skipped"};
/* The layer variant's keys came later: a checkpoint without them is of a post-LN,
 * bidirectional stack, and at those values they are left out of the checksum; so is
 * "model" ("-": a stack of layers; a whole BERT's sizes around its layers). */
static const char *optional_default(int m) {
    return m == M_NORM ? "post" : m == M_CAUSAL ? "0" : m == M_MODEL ? "-" : m == M_SKIPPED ? "0" : NULL;
}
#define META_MAX_STEP INT64_C(1000000000000)
#define META_LEN 400 /* a value's text, its 0 included */

static void meta_values(const dm_trainer *T, char v[M_N][META_LEN]) {
    const dm_layer_config *c = &T->cfg;
    const dm_optim_config *a = &T->optim;
    snprintf(v[M_LAYERS], META_LEN, "%d", T->nlayers);
    snprintf(v[M_HIDDEN], META_LEN, "%" PRId64, c->hidden);
    snprintf(v[M_HEADS], META_LEN, "%" PRId64, c->heads);
    snprintf(v[M_FFN], META_LEN, "%" PRId64, c->ffn);
    snprintf(v[M_ACT], META_LEN, "%s", dm_act_name(c->act));
    snprintf(v[M_NORM], META_LEN, "%s", dm_norm_name(c->norm));
    snprintf(v[M_CAUSAL], META_LEN, "%d", c->causal);
    dm_fmt_exact(v[M_EPS], META_LEN, c->eps);
    dm_fmt_exact(v[M_DROPOUT], META_LEN, c->dropout);
    snprintf(v[M_SEED], META_LEN, "%" PRIu64, c->seed);
    snprintf(v[M_BATCH], META_LEN, "%" PRId64, c->batch * T->ranks); /* the global batch */
    snprintf(v[M_SEQ], META_LEN, "%" PRId64, c->seq);
    snprintf(v[M_RUN], META_LEN, "%s", T->run_tag[0] ? T->run_tag : "-");
    if (T->model) {
        const dm_bert_sizes *z = &T->model->c.sizes;
        int n = snprintf(v[M_MODEL], META_LEN, "bert vocab=%" PRId64 " positions=%" PRId64 " types=%" PRId64
                         " predictions=%" PRId64 " pad=%" PRId64, z->vocab, z->positions, z->types,
                         z->predictions * T->ranks /* the global batch's, as the batch */, T->model->c.pad_id);
        /* the head kind after the MLM model's text (its older files' text unchanged) */
        if (T->model->c.head == DM_MODEL_HEAD_CLS)
            snprintf(v[M_MODEL] + n, (size_t)(META_LEN - n), " head=classifier num_labels=%" PRId64, z->classes);
    } else {
        snprintf(v[M_MODEL], META_LEN, "-");
    }
    char f[5][32];
    const double fv[5] = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
    for (int k = 0; k < 5; k++) dm_fmt_exact(f[k], sizeof f[k], fv[k]);
    int n = snprintf(v[M_ADAMW], META_LEN, "lr=%s beta1=%s beta2=%s eps=%s weight_decay=%s warmup=%" PRId64, f[0],
                     f[1], f[2], f[3], f[4], a->warmup);
    /* what came after AdamW alone, named only off its default: the older files' text */
    char x[3][32];
    dm_fmt_exact(x[0], sizeof x[0], a->power);
    dm_fmt_exact(x[1], sizeof x[1], a->lr_end);
    dm_fmt_exact(x[2], sizeof x[2], a->clip_norm);
    if (a->kind != DM_OPT_ADAMW) n += snprintf(v[M_ADAMW] + n, (size_t)(META_LEN - n), " optimizer=%s", dm_optimizer_name(a->kind));
    if (a->power != 1.0) n += snprintf(v[M_ADAMW] + n, (size_t)(META_LEN - n), " power=%s", x[0]);
    if (a->lr_end != 0.0) n += snprintf(v[M_ADAMW] + n, (size_t)(META_LEN - n), " lr_end=%s", x[1]);
    if (a->clip_norm != 0.0) n += snprintf(v[M_ADAMW] + n, (size_t)(META_LEN - n), " clip_norm=%s", x[2]);
    if (a->accumulate != 1) snprintf(v[M_ADAMW] + n, (size_t)(META_LEN - n), " accumulate=%d", a->accumulate);
    snprintf(v[M_TOTAL], META_LEN, "%" PRId64, a->total);
    snprintf(v[M_STEP], META_LEN, "%" PRId64, T->step);
    snprintf(v[M_SKIPPED], META_LEN, "%" PRId64, T->skipped); /* steps without an update (AdamW's count) */
}

/* The checkpoint's tensors in file order: for each slot (a stack: layer by layer,
 * parameter by parameter), the parameter, exp_avg, exp_avg_sq; under Hugging Face names
 * (a stack: BertEncoder's, a whole BERT: BertForMaskedLM's). */
static void tensor_name(const dm_trainer *T, char *out, size_t n, int si, int which) {
    static const char *const suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};
    const dm_train_slot *sl = &T->slot[si];
    if (!T->model)
        snprintf(out, n, "encoder.layer.%d.%s%s", sl->seg, sl->pname, suffix[which]);
    else if (sl->seg == 0)
        snprintf(out, n, "bert.%s%s", sl->pname, suffix[which]);
    else if (sl->seg <= T->nlayers)
        snprintf(out, n, "bert.encoder.layer.%d.%s%s", sl->seg - 1, sl->pname, suffix[which]);
    else
        snprintf(out, n, "%s%s", sl->pname, suffix[which]);
}

/* Slot si's parameter (which 0) or moments (1, 2); NULL for moments another rank keeps
 * (ZeRO), but in a save, whose gathered moments (moments_all) are all there. */
static const float *tensor_data(const dm_trainer *T, int si, int which) {
    const dm_train_slot *sl = &T->slot[si];
    if (which == 0) return sl->p;
    if (T->moments_all) return T->moments_all + (which == 1 ? 0 : T->nparams) + sl->off;
    return dm_slot_moments(T, sl, which == 2, 0);
}

/* The tensors in file order, layer by layer, parameter by parameter, then which: */
static int ntensors(const dm_trainer *T) { return T->nslots * 3; }

/* The checksum over the metadata and every tensor's bytes, data[(si * 3) + which] (in the
 * file, data may be unaligned: it is read as bytes). */
static uint64_t checksum_of(const char meta[M_N][META_LEN], const char *labels, const dm_trainer *T,
                            const void *const *data, int ver) {
    uint64_t h = hash_str(14695981039346656037ull, CKPT_FORMAT, ver);
    for (int m = 0; m < M_N; m++) {
        if (optional_default(m) && !strcmp(meta[m], optional_default(m))) continue;
        h = hash_str(h, k_meta[m], ver);
        h = hash_str(h, meta[m], ver);
    }
    if (labels) { /* a classifier's class names (files without them: unchanged) */
        h = hash_str(h, "label_names", ver);
        h = hash_str(h, labels, ver);
    }
    char name[192];
    for (int si = 0; si < T->nslots; si++)
        for (int w = 0; w < 3; w++) {
            tensor_name(T, name, sizeof name, si, w);
            h = hash_str(h, name, ver);
            h = dm_train_hash_bytes(h, data[si * 3 + w], (size_t)T->slot[si].n * sizeof(float), ver);
        }
    return h;
}

/* fn(T, path) run by rank 0 alone (every rank holds the same state), its result told to
 * every rank: one file written once, whatever the number of ranks. */
static dm_status on_rank0(const dm_trainer *T, const char *path, dm_status (*fn)(const dm_trainer *, const char *)) {
    if (T->ranks < 2) return fn(T, path);
    struct {
        int32_t status;
        char msg[1020];
    } r = {DM_OK, ""};
    if (dm_dist_rank(T->dist) == 0) {
        r.status = (int32_t)fn(T, path);
        if (r.status != DM_OK) snprintf(r.msg, sizeof r.msg, "%s", dm_last_error());
    }
    DM_TRY(dm_dist_bcast_slow(T->dist, &r, sizeof r, 0, "rank 0 writing the file"));
    if (r.status == DM_OK) return DM_OK;
    return dm_dist_rank(T->dist) == 0 ? (dm_status)r.status
                                      : dm_fail((dm_status)r.status, "rank 0, writing for every rank: %s", r.msg);
}

static dm_status save_file(const dm_trainer *T, const char *path);

/* Ranks about to train from what each read from its own files (a checkpoint, pretrained
 * weights) must hold the same step and parameters: else DM_ERR_INVALID_ARG on every rank
 * naming `what` and the rank that differs (a stale copy on another machine would otherwise
 * train another model, or stop inside MPI at a step count the others do not share). A
 * collective of the trainer's ranks; one rank: DM_OK at once. */
static dm_status agree_state(dm_trainer *T, const char *what) {
    if (T->ranks < 2 || !T->dist) return DM_OK;
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE)); /* the backend's parameters to the host */
    uint64_t h = hash_str(14695981039346656037ull, "parameters", 2);
    for (int si = 0; si < T->nslots; si++) h = dm_train_hash_bytes(h, T->slot[si].p, (size_t)T->slot[si].n * sizeof(float), 2);
    char v[96];
    snprintf(v, sizeof v, "step %" PRId64 ", parameters %016" PRIx64, T->step, h);
    return dm_dist_agree(T->dist, what, v);
}

dm_status dm_trainer_save(const dm_trainer *T, const char *path) {
    if (!T || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_save: NULL argument");
    if (!T->zero || T->ranks < 2) return on_rank0(T, path, save_file);
    /* ZeRO: each rank's shard of the moments to rank 0, which writes the one file */
    if (T->broken) return dm_trainer_broken(T);
    dm_trainer *W = (dm_trainer *)T; /* moments_all lives for this call only */
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE));
    DM_TRY(dm_trainer_gather_moments(W, &W->moments_all));
    dm_status s = on_rank0(T, path, save_file);
    free(W->moments_all);
    W->moments_all = NULL;
    return s;
}

static void json_str(dm_sbuf *b, const char *s);

/* A classifier's class names as a JSON list of strings (malloc'd), or NULL: none named. */
static char *label_names_json(const dm_model *m) {
    if (!m || m->c.head != DM_MODEL_HEAD_CLS || !m->label_names) return NULL;
    dm_sbuf b = {0};
    dm_sb_printf(&b, "[");
    for (int64_t k = 0; k < m->c.sizes.classes; k++) {
        if (k) dm_sb_printf(&b, ", ");
        json_str(&b, m->label_names[k]);
    }
    dm_sb_printf(&b, "]");
    return dm_sb_done(&b);
}

static dm_status save_file(const dm_trainer *T, const char *path) {
    if (!T->moments)
        return dm_fail(DM_ERR_INVALID_ARG, "a forward-only trainer has no optimizer state to checkpoint");
    if (T->broken) return dm_trainer_broken(T);
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE)); /* the backend's parameters and moments to the host */
    char meta[M_N][META_LEN], hex[32], name[192];
    meta_values(T, meta);
    /* test hook: DMOVE_TEST_CHECKPOINT_V1 writes the file as an older dmove did (version 1's
     * checksum, the run's version-1 tag), so that the tests resume such a file */
    const int ver = getenv("DMOVE_TEST_CHECKPOINT_V1") ? 1 : 2;
    if (ver == 1 && T->run_tag_v1[0]) snprintf(meta[M_RUN], META_LEN, "%s", T->run_tag_v1);
    const void **data = malloc((size_t)ntensors(T) * sizeof *data);
    if (!data) return dm_fail(DM_ERR_OOM, "out of memory writing checkpoint '%s'", path);
    for (int i = 0; i < ntensors(T); i++) data[i] = tensor_data(T, i / 3, i % 3);
    char *labels = label_names_json(T->model);
    if (!labels && T->model && T->model->c.head == DM_MODEL_HEAD_CLS && T->model->label_names) {
        free(data);
        return dm_fail(DM_ERR_OOM, "out of memory writing checkpoint '%s'", path);
    }
    snprintf(hex, sizeof hex, "%016" PRIx64, checksum_of(meta, labels, T, data, ver));
    dm_st_writer *w = NULL;
    dm_status s = dm_st_writer_new(&w);
    if (s == DM_OK && labels) s = dm_st_writer_set_metadata(w, "label_names", labels);
    free(labels);
    if (s == DM_OK) s = dm_st_writer_set_metadata(w, "format", CKPT_FORMAT);
    if (s == DM_OK) s = dm_st_writer_set_metadata(w, "version", ver == 1 ? "1" : CKPT_VERSION);
    for (int m = 0; s == DM_OK && m < M_N; m++) s = dm_st_writer_set_metadata(w, k_meta[m], meta[m]);
    if (s == DM_OK) s = dm_st_writer_set_metadata(w, "checksum", hex);
    for (int si = 0; s == DM_OK && si < T->nslots; si++)
        for (int wh = 0; s == DM_OK && wh < 3; wh++) {
            const dm_train_slot *sl = &T->slot[si];
            tensor_name(T, name, sizeof name, si, wh);
            s = dm_st_writer_add(w, name, DM_ST_F32, sl->ndim, sl->shape, data[si * 3 + wh]);
        }
    if (s == DM_OK) s = dm_st_writer_write(w, path);
    dm_st_writer_free(w);
    free(data);
    if (s != DM_OK) dm_fail_context(s, "writing checkpoint '%s': ", path);
    return s;
}

/* The file's tensor for (slot si, which), checked: f32, the slot's shape. */
static dm_status find_checked(const dm_st_file *f, const dm_trainer *T, int si, int which, const dm_st_tensor **out) {
    char name[192];
    tensor_name(T, name, sizeof name, si, which);
    const dm_st_tensor *t = dm_st_find(f, name);
    if (!t) return dm_fail(DM_ERR_NOT_FOUND, "tensor '%s' is missing: the file is not a whole checkpoint", name);
    const dm_train_slot *sl = &T->slot[si];
    int ok = t->dtype == DM_ST_F32 && t->ndim == sl->ndim && t->shape[0] == sl->shape[0] &&
             (sl->ndim == 1 || t->shape[1] == sl->shape[1]);
    if (!ok) return dm_fail(DM_ERR_SHAPE, "tensor '%s' is %s with %d dimensions, not F32 of this trainer's shape",
                            name, dm_st_dtype_name(t->dtype), t->ndim);
    *out = t;
    return DM_OK;
}

/* Validates the file against T (format, metadata, every tensor, the checksum), then
 * copies; data: scratch for ntensors(T) pointers. */
/* Metadata value m of a checkpoint and of this trainer the same: the model's without its
 * " predictions=N", the masked positions a batch scores, which is the batch's shape, not
 * the model's (and rounds per rank: N ranks' default differs from one process's). */
static int same_meta(int m, const char *a, const char *b) {
    if (m != M_MODEL) return !strcmp(a, b);
    char x[2][META_LEN];
    const char *in[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        snprintf(x[k], META_LEN, "%s", in[k]);
        char *p = strstr(x[k], " predictions=");
        if (!p) continue;
        const char *e = p + 13;
        while (*e >= '0' && *e <= '9') e++;
        memmove(p, e, strlen(e) + 1);
    }
    return !strcmp(x[0], x[1]);
}

static dm_status load_valid(dm_trainer *T, const dm_st_file *f, const void **data) {
    const char *fmt = dm_st_metadata(f, "format"), *ver = dm_st_metadata(f, "version");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
        return dm_fail(DM_ERR_FORMAT, "not a dmove checkpoint (no \"format\": \"" CKPT_FORMAT "\" in its "
                       "metadata); to start from a pretrained BERT's weights, use --init instead");
    if (!ckpt_version(ver))
        return dm_fail(DM_ERR_FORMAT, "checkpoint version '%s': this dmove reads versions 1 and " CKPT_VERSION,
                       ver ? ver : "(none)");
    char mine[M_N][META_LEN], theirs[M_N][META_LEN];
    meta_values(T, mine);
    for (int m = 0; m < M_N; m++) {
        const char *v = dm_st_metadata(f, k_meta[m]);
        if (!v) v = optional_default(m);
        if (!v) return dm_fail(DM_ERR_FORMAT, "the checkpoint's metadata has no '%s'", k_meta[m]);
        snprintf(theirs[m], META_LEN, "%s", v);
    }
    /* the kind of model first: a stack of layers' checkpoint given to a whole BERT, or the
     * reverse, or another head */
    const int their_stack = !strcmp(theirs[M_MODEL], "-"), my_stack = !strcmp(mine[M_MODEL], "-");
    const int their_cls = strstr(theirs[M_MODEL], "head=classifier") != NULL,
              my_cls = strstr(mine[M_MODEL], "head=classifier") != NULL;
    static const char *const kind[3] = {"a stack of encoder layers (dmove train)",
                                        "a BertForMaskedLM (dmove pretrain)",
                                        "a BertForSequenceClassification (dmove finetune)"};
    const int tk = their_stack ? 0 : their_cls ? 2 : 1, mk = my_stack ? 0 : my_cls ? 2 : 1;
    if (tk != mk)
        return dm_fail(DM_ERR_SHAPE, "the checkpoint is of %s, and this run trains %s: resume it with the "
                       "command that saved it", kind[tk], kind[mk]);
    /* the batch next: another batch changes the model's `predictions` too, and is no
     * question of architecture */
    for (int k = -1; k <= M_ADAMW; k++) {
        const int m = k < 0 ? M_BATCH : k;
        if (same_meta(m, theirs[m], mine[m])) continue;
        if (m == M_RUN && ckpt_version(ver) == 1 && T->run_tag_v1[0] && !strcmp(theirs[m], T->run_tag_v1)) {
            if (!T->run_tag_v1_note[0]) continue; /* the same run, as an older dmove named it */
            return dm_fail(DM_ERR_INVALID_ARG, "the checkpoint (version 1, from an older dmove) is of this run, "
                           "but %s", T->run_tag_v1_note);
        }
        if (m == M_BATCH && T->ranks > 1) {
            const long long gb = strtoll(theirs[m], NULL, 10);
            char fix[96];
            if (gb > 0 && gb % T->ranks == 0) snprintf(fix, sizeof fix, "give each rank --batch %lld", gb / T->ranks);
            else snprintf(fix, sizeof fix, "%d ranks cannot share it evenly", T->ranks);
            return dm_fail(DM_ERR_INVALID_ARG, "the checkpoint's global batch is %s, this run's %s (%d ranks x "
                           "--batch %lld): %s, or resume with a rank count that divides %s", theirs[m], mine[m],
                           T->ranks, (long long)T->cfg.batch, fix, theirs[m]);
        }
        if (m <= M_MODEL)
            return dm_fail(DM_ERR_SHAPE, "the checkpoint's %s is %s, this trainer's %s: give the architecture it was "
                           "saved with (checkpoint: %s layers, hidden %s, heads %s, ffn %s, act %s, norm %s, "
                           "causal %s, eps %s, model %s; where these are not what it was saved with, the file "
                           "is damaged)",
                           k_meta[m], theirs[m], mine[m], theirs[M_LAYERS], theirs[M_HIDDEN], theirs[M_HEADS],
                           theirs[M_FFN], theirs[M_ACT], theirs[M_NORM], theirs[M_CAUSAL], theirs[M_EPS],
                           theirs[M_MODEL]);
        return dm_fail(DM_ERR_INVALID_ARG, "the checkpoint's %s is %s, this run's %s: resuming continues the run "
                       "only with the options it was trained with (checkpoint: dropout %s, seed %s, batch %s, seq %s, "
                       "data %s, optimizer %s)", m == M_ADAMW ? "optimizer" : k_meta[m], theirs[m], mine[m], theirs[M_DROPOUT], theirs[M_SEED],
                       theirs[M_BATCH], theirs[M_SEQ], theirs[M_RUN], theirs[M_ADAMW]);
    }
    /* the schedule's kind: constant (total 0) or a decay; a decay may end at another update
     * (a run resumed for more steps: its decay stretched to the new end) */
    const int c0 = !strcmp(theirs[M_TOTAL], "0"), c1 = !strcmp(mine[M_TOTAL], "0");
    if (c0 != c1)
        return dm_fail(DM_ERR_INVALID_ARG, "the checkpoint's learning-rate schedule %s%s, this run's %s%s: resuming "
                       "continues the run only with the kind of schedule it was trained with (--lr-schedule as it "
                       "was)", c0 ? "is constant" : "decays until update ", c0 ? "" : theirs[M_TOTAL],
                       c1 ? "is constant" : "decays until update ", c1 ? "" : mine[M_TOTAL]);
    char *end;
    errno = 0;
    long long step = strtoll(theirs[M_STEP], &end, 10);
    if (*end || end == theirs[M_STEP] || errno == ERANGE || step < 0 || step > META_MAX_STEP)
        return dm_fail(DM_ERR_FORMAT, "the checkpoint's step '%s' is not a count (0 to 10^12)", theirs[M_STEP]);
    long long skipped = strtoll(theirs[M_SKIPPED], &end, 10);
    if (*end || end == theirs[M_SKIPPED] || errno == ERANGE || skipped < 0 || skipped > step)
        return dm_fail(DM_ERR_FORMAT, "the checkpoint's skipped steps '%s' are not a count up to its step %lld",
                       theirs[M_SKIPPED], step);
    for (int i = 0; i < ntensors(T); i++) {
        const dm_st_tensor *t = NULL;
        DM_TRY(find_checked(f, T, i / 3, i % 3, &t));
        data[i] = t->data;
        /* the values too: a checksum recomputed after an edit proves nothing about them */
        const int64_t bad = dm_st_first_bad(t, i % 3 == 2); /* second moments: also not negative */
        if (bad >= 0)
            return dm_fail(DM_ERR_FORMAT, "tensor '%s' element %" PRId64 " is not %s: the checkpoint is damaged, "
                           "or the run diverged before it was saved; nothing was loaded", t->name, bad,
                           i % 3 == 2 ? "a finite value of at least 0" : "finite");
    }
    const char *sum = dm_st_metadata(f, "checksum");
    char hex[32];
    snprintf(hex, sizeof hex, "%016" PRIx64, checksum_of(theirs, dm_st_metadata(f, "label_names"), T, data,
                                                   ckpt_version(dm_st_metadata(f, "version"))));
    /* the fuzzing build (tests/fuzz) reaches past the checksum: what it guards is checked too */
    if (!sum || (strcmp(sum, hex) != 0 && !DM_FUZZING_BUILD))
        return dm_fail(DM_ERR_FORMAT, "checksum mismatch (file says %s, its contents give %s): the checkpoint "
                       "is corrupted or was edited; nothing was loaded", sum ? sum : "(none)", hex);
    /* valid: now change the trainer */
    for (int i = 0; i < ntensors(T); i++) { /* with ZeRO, this rank's moments only */
        float *to = (float *)tensor_data(T, i / 3, i % 3);
        if (to) memcpy(to, data[i], (size_t)T->slot[i / 3].n * sizeof(float));
    }
    dm_trainer_state_restarted(T, step, skipped);
    return DM_OK;
}

/* Reads and validates the file, then `take` checks it against T and, if it fits, copies. */
static dm_status load_file(dm_trainer *T, const char *path,
                           dm_status (*take)(dm_trainer *, const dm_st_file *, int), int first, const char *what) {
    dm_st_file *f = NULL;
    dm_status s = dm_st_read(path, &f);
    if (s == DM_OK) s = take(T, f, first);
    dm_st_free(f);
    if (s != DM_OK) dm_fail_context(s, "%s '%s': ", what, path);
    return s;
}

static dm_status load_checked(dm_trainer *T, const dm_st_file *f, int first) {
    (void)first;
    const void **data = malloc((size_t)ntensors(T) * sizeof *data);
    if (!data) return dm_fail(DM_ERR_OOM, "out of memory reading the checkpoint");
    dm_status s = load_valid(T, f, data);
    free(data);
    return s;
}

dm_status dm_trainer_load(dm_trainer *T, const char *path) {
    if (!T || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_load: NULL argument");
    if (!T->moments) return dm_fail(DM_ERR_INVALID_ARG, "a forward-only trainer cannot resume a checkpoint");
    DM_TRY(load_file(T, path, load_checked, 0, "checkpoint"));
    return agree_state(T, "the checkpoint to resume (each rank reads its own copy)");
}

/* The file's tensor of layer l's parameter k: under any of the prefixes Hugging Face
 * models use (none: BertModel; "bert.": BertFor...; "0.auto_model.": a sentence-transformers
 * state dict; "model."), and a LayerNorm's weight and bias also under their TensorFlow-era
 * names gamma and beta (as the original BERT checkpoints store them; Hugging Face renames
 * them when loading). */
static const dm_st_tensor *find_param(const dm_st_file *f, int l, int k, char *name, size_t n) {
    const char *pn = dm_param_names[k];
    const size_t len = strlen(pn);
    char old[96] = "";
    if (len > 17 && !strcmp(pn + len - 17, ".LayerNorm.weight"))
        snprintf(old, sizeof old, "%.*s.LayerNorm.gamma", (int)(len - 17), pn);
    else if (len > 15 && !strcmp(pn + len - 15, ".LayerNorm.bias"))
        snprintf(old, sizeof old, "%.*s.LayerNorm.beta", (int)(len - 15), pn);
    static const char *const prefix[4] = {"", "bert.", "0.auto_model.", "model."};
    for (int v = 0; v < 2; v++)
        for (int p = 0; p < 4; p++) {
            if (v && !old[0]) break;
            char cand[200];
            snprintf(cand, sizeof cand, "%sencoder.layer.%d.%s", prefix[p], l, v ? old : pn);
            const dm_st_tensor *t = dm_st_find(f, cand);
            if (t) {
                snprintf(name, n, "%s", cand);
                return t;
            }
        }
    snprintf(name, n, "encoder.layer.%d.%s", l, pn);
    return NULL;
}

static dm_status load_params_checked(dm_trainer *T, const dm_st_file *f, int first) {
    char name[160];
    for (int l = 0; l < T->nlayers; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            const dm_st_tensor *t = find_param(f, first + l, k, name, sizeof name);
            if (!t) {
                int have = 0;
                while (have < 100000 && find_param(f, have, 0, name, sizeof name)) have++;
                if (first + T->nlayers > have && find_param(f, first + l - 1 >= 0 ? first + l - 1 : 0, 0, name,
                                                            sizeof name))
                    return dm_fail(DM_ERR_NOT_FOUND, "the file holds %d layer(s), and layers %d to %d were asked for "
                                   "(--layers %d from layer %d): use fewer layers or an earlier first one", have,
                                   first, first + T->nlayers - 1, T->nlayers, first);
                return dm_fail(DM_ERR_NOT_FOUND, "no tensor 'encoder.layer.%d.%s' (nor under 'bert.', "
                               "'0.auto_model.' or 'model.'): the file holds %d layer(s) under Hugging Face "
                               "BertEncoder names", first + l, dm_param_names[k], have);
            }
            const dm_train_slot *sl = &T->slot[l * DM_NUM_PARAMS + k];
            int fl = t->dtype == DM_ST_F32 || t->dtype == DM_ST_F16 || t->dtype == DM_ST_BF16 || t->dtype == DM_ST_F64;
            if (!fl)
                return dm_fail(DM_ERR_SHAPE, "'%s' is %s: parameters must be floating point", name,
                               dm_st_dtype_name(t->dtype));
            if (t->ndim != sl->ndim || t->shape[0] != sl->shape[0] || (sl->ndim == 2 && t->shape[1] != sl->shape[1])) {
                char got[96] = "(", want[64];
                for (int d = 0; d < t->ndim && d < 4; d++)
                    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? ", " : "", t->shape[d]);
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s)", t->ndim > 4 ? ", ..." : "");
                if (sl->ndim == 1) snprintf(want, sizeof want, "(%" PRId64 ")", sl->shape[0]);
                else snprintf(want, sizeof want, "(%" PRId64 ", %" PRId64 ")", sl->shape[0], sl->shape[1]);
                return dm_fail(DM_ERR_SHAPE, "'%s' has shape %s, this trainer needs %s: give the sizes of the model "
                               "(--hidden, --ffn, --heads)", name, got, want);
            }
            DM_TRY(dm_param_values_check(t, name));
        }
    for (int l = 0; l < T->nlayers; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            const dm_st_tensor *t = find_param(f, first + l, k, name, sizeof name);
            const dm_train_slot *sl = &T->slot[l * DM_NUM_PARAMS + k];
            DM_TRY(dm_st_to_f32(t, sl->p, (size_t)sl->n));
        }
    if (T->moments) memset(T->moments, 0, (size_t)T->mcount * 2 * sizeof(float));
    dm_trainer_state_restarted(T, 0, 0);
    return DM_OK;
}

dm_status dm_trainer_load_params(dm_trainer *T, const char *path) {
    return dm_trainer_load_layers(T, path, 0);
}

static dm_status load_layers(dm_trainer *T, const char *path, int first, int flags) {
    if (!T || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_load_layers: NULL argument");
    if (first < 0 || first > 100000)
        return dm_fail(DM_ERR_INVALID_ARG, "first layer %d: give 0 or more", first);
    if (!T->model) return load_file(T, path, load_params_checked, first, "parameters from");
    /* a whole BERT: every parameter by its Hugging Face name (hfload.c) */
    if (T->broken) return dm_trainer_broken(T);
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE)); /* a head parameter the file lacks keeps its value */
    DM_TRY(dm_model_load_path(T->model, path, first, flags, T->load_note, sizeof T->load_note));
    if (T->moments) memset(T->moments, 0, (size_t)T->mcount * 2 * sizeof(float));
    dm_trainer_state_restarted(T, 0, 0);
    return DM_OK;
}

dm_status dm_trainer_load_layers(dm_trainer *T, const char *path, int first) {
    DM_TRY(load_layers(T, path, first, 0));
    return agree_state(T, "the pretrained weights (each rank reads its own copy)");
}

dm_status dm_trainer_load_body(dm_trainer *T, const char *path, int first) {
    DM_TRY(load_layers(T, path, first, DM_LOAD_NEW_CLASSIFIER));
    return agree_state(T, "the pretrained weights (each rank reads its own copy)");
}

const char *dm_trainer_load_note(const dm_trainer *T) { return T ? T->load_note : "";
}

/* A JSON string of s (quotes, backslashes and control characters escaped). */
static void json_str(dm_sbuf *b, const char *s) {
    dm_sb_printf(b, "\"");
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        if (*q == '"' || *q == '\\') dm_sb_printf(b, "\\%c", *q);
        else if (*q < 0x20) dm_sb_printf(b, "\\u%04x", *q);
        else dm_sb_printf(b, "%c", *q);
    }
    dm_sb_printf(b, "\"");
}

/* A classifier's config.json text (b, dm_hf_config_text's) gets id2label and label2id
 * (transformers takes num_labels from them) and the problem type, before its last '}'. */
static void config_add_labels(const dm_model *m, dm_sbuf *b) {
    while (b->n > 0 && b->s && b->s[b->n - 1] != '}') b->s[--b->n] = 0;
    if (b->n > 0 && b->s) b->s[--b->n] = 0; /* the '}' */
    while (b->n > 0 && b->s && (b->s[b->n - 1] == '\n' || b->s[b->n - 1] == ' ')) b->s[--b->n] = 0;
    const int64_t C = m->c.sizes.classes;
    char def[32];
    for (int w = 0; w < 2; w++) {
        dm_sb_printf(b, w ? ",\n  \"label2id\": {" : ",\n  \"id2label\": {");
        for (int64_t k = 0; k < C; k++) {
            snprintf(def, sizeof def, "LABEL_%" PRId64, k);
            const char *name = m->label_names ? m->label_names[k] : def;
            dm_sb_printf(b, "%s\n    ", k ? "," : "");
            if (w) {
                json_str(b, name);
                dm_sb_printf(b, ": %" PRId64, k);
            } else {
                dm_sb_printf(b, "\"%" PRId64 "\": ", k);
                json_str(b, name);
            }
        }
        dm_sb_printf(b, "\n  }");
    }
    dm_sb_printf(b, ",\n  \"problem_type\": \"single_label_classification\"\n}\n");
}

static dm_status export_files(const dm_trainer *T, const char *dir);
static dm_status export_write(const dm_trainer *T, const char *dir, const char *path);

dm_status dm_trainer_export(const dm_trainer *T, const char *dir) {
    if (!T || !dir) return dm_fail(DM_ERR_INVALID_ARG, "dm_trainer_export: NULL argument");
    return on_rank0(T, dir, export_files);
}

static dm_status export_files(const dm_trainer *T, const char *dir) {
    if (!T->model)
        return dm_fail(DM_ERR_UNSUPPORTED, "export writes a whole BERT: this trainer is a stack of layers "
                       "(its checkpoint holds the layers under BertEncoder's names already)");
    if (T->broken) return dm_trainer_broken(T);
    DM_TRY(dm_trainer_pull(T, DM_PULL_STATE));
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    struct stat dsb;
    const int made = stat(dir, &dsb) != 0; /* a directory made here goes again if the export fails */
    DM_TRY(dm_make_parent(path));
    dm_status es = export_write(T, dir, path);
    if (es != DM_OK && made) { /* the directory made here goes, with the weights written into it */
        (void)unlink(path);
        (void)rmdir(dir);
    }
    return es;
}

/* export_files' writing, into dir (made), path its model.safetensors. */
static dm_status export_write(const dm_trainer *T, const char *dir, const char *path) {
    /* config.json's text made first, written (atomically) only once the weights are: a
     * failure making it or writing the weights leaves the directory as it was; a crash
     * between the two writes, or a failure of the second, leaves the new weights beside
     * the old config (in a directory made here, nothing) */
    const dm_model_config *mc = &T->model->c;
    dm_hf_config c;
    dm_hf_config_default(&c);
    c.vocab_size = mc->sizes.vocab;
    c.hidden_size = T->cfg.hidden;
    c.num_hidden_layers = T->nlayers;
    c.num_attention_heads = T->cfg.heads;
    c.intermediate_size = T->cfg.ffn;
    c.max_position_embeddings = mc->sizes.positions;
    c.type_vocab_size = mc->sizes.types;
    c.pad_token_id = mc->pad_id;
    c.layer_norm_eps = T->cfg.eps;
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = T->cfg.dropout;
    c.act = T->cfg.act;
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct stat sb; /* what would refuse the last write refuses the first */
    if (stat(cfg_path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return dm_fail(DM_ERR_IO, "'%s' is there and is no regular file: export writes its config.json there",
                       cfg_path);
    const int cls = T->model->c.head == DM_MODEL_HEAD_CLS;
    dm_sbuf cb = {0};
    DM_TRY(dm_hf_config_text(&c, cls ? "BertForSequenceClassification" : "BertForMaskedLM", &cb));
    if (cls) config_add_labels(T->model, &cb);
    const size_t cfg_len = cb.n;
    char *cfg_text = dm_sb_done(&cb);
    if (!cfg_text) return dm_fail(DM_ERR_OOM, "out of memory writing '%s'", cfg_path);
    /* the parameters alone, under BertForMaskedLM's (BertForSequenceClassification's) names;
     * the tied decoder is left out, as transformers' save_pretrained leaves it
     * (from_pretrained ties it again) */
    dm_st_writer *w = NULL;
    dm_status s = dm_st_writer_new(&w);
    if (s == DM_OK) s = dm_st_writer_set_metadata(w, "format", "pt");
    char name[192];
    for (int si = 0; s == DM_OK && si < T->nslots; si++) {
        const dm_train_slot *sl = &T->slot[si];
        tensor_name(T, name, sizeof name, si, 0);
        s = dm_st_writer_add(w, name, DM_ST_F32, sl->ndim, sl->shape, sl->p);
    }
    if (s == DM_OK) s = dm_st_writer_write(w, path);
    dm_st_writer_free(w);
    if (s != DM_OK) {
        free(cfg_text);
        return dm_fail_context(s, "writing '%s': ", path);
    }
    s = dm_write_file_atomic(cfg_path, cfg_text, cfg_len); /* then config.json */
    free(cfg_text);
    return s == DM_OK ? DM_OK : dm_fail_context(s, "writing '%s': ", cfg_path);
}

/* A whole number of the checkpoint's metadata, in [lo, hi]. */
static dm_status meta_int(const char v[M_N][META_LEN], int m, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v[m], &end, 10);
    if (*end || end == v[m] || errno == ERANGE || x < lo || x > hi)
        return dm_fail(DM_ERR_FORMAT, "the checkpoint's %s '%s' is not a number from %" PRId64 " to %" PRId64,
                       k_meta[m], v[m], lo, hi);
    *out = x;
    return DM_OK;
}

/* The architecture of a BERT checkpoint from its metadata: the layers' configuration (batch
 * 1: nothing runs), the number of layers and the model around them. */
static dm_status meta_model(const char v[M_N][META_LEN], dm_layer_config *c, int *layers, dm_bert_model *bm) {
    int64_t x[6] = {0, 0, 0, 0, 0, 0};
    DM_TRY(meta_int(v, M_LAYERS, 1, 256, &x[0]));
    DM_TRY(meta_int(v, M_HIDDEN, 1, INT64_C(1) << 20, &x[1]));
    DM_TRY(meta_int(v, M_HEADS, 1, INT64_C(1) << 16, &x[2]));
    DM_TRY(meta_int(v, M_FFN, 1, INT64_C(1) << 22, &x[3]));
    DM_TRY(meta_int(v, M_CAUSAL, 0, 1, &x[4]));
    DM_TRY(meta_int(v, M_SEQ, 1, INT64_C(1) << 24, &x[5]));
    dm_layer_config_default(c);
    c->batch = 1, c->seq = x[5], c->hidden = x[1], c->heads = x[2], c->ffn = x[3], c->causal = (int)x[4];
    *layers = (int)x[0];
    char *end;
    c->eps = strtod(v[M_EPS], &end);
    if (*end || end == v[M_EPS]) return dm_fail(DM_ERR_FORMAT, "the checkpoint's eps '%s' is not a number", v[M_EPS]);
    c->dropout = strtod(v[M_DROPOUT], &end);
    if (*end || end == v[M_DROPOUT])
        return dm_fail(DM_ERR_FORMAT, "the checkpoint's dropout '%s' is not a number", v[M_DROPOUT]);
    DM_TRY(dm_act_parse(v[M_ACT], &c->act));
    DM_TRY(dm_norm_parse(v[M_NORM], &c->norm));
    long long z[5], labels = 0;
    int used = 0, more = 0;
    const int got = sscanf(v[M_MODEL], "bert vocab=%lld positions=%lld types=%lld predictions=%lld pad=%lld%n",
                           &z[0], &z[1], &z[2], &z[3], &z[4], &used);
    if (got == 5 && v[M_MODEL][used] && /* a classifier's suffix (meta_values) */
        (sscanf(v[M_MODEL] + used, " head=classifier num_labels=%lld%n", &labels, &more) != 1 ||
         v[M_MODEL][used + more] || labels < 2 || labels > (1 << 20)))
        labels = -1;
    if (got != 5 || labels < 0)
        return dm_fail(DM_ERR_UNSUPPORTED, "the checkpoint's model is '%s': export writes a whole BertForMaskedLM or "
                       "BertForSequenceClassification, and this is a checkpoint of %s", v[M_MODEL],
                       !strcmp(v[M_MODEL], "-") ?
                       "a stack of layers (`dmove train`; its tensors are under BertEncoder's names already)" :
                       strncmp(v[M_MODEL], "bert ", 5) ? "an unknown model" : "a BERT with another head");
    *bm = (dm_bert_model){.vocab = z[0], .positions = z[1], .types = z[2], .pad_id = z[4], .predictions = 1,
                          .num_labels = labels};
    return dm_layer_config_check(c);
}

/* The checkpoint in f validated against T (built from its metadata), its parameters into T. */
static dm_status export_take(dm_trainer *T, const dm_st_file *f, const char theirs[M_N][META_LEN]) {
    const void **data = malloc((size_t)ntensors(T) * sizeof *data);
    if (!data) return dm_fail(DM_ERR_OOM, "out of memory reading the checkpoint");
    dm_status s = DM_OK;
    for (int i = 0; s == DM_OK && i < ntensors(T); i++) {
        const dm_st_tensor *t = NULL;
        s = find_checked(f, T, i / 3, i % 3, &t);
        if (s == DM_OK) data[i] = t->data;
    }
    char hex[32];
    const char *sum = dm_st_metadata(f, "checksum");
    if (s == DM_OK)
        snprintf(hex, sizeof hex, "%016" PRIx64, checksum_of(theirs, dm_st_metadata(f, "label_names"), T, data,
                                                             ckpt_version(dm_st_metadata(f, "version"))));
    if (s == DM_OK && (!sum || strcmp(sum, hex) != 0))
        s = dm_fail(DM_ERR_FORMAT, "checksum mismatch (file says %s, its contents give %s): the checkpoint is "
                    "corrupted or was edited; nothing was written", sum ? sum : "(none)", hex);
    for (int si = 0; s == DM_OK && si < T->nslots; si++)
        memcpy(T->slot[si].p, data[si * 3], (size_t)T->slot[si].n * sizeof(float));
    free(data);
    if (s == DM_OK) dm_trainer_state_replaced(T);
    return s;
}

/* A classifier checkpoint's class names (its "label_names", a JSON list of num_labels
 * strings; none: transformers' LABEL_k) into T. */
static dm_status take_label_names(dm_trainer *T, const char *json, int64_t num_labels) {
    if (!json) return DM_OK;
    cJSON *j = cJSON_Parse(json);
    const char **names = calloc((size_t)num_labels, sizeof *names);
    dm_status s = names ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK && (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != num_labels))
        s = dm_fail(DM_ERR_FORMAT, "the checkpoint's label_names is not a list of its %lld class names",
                    (long long)num_labels);
    for (int64_t k = 0; s == DM_OK && k < num_labels; k++) {
        const cJSON *x = cJSON_GetArrayItem(j, (int)k);
        if (!cJSON_IsString(x)) s = dm_fail(DM_ERR_FORMAT, "the checkpoint's label_names[%lld] is not a string", (long long)k);
        else names[k] = x->valuestring;
    }
    if (s == DM_OK) s = dm_trainer_set_label_names(T, names);
    free(names);
    cJSON_Delete(j);
    return s;
}

/* A checkpoint's model from its metadata: format and version checked. */
static dm_status checkpoint_model(const dm_st_file *f, char theirs[M_N][META_LEN], dm_layer_config *c, int *layers,
                                  dm_bert_model *bm) {
    const char *fmt = dm_st_metadata(f, "format"), *ver = dm_st_metadata(f, "version");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
        return dm_fail(DM_ERR_FORMAT, "not a dmove checkpoint (no \"format\": \"" CKPT_FORMAT "\" in its metadata)");
    if (!ckpt_version(ver))
        return dm_fail(DM_ERR_FORMAT, "checkpoint version '%s': this dmove reads versions 1 and " CKPT_VERSION,
                       ver ? ver : "(none)");
    for (int m = 0; m < M_N; m++) {
        const char *v = dm_st_metadata(f, k_meta[m]);
        if (!v) v = optional_default(m);
        if (!v) return dm_fail(DM_ERR_FORMAT, "the checkpoint's metadata has no '%s'", k_meta[m]);
        snprintf(theirs[m], META_LEN, "%s", v);
    }
    return meta_model(theirs, c, layers, bm);
}

dm_status dm_checkpoint_bert_sizes(const char *checkpoint, dm_bert_model *bm) {
    if (!checkpoint || !bm) return dm_fail(DM_ERR_INVALID_ARG, "dm_checkpoint_bert_sizes: NULL argument");
    dm_st_file *f = NULL;
    dm_status s = dm_st_read_header(checkpoint, &f);
    char theirs[M_N][META_LEN];
    dm_layer_config c;
    int layers;
    if (s == DM_OK) s = checkpoint_model(f, theirs, &c, &layers, bm);
    dm_st_free(f);
    if (s != DM_OK) dm_fail_context(s, "checkpoint '%s': ", checkpoint);
    return s;
}

static dm_status checkpoint_export(const dm_st_file *f, const char *dir) {
    char theirs[M_N][META_LEN];
    dm_layer_config c;
    int layers;
    dm_bert_model bm;
    DM_TRY(checkpoint_model(f, theirs, &c, &layers, &bm));
    dm_trainer *T = NULL;
    dm_layer_options o = {0};
    dm_status s = dm_trainer_new_bert(&T, &c, layers, &bm, &o, NULL);
    if (s == DM_OK) s = export_take(T, f, theirs);
    if (s == DM_OK && bm.num_labels) s = take_label_names(T, dm_st_metadata(f, "label_names"), bm.num_labels);
    if (s == DM_OK) s = dm_trainer_export(T, dir);
    dm_trainer_free(T);
    return s;
}

dm_status dm_checkpoint_export(const char *checkpoint, const char *dir) {
    if (!checkpoint || !dir) return dm_fail(DM_ERR_INVALID_ARG, "dm_checkpoint_export: NULL argument");
    dm_st_file *f = NULL;
    dm_status s = dm_st_read(checkpoint, &f);
    if (s == DM_OK) s = checkpoint_export(f, dir);
    dm_st_free(f);
    if (s != DM_OK) dm_fail_context(s, "exporting checkpoint '%s': ", checkpoint);
    return s;
}
