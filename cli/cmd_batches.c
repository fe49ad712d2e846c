/* cmd_batches.c: `dmove batches`: the masked-LM batches the loader makes of a dataset,
 * shown decoded (--show: masked positions with their original token) or timed (--bench:
 * batches/s, and the time a training step would wait for data). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_common.h"
#include "dmove_data.h"
#include "dmove_text.h"

static const char *const CMD = "batches";

typedef struct {
    const char *data, *tokenizer, *split;
    int lowercase, cased, pairs, nsp, show, prefetch, no_shuffle;
    int64_t seq, batch, bench, start;
    uint64_t seed;
    double mask_prob, step_ms;
} batches_opts;


static void init(void *p) {
    batches_opts *o = p;
    dm_loader_config c;
    dm_loader_config_default(&c);
    o->seq = c.seq;
    o->batch = 8;
    o->seed = c.seed;
    o->mask_prob = c.mask_prob;
    o->prefetch = c.prefetch;
    o->split = "train";
}

#define O(field) .off = offsetof(batches_opts, field)
static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--data", .arg = "DIR", O(data), .help = "a dataset directory from dmove prepare (required)"},
    {.kind = CLI_STR, .name = "--split", .arg = "S", O(split), .help = "train or valid (default {})"},
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", O(tokenizer),
     .help = "the model's tokenizer (required): the data must have been\n"
             "made with the same vocabulary"},
    {.kind = CLI_FLAG, .name = "--lowercase", O(lowercase), .lo = 1, .left = "--lowercase, --cased",
     .help = "for a vocab.txt, as dmove prepare"},
    {.kind = CLI_FLAG, .name = "--cased", O(cased), .lo = 1},
    {.kind = CLI_I64, .name = "--seq", .arg = "J", O(seq), .lo = 1, .hi = 1 << 20,
     .help = "sequence length j, with [CLS] and [SEP] (default {})"},
    {.kind = CLI_I64, .name = "--batch", .arg = "B", O(batch), .lo = 1, .hi = 1 << 20, .help = "sequences a batch (default {})"},
    {.kind = CLI_U64, .name = "--seed", .arg = "S", O(seed), .help = "shuffle and masking seed (default {})"},
    {.kind = CLI_FLAG, .name = "--pairs", O(pairs), .lo = 1,
     .help = "[CLS] A [SEP] B [SEP] with segment ids (default: sentences\n"
             "packed up to j, [SEP] between documents)"},
    {.kind = CLI_FLAG, .name = "--nsp", O(nsp), .lo = 1,
     .help = "with --pairs: B from another document half of the time,\n"
             "and next-sentence labels"},
    {.kind = CLI_DOUBLE, .name = "--mask-prob", .arg = "P", O(mask_prob),
     .help = "the fraction of tokens chosen for masking (default {});\n"
             "of those 80%% [MASK], 10%% a random token, 10%% unchanged"},
    {.kind = CLI_FLAG, .name = "--no-shuffle", O(no_shuffle), .lo = 1, .help = "sequences in file order"},
    {.kind = CLI_I64, .name = "--start", .arg = "K", O(start), .lo = 0, .hi = INT64_C(1) << 40,
     .help = "begin at batch K (what a run resumed at step K sees)"},
    {.kind = CLI_INT, .name = "--show", .arg = "N", O(show), .lo = 0, .hi = 1 << 20,
     .help = "print N sequences decoded: [MASK]{dog} a masked 'dog',\n"
             "cat{dog} 'dog' replaced by 'cat', dog{=} chosen and kept;\n"
             "pads as a count (default 2 without --bench)"},
    {.kind = CLI_I64, .name = "--bench", .arg = "STEPS", O(bench), .lo = 0, .hi = INT64_C(1) << 30,
     .help = "time STEPS batches: batches/s, and the time next() waited"},
    {.kind = CLI_DOUBLE, .name = "--step-ms", .arg = "MS", O(step_ms),
     .help = "with --bench: pretend each training step takes MS ms (the\n"
             "wait should then be about zero)"},
    {.kind = CLI_INT, .name = "--prefetch", .arg = "N", O(prefetch), .lo = 0, .hi = 256,
     .help = "batches the background thread keeps ready (default {};\n"
             "0: built in next())"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};
#undef O

static const cli_command k_batches = {
    .name = "batches",
    .head = "usage: dmove batches --data DIR --tokenizer FILE [options]\n"
            "\n"
            "Makes masked-language-model batches of a dataset as the trainer does and shows\n"
            "them decoded, or times them. Batch k depends only on the data, the options and\n"
            "k (Philox keyed on the seed, the epoch and the sequence).\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove batches --data data --tokenizer vocab.txt --lowercase --show 3 --seq 64\n"
            "  dmove batches --data data --tokenizer tokenizer.json --pairs --nsp --show 2\n"
            "  dmove batches --data data --tokenizer tokenizer.json --seq 512 --batch 32 \\\n"
            "      --bench 200 --step-ms 50\n",
    .options = k_options,
    .hint = "",
    .size = sizeof(batches_opts),
    .init = init,
};

/* A token, a "##" continuation glued to a plain word piece before it (*first: 1 at a
 * line's start, 2 after a special or marked token, 0 after a word piece). */
static void put_token(const dm_tokenizer *t, const dm_special_ids *sp, int32_t id, int *first) {
    const char *s = dm_tokenizer_token(t, id);
    if (!s) s = "?";
    int glue = *first == 0 && !strncmp(s, "##", 2) && s[2];
    printf("%s%s", *first == 1 || glue ? "" : " ", glue ? s + 2 : s);
    int special = id == sp->pad || id == sp->unk || id == sp->cls || id == sp->sep || id == sp->mask;
    *first = special ? 2 : 0;
}

/* Row i of b decoded on a few lines. */
static void show_row(const dm_tokenizer *t, const dm_special_ids *sp, const dm_batch *b, int64_t i) {
    const int64_t J = b->seq;
    const int32_t *ids = b->input_ids + i * J, *lab = b->labels + i * J, *tt = b->token_type_ids + i * J;
    int64_t n = 0, masked = 0;
    while (n < J && b->attention_mask[i * J + n]) n++;
    for (int64_t k = 0; k < n; k++) masked += lab[k] != -100;
    printf("batch %" PRId64 ", row %" PRId64 ": sequence %" PRId64 " of epoch %" PRId64 ", %" PRId64
           " tokens, %" PRId64 " chosen", b->step, i, b->sequence[i], b->epoch[i], n, masked);
    if (b->nsp_labels[i] != -100) printf(", nsp %d (%s)", b->nsp_labels[i], b->nsp_labels[i] ? "B random" : "B follows A");
    printf("\n  ");
    int first = 1, seg = 0;
    for (int64_t k = 0; k < n; k++) {
        if (tt[k] != seg) {
            printf("\n  ");
            seg = tt[k];
            first = 1;
        }
        if (lab[k] == -100) {
            put_token(t, sp, ids[k], &first);
            continue;
        }
        const char *shown = ids[k] == lab[k] ? NULL : dm_tokenizer_token(t, ids[k]);
        const char *orig = dm_tokenizer_token(t, lab[k]);
        printf("%s%s{%s}", first == 1 ? "" : " ", shown ? shown : (orig ? orig : "?"), shown ? (orig ? orig : "?") : "=");
        first = 2;
    }
    if (n < J) printf(" [PAD]x%" PRId64, J - n);
    printf("\n");
}

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms * 1e6) % 1000000000L};
    nanosleep(&ts, NULL);
}

static int run_bench(dm_loader *l, const batches_opts *o, const dm_batch **b) {
    double t0 = cli_now(), w0 = dm_loader_wait_seconds(l);
    int64_t tokens = 0, masked = 0;
    for (int64_t k = 0; k < o->bench; k++) {
        if (dm_loader_next(l, b) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return CLI_FAIL;
        }
        tokens += (*b)->tokens;
        masked += (*b)->masked;
        sleep_ms(o->step_ms);
    }
    double dt = cli_now() - t0, wait = dm_loader_wait_seconds(l) - w0;
    char cpu[128];
    dm_cpu_model_name(cpu, sizeof cpu, "unknown CPU");
    printf("bench: %" PRId64 " batches of %" PRId64 " x %" PRId64 " in %.3f s: %.1f batches/s, %.2f M real "
           "tokens/s, %.1f%% chosen for masking (%s, prefetch %d, step %g ms)\n", o->bench, o->batch, o->seq, dt,
           (double)o->bench / dt, (double)tokens / dt / 1e6, tokens ? 100.0 * (double)masked / (double)tokens : 0.0,
           cpu, o->prefetch, o->step_ms);
    printf("  next() waited %.3f s in all, %.3f ms a batch (%.2f%% of the run)\n", wait,
           1e3 * wait / (double)o->bench, 100 * wait / dt);
    return CLI_OK;
}

int cmd_batches(int argc, char **argv) {
    batches_opts o;
    int rc = cli_parse(&k_batches, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (!o.data) return (cli_usage_error(CMD, "--data DIR is required"), CLI_USAGE);
    if (strcmp(o.split, "train") && strcmp(o.split, "valid"))
        return (cli_usage_error(CMD, "--split %s: give train or valid", o.split), CLI_USAGE);
    if (o.nsp && !o.pairs) return (cli_usage_error(CMD, "--nsp needs --pairs"), CLI_USAGE);
    if (!(o.mask_prob >= 0 && o.mask_prob <= 1))
        return (cli_usage_error(CMD, "--mask-prob %g: give a value in [0, 1]", o.mask_prob), CLI_USAGE);
    if (!(o.step_ms >= 0 && o.step_ms <= 1e6))
        return (cli_usage_error(CMD, "--step-ms %g: give a value in [0, 1e6]", o.step_ms), CLI_USAGE);
    int jmin = o.pairs ? 5 : 3;
    if (o.seq < jmin)
        return (cli_usage_error(CMD, "--seq %" PRId64 " is too small for the special tokens: %s needs at least %d",
                                o.seq, o.pairs ? "[CLS] A [SEP] B [SEP]" : "[CLS] tokens [SEP]", jmin), CLI_USAGE);
    int show = o.show ? o.show : (o.bench ? 0 : 2);
    dm_tokenizer *t = NULL;
    rc = cli_open_tokenizer(CMD, o.tokenizer, o.lowercase, o.cased, &t);
    if (rc != CLI_OK) return rc;
    dm_vocab_info v;
    dm_loader *l = NULL;
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    cfg.batch = o.batch;
    cfg.seq = o.seq;
    cfg.seed = o.seed;
    cfg.mode = o.pairs ? DM_SEQ_PAIRS : DM_SEQ_PACKED;
    cfg.nsp = o.nsp;
    cfg.shuffle = !o.no_shuffle;
    cfg.mask_prob = o.mask_prob;
    cfg.prefetch = o.prefetch;
    cfg.start_step = o.start;
    if (dm_vocab_info_from(t, &v) != DM_OK || dm_loader_open(&l, o.data, o.split, &v, &cfg) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        dm_tokenizer_free(t);
        return CLI_FAIL;
    }
    const dm_batch *b = NULL;
    rc = CLI_OK;
    printf("%s split of %s: %" PRId64 " sequences an epoch (%s, j = %" PRId64 ")\n", o.split, o.data,
           dm_loader_sequences(l), o.pairs ? (o.nsp ? "pairs with NSP" : "pairs") : "packed sentences", o.seq);
    for (int shown = 0; shown < show && rc == CLI_OK;) {
        if (dm_loader_next(l, &b) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            rc = CLI_FAIL;
            break;
        }
        for (int64_t i = 0; i < b->batch && shown < show; i++, shown++) show_row(t, &v.special, b, i);
    }
    if (rc == CLI_OK && o.bench > 0) rc = run_bench(l, &o, &b);
    dm_loader_free(l);
    dm_tokenizer_free(t);
    if (rc == CLI_OK && fflush(stdout) != 0) rc = CLI_FAIL;
    return rc;
}
