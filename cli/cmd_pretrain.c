/* cmd_pretrain.c: `dmove pretrain`: masked-language-model pretraining of a whole BERT
 * (BertForMaskedLM: embeddings, encoder layers, MLM head) from the token shards of
 * `dmove prepare`, with the loader's masked batches, evaluation on the held-out split,
 * progress, a summary (the time the step waited for data among it) and a loss chart. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "dmove_data.h"
#include "dmove_text.h"

static const char *const CMD = "pretrain";

#define TRY(expr)                                                                      \
    do {                                                                               \
        dm_status try_s_ = (expr);                                                     \
        if (try_s_ != DM_OK) return try_s_;                                            \
    } while (0)

typedef struct {
    const char *data, *tokenizer, *config, *svg, *save, *resume, *export_dir, *init;
    int lowercase, cased, layers, layers_set, json, pairs, prefetch, positions_set, types_set, xent, layers_from;
    int no_unpad;
    int64_t steps, eval_every, eval_batches, log_every, positions, types, predictions, save_every, until;
    double mask_prob;
    cli_optim opt;
    cli_config c;
    cli_device dev;
    char init_dir[4096]; /* the tokenizer's place when --tokenizer is not given: --init's */
} pretrain_opts;

static void init(void *p) {
    pretrain_opts *o = p;
    o->layers = 4;
    o->steps = 100;
    o->eval_every = -1; /* not given: about 10 times a run (0 given: at the end only) */
    o->eval_batches = 8;
    o->positions = 512;
    o->types = 2;
    o->mask_prob = 0.15;
    o->prefetch = 4;
    cli_optim_init(&o->opt);
    o->opt.optim.clip_norm = 1.0;
    cli_config_init(&o->c, CLI_CFG_ALL & ~CLI_CFG_ARCH);
}

static const cli_choice k_xent_modes[] = {
    {"auto", DM_XENT_AUTO}, {"on", DM_XENT_FUSED}, {"off", DM_XENT_UNFUSED}, {NULL, 0}};

#define O(field) .off = offsetof(pretrain_opts, field)
#define I64(nm, a, field, min, h) {.kind = CLI_I64, .name = nm, .arg = a, O(field), .lo = min, .hi = INT64_C(1000000000), .help = h}
static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--data", .arg = "DIR", O(data),
     .help = "a dataset from `dmove prepare` (required): its train split\n"
             "trains, its valid split (if any) evaluates"},
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", O(tokenizer),
     .help = "the tokenizer the data was made with (default with --init:\n"
             "its directory's; else required; a vocab.txt\n"
             "with --lowercase or --cased, or a model's directory)"},
    {.kind = CLI_FLAG, .name = "--lowercase", O(lowercase), .lo = 1, .left = "--lowercase, --cased",
     .help = "how a vocab.txt normalizes, as for dmove prepare"},
    {.kind = CLI_FLAG, .name = "--cased", O(cased), .lo = 1},
    {.kind = CLI_PATH, .name = "--config", .arg = "FILE", O(config),
     .help = "a Hugging Face config.json: the model's sizes from it (its\n"
             "vocabulary must be the tokenizer's); else the options below"},
    {.kind = CLI_PATH, .name = "--init", .arg = "PATH", O(init),
     .help = "start from a pretrained BERT: a Hugging Face model directory\n"
             "(config.json, model.safetensors) or its model.safetensors\n"
             "(config.json beside it): the sizes from its config, every\n"
             "parameter from the file (bert.*, none, 0.auto_model. or\n"
             "model. prefixes); an MLM head it lacks (a BertModel) starts\n"
             "at BERT's initialisation, and is listed"},
    {.kind = CLI_INT, .name = "--layers-from", .arg = "N", O(layers_from), .lo = 0, .hi = 4095,
     .help = "with --init: the encoder takes the model's layers N, N+1, ...\n"
             "(default {}; --layers of them, default all the rest)"},
    {.kind = CLI_INT, .name = "--layers", .arg = "L", O(layers), .set = offsetof(pretrain_opts, layers_set) + 1,
     .lo = 1, .hi = 256, .help = "encoder layers (default {}; BERT-base 12)"},
    {.kind = CLI_I64, .name = "--positions", .arg = "P", O(positions), .set = offsetof(pretrain_opts, positions_set) + 1,
     .lo = 1, .hi = INT64_C(1) << 24, .help = "position embeddings (default {}, at least --seq)"},
    {.kind = CLI_I64, .name = "--types", .arg = "T", O(types), .set = offsetof(pretrain_opts, types_set) + 1, .lo = 1,
     .hi = 1 << 16, .help = "token types (default {})"},
    I64("--predictions", "M", predictions, 0,
        "masked positions scored per batch, ceil(M / b) at most in\n"
        "each sequence (default: b * ceil(j / 5); more in a sequence\n"
        "are left out, and counted)"),
    {.kind = CLI_CHOICE, .name = "--fused-xent", .arg = "X", O(xent), .choices = k_xent_modes,
     .msg = "--fused-xent: '%s' is not auto, on or off",
     .help = "the MLM head's decoder and cross-entropy as one operator that\n"
             "never writes the logits whole (on: less memory, one more\n"
             "GEMM), apart (off), or auto (default: the faster, off)"},
    I64("--steps", "N", steps, 1, "updates (default {})"),
    CLI_OPTIM(pretrain_opts, opt),
    {.kind = CLI_DOUBLE, .name = "--mask-prob", .arg = "P", O(mask_prob),
     .help = "the fraction of tokens chosen for masking (default {}; of\n"
             "those 80%% [MASK], 10%% a random token, 10%% kept)"},
    {.kind = CLI_FLAG, .name = "--pairs", O(pairs), .lo = 1,
     .help = "[CLS] A [SEP] B [SEP] with token types (default: sentences\n"
             "packed up to j)"},
    I64("--eval-every", "K", eval_every, 0, "evaluate on the valid split every K steps (default:\n"
                                           "about 10 times a run; 0: at the end only)"),
    I64("--eval-batches", "E", eval_batches, 1, "held-out batches an evaluation takes (default {})"),
    I64("--log-every", "K", log_every, 1, "a progress line every K steps (default: about 15 lines)"),
    {.kind = CLI_INT, .name = "--prefetch", .arg = "N", O(prefetch), .lo = 0, .hi = 256,
     .help = "batches the loader's thread keeps ready (default {})"},
    {.kind = CLI_STR, .name = "--save", .arg = "FILE", O(save),
     .help = "write a checkpoint at the end (atomically; also every\n"
             "--save-every K steps, and on Ctrl-C: the step under way\n"
             "ends, the checkpoint is written, the exit status is 130)"},
    I64("--save-every", "K", save_every, 1, "checkpoint every K steps as well (needs --save)"),
    {.kind = CLI_STR, .name = "--resume", .arg = "FILE", O(resume),
     .help = "continue a run from its checkpoint: with the same options,\n"
             "the same batches and the same result as an uninterrupted run"},
    I64("--until", "K", until, 1, "stop after step K this time (the schedule still runs to\n"
                                  "--steps), to train a long run in parts"),
    {.kind = CLI_PATH, .name = "--export", .arg = "DIR", O(export_dir),
     .help = "at the end, write DIR/model.safetensors and DIR/config.json\n"
             "as transformers saves a BertForMaskedLM (from_pretrained(DIR)\n"
             "loads it; the optimizer's state stays in --save's checkpoint)"},
    {.kind = CLI_STR, .name = "--svg", .arg = "FILE", O(svg), .help = "draw the run as an SVG chart: the training and\n"
     "held-out loss over the masked-token accuracy, by step"},
    {.kind = CLI_FLAG, .name = "--no-unpad", O(no_unpad), .lo = 1,
     .help = "run the padding too: by default the encoder layers work on\n"
             "each batch's real tokens alone (its attention masks' 1s),\n"
             "packed, and attention over each sequence's own length"},
    {.kind = CLI_FLAG, .name = "--json", O(json), .lo = 1, .help = "print one JSON object at the end"},
    CLI_CONFIG(pretrain_opts, c, CLI_CFG_ALL & ~CLI_CFG_ARCH),
    CLI_DEVICE(pretrain_opts, dev),
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};
#undef O
#undef I64

static const cli_command k_pretrain = {
    .name = "pretrain",
    .head = "usage: dmove pretrain --data DIR (--tokenizer FILE | --init DIR) [options]\n"
            "\n"
            "Pretrains a whole BERT (Hugging Face BertForMaskedLM: embeddings, encoder\n"
            "layers, the MLM head with its decoder tied to the word embeddings) with masked\n"
            "language modelling on the shards of `dmove prepare`: the loader's batches (15%%\n"
            "of the tokens chosen, 80/10/10), the cross-entropy at the masked positions only,\n"
            "AdamW or LAMB. Every step is dmove's fused training step, on the CPU (the GPU's\n"
            "kernels for the embeddings and the head come next). Progress shows the loss, the\n"
            "masked-token accuracy and the rate; held-out loss and accuracy come from the\n"
            "dataset's valid split, without dropout. A checkpoint (--save) holds the model\n"
            "under BertForMaskedLM's names and the optimizer's state; --resume continues it\n"
            "bit-identically.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "example (a small BERT on a text file):\n"
            "  dmove prepare --tokenizer tokenizer.json --out data --valid-fraction 0.05 corpus.txt\n"
            "  dmove pretrain --data data --tokenizer tokenizer.json --layers 4 --hidden 256 \\\n"
            "      --heads 4 --ffn 1024 --seq 128 --batch 16 --steps 2000 --lr 5e-4 \\\n"
            "      --warmup 200 --lr-schedule linear --svg loss.svg\n",
    .options = k_options,
    .hint = "",
    .size = sizeof(pretrain_opts),
    .init = init,
};

static int fail_dm(const char *what) { return cli_fail_dm(CMD, what); }

/* One run's state. */
typedef struct {
    pretrain_opts o;
    dm_tokenizer *tok;
    dm_vocab_info vocab;
    dm_loader *train, *valid;
    dm_batch vb;           /* a held-out batch */
    dm_trainer *T;
    dm_dist *dist;         /* the ranks of an MPI launch (alone: one) */
    dm_bert_model bm;
    char init_config[4096]; /* --init's config.json */
    float *maskf;          /* the batch's attention mask as floats */
    double *losses, *accs;  /* per step of this run: training loss, masked-token accuracy */
    double *step_s;         /* each step's wall seconds (--json: their median) */
    int64_t *eval_steps;    /* the held-out evaluations: steps, */
    double *eval_losses, *eval_accs; /* losses and accuracies */
    int64_t neval, eval_cap;
    int64_t start, stop, ran, tokens, scored, correct, skips, skips0, dropped;
    double t_total, eval_loss, eval_acc;
    int evaluated;         /* an evaluation ran */
} pretrain_run;

/* --config (or --init's config.json): the sizes of a Hugging Face config, an option that contradicts it refused. */
static int apply_config(pretrain_run *r) {
    pretrain_opts *o = &r->o;
    const char *opt = o->init ? "--init" : "--config";
    dm_hf_config hc; /* with --init, its tensors against it before a model of its sizes is made */
    if (dm_hf_config_read(o->config, &hc) != DM_OK || (o->init && dm_hf_check_weights(&hc, o->init) != DM_OK)) {
        cli_error(CMD, "%s: %s", opt, dm_last_error());
        return CLI_FAIL;
    }
    if (hc.vocab_size != r->vocab.vocab_size) {
        cli_error(CMD, "%s: vocab_size %" PRId64 ", but the tokenizer has %d tokens: use the tokenizer the "
                  "model was made for", opt, hc.vocab_size, r->vocab.vocab_size);
        return CLI_FAIL;
    }
    if (!hc.tie_word_embeddings && !o->init) { /* --init: the file's decoder decides (hfload.c) */
        cli_error(CMD, "--config: tie_word_embeddings is false, and dmove's MLM head ties its decoder to the word "
                  "embeddings (as BERT's): set it true, or leave it out, to pretrain that model");
        return CLI_FAIL;
    }
    int rc = cli_config_from_hf(&o->c, CMD, opt, o->config, &hc);
    if (rc) return rc;
    if (o->layers_from >= hc.num_hidden_layers) {
        cli_usage_error(CMD, "--layers-from %d: the model has layers 0 to %" PRId64, o->layers_from,
                        hc.num_hidden_layers - 1);
        return CLI_USAGE;
    }
    if (o->layers_set && (o->init ? o->layers_from + o->layers > hc.num_hidden_layers
                                  : o->layers != hc.num_hidden_layers)) {
        cli_usage_error(CMD, "--layers %d%s contradicts %s (num_hidden_layers %" PRId64 ")", o->layers,
                        o->layers_from ? " from --layers-from" : "", o->config, hc.num_hidden_layers);
        return CLI_USAGE;
    }
    if ((o->positions_set && o->positions != hc.max_position_embeddings) ||
        (o->types_set && o->types != hc.type_vocab_size)) {
        cli_usage_error(CMD, "--positions or --types contradicts %s (max_position_embeddings %" PRId64
                        ", type_vocab_size %" PRId64 "): leave them out", o->config, hc.max_position_embeddings,
                        hc.type_vocab_size);
        return CLI_USAGE;
    }
    if (hc.pad_token_id != r->vocab.special.pad) {
        cli_error(CMD, "%s: pad_token_id %" PRId64 ", but the tokenizer's [PAD] is %d: use the tokenizer the "
                  "model was made for", opt, hc.pad_token_id, r->vocab.special.pad);
        return CLI_FAIL;
    }
    if (!o->layers_set) o->layers = (int)(hc.num_hidden_layers - o->layers_from);
    o->positions = hc.max_position_embeddings;
    o->types = hc.type_vocab_size;
    return 0;
}

/* --init: its config.json gives the sizes (as --config would); the weights come after the
 * trainer is made. */
static int init_files(pretrain_run *r) {
    pretrain_opts *o = &r->o;
    if (o->config || o->resume) {
        cli_usage_error(CMD, "--init with %s: %s", o->config ? "--config" : "--resume",
                        o->config ? "the model's own config.json gives the sizes" :
                        "both give the starting parameters (a checkpoint resumes its run)");
        return CLI_USAGE;
    }
    char weights[4096];
    if (dm_hf_model_files(o->init, weights, sizeof weights, r->init_config, sizeof r->init_config) != DM_OK)
        return fail_dm("--init: ");
    if (!r->init_config[0]) {
        cli_error(CMD, "--init %s: no config.json beside the weights: the model's sizes are read from it", o->init);
        return CLI_FAIL;
    }
    o->config = r->init_config;
    return 0;
}

static dm_status open_loaders(pretrain_run *r, const dm_layer_config *cfg) {
    dm_loader_config lc;
    dm_loader_config_default(&lc);
    lc.batch = cfg->batch, lc.seq = cfg->seq, lc.seed = cfg->seed;
    lc.mode = r->o.pairs ? DM_SEQ_PAIRS : DM_SEQ_PACKED;
    lc.mask_prob = r->o.mask_prob;
    lc.prefetch = r->o.prefetch;
    lc.part = dm_dist_rank(r->dist), lc.parts = dm_dist_size(r->dist); /* this rank's share of each batch */
    TRY(dm_loader_open(&r->train, r->o.data, "train", &r->vocab, &lc));
    dm_dataset *d = NULL;
    TRY(dm_dataset_open(&d, r->o.data));
    const size_t nv = dm_dataset_shard_count(d, "valid");
    dm_dataset_free(d);
    /* every rank the same data: the evaluations are collectives too */
    char id[200];
    snprintf(id, sizeof id, "%" PRId64 " sequences an epoch, vocabulary %016" PRIx64 ", %zu held-out shards, "
             "token data %016" PRIx64, dm_loader_sequences(r->train), r->vocab.hash, nv,
             dm_loader_fingerprint(r->train));
    TRY(dm_dist_agree(r->dist, "the training data", id));
    if (!nv) return DM_OK;
    lc.prefetch = 0;
    lc.seed = cfg->seed ^ 0x5eedull; /* a fixed held-out set: batches 0 .. E-1 */
    TRY(dm_loader_open(&r->valid, r->o.data, "valid", &r->vocab, &lc));
    return dm_batch_alloc(&r->vb, cfg->batch, cfg->seq);
}

static dm_status feed(pretrain_run *r, const dm_batch *b) {
    const int64_t n = b->batch * b->seq;
    for (int64_t k = 0; k < n; k++) r->maskf[k] = (float)b->attention_mask[k];
    return dm_trainer_set_mlm_batch(r->T, b->input_ids, b->token_type_ids, r->maskf, b->labels);
}

/* The held-out loss and masked-token accuracy over --eval-batches batches. */
static dm_status evaluate(pretrain_run *r) {
    double sum = 0;
    int64_t scored = 0, correct = 0;
    for (int64_t k = 0; k < r->o.eval_batches; k++) {
        TRY(dm_loader_batch_at(r->valid, k, &r->vb));
        TRY(feed(r, &r->vb));
        double l = 0;
        dm_mlm_stats st;
        TRY(dm_trainer_evaluate(r->T, &l));
        TRY(dm_trainer_mlm_stats(r->T, &st));
        sum += l * (double)st.scored;
        scored += st.scored, correct += st.correct;
    }
    r->eval_loss = scored ? sum / (double)scored : 0.0;
    r->eval_acc = scored ? (double)correct / (double)scored : 0.0;
    r->evaluated = scored > 0;
    return DM_OK;
}

/* Step s: its micro-batches and the update; the step's loss is the mean over all their
 * scored positions (each micro-batch's mean weighed by its count: one batch's mean). */
static dm_status one_step(pretrain_run *r, int64_t s, double *loss) {
    const int k = r->o.opt.optim.accumulate;
    double sum = 0.0, plain = 0.0;
    int64_t scored = 0;
    *loss = 0;
    for (int m = 0; m < k; m++) {
        const dm_batch *b;
        TRY(dm_loader_next(r->train, &b));
        TRY(feed(r, b));
        double l = 0;
        dm_mlm_stats st;
        TRY(dm_trainer_step(r->T, &l));
        TRY(dm_trainer_mlm_stats(r->T, &st));
        sum += l * (double)st.scored, scored += st.scored, plain += l / k;
        r->tokens += b->tokens;
        r->scored += st.scored, r->correct += st.correct, r->dropped += st.dropped;
    }
    *loss = scored ? sum / (double)scored : plain;
    (void)s;
    return DM_OK;
}

static int setup(pretrain_run *r) {
    pretrain_opts *o = &r->o;
    if (!o->data || (!o->tokenizer && !o->init)) {
        cli_usage_error(CMD, "--data DIR and --tokenizer FILE are required (or --init DIR: its tokenizer)");
        return CLI_USAGE;
    }
    const cli_path reads[5] = {{.opt = "--data", .path = o->data, .dir = 1},
                               {.opt = "--tokenizer", .path = o->tokenizer},
                               {.opt = "--config", .path = o->config},
                               {.opt = "--resume", .path = o->resume, .same_ok = "--save"},
                               {.opt = "--init", .path = o->init, .dir = 1}};
    const cli_path writes[3] = {{.opt = "--save", .path = o->save},
                                {.opt = "--svg", .path = o->svg},
                                {.opt = "--export", .path = o->export_dir, .dir = 1}};
    int rc = cli_check_paths(CMD, reads, 5, writes, 3);
    if (rc) return rc;
    if (!o->tokenizer && !(o->tokenizer = cli_init_tokenizer(o->init, o->init_dir, sizeof o->init_dir))) {
        cli_error(CMD, "--init %s: %s", o->init, strerror(errno));
        return CLI_FAIL;
    }
    const dm_layer_options chk = cli_device_layer_options(&o->dev, o->c.threads, !o->no_unpad);
    if (cli_options_check(CMD, &chk)) return CLI_USAGE; /* before the data is read */
    rc = cli_open_tokenizer(CMD, o->tokenizer, o->lowercase, o->cased, &r->tok);
    if (rc != CLI_OK) return rc;
    if (dm_vocab_info_from(r->tok, &r->vocab) != DM_OK) return fail_dm("--tokenizer: ");
    if (o->init && (rc = init_files(r)) != 0) return rc;
    if (o->config && (rc = apply_config(r)) != 0) return rc;
    if (o->layers_from && !o->init) {
        cli_usage_error(CMD, "--layers-from picks layers of a pretrained model: it needs --init");
        return CLI_USAGE;
    }
    if (cli_config_finish(&o->c, CMD, 1)) return CLI_USAGE;
    if (o->pairs && o->types < 2) {
        cli_usage_error(CMD, "--pairs gives the second sentence token type 1, and the model has one token type "
                        "(type_vocab_size 1): train on packed sentences (leave --pairs out)");
        return CLI_USAGE;
    }
    if (cli_optim_finish(&o->opt, CMD, o->steps)) return CLI_USAGE;
    if ((o->until || o->save_every) && !o->save) {
        cli_usage_error(CMD, "--until and --save-every need --save FILE");
        return CLI_USAGE;
    }
    if (o->until > o->steps) {
        cli_usage_error(CMD, "--until %" PRId64 " is past --steps %" PRId64, o->until, o->steps);
        return CLI_USAGE;
    }
    const char *outs[2] = {o->save, o->svg}, *outn[2] = {"--save", "--svg"};
    for (int k = 0; k < 2; k++)
        if (outs[k] && (rc = cli_check_output(CMD, outn[k], outs[k])) != 0) return rc;
    const dm_layer_config *cfg = &o->c.cfg;
    r->bm = (dm_bert_model){.vocab = r->vocab.vocab_size, .positions = o->positions, .types = o->types,
                            .pad_id = r->vocab.special.pad, .predictions = o->predictions,
                            .xent = (dm_xent_mode)o->xent};
    if (open_loaders(r, cfg) != DM_OK) return fail_dm("--data: ");
    dm_layer_options lo = cli_device_layer_options(&o->dev, o->c.threads, !o->no_unpad);
    if (dm_trainer_new_bert(&r->T, cfg, o->layers, &r->bm, &lo, &o->opt.optim) != DM_OK) return fail_dm("");
    if (dm_trainer_set_dist(r->T, r->dist) != DM_OK || dm_trainer_set_zero(r->T, o->opt.zero) != DM_OK)
        return fail_dm("");
    /* what the run trains on: a checkpoint of another run is not resumed (the token data's
     * fingerprint and the vocabulary's, wherever the dataset lies; how it is masked and
     * how many masked positions are scored) */
    char tag[128], pred[32] = "default";
    if (o->predictions) snprintf(pred, sizeof pred, "%" PRId64, o->predictions);
    snprintf(tag, sizeof tag, "pretrain data %016" PRIx64 " vocab %016" PRIx64 " %s mask %g predictions %s",
             dm_loader_fingerprint(r->train), r->vocab.hash, o->pairs ? "pairs" : "packed", o->mask_prob, pred);
    /* an older dmove's (version 1) tag of the same run: the dataset's name, then as now */
    char tag1[128], dir[256];
    snprintf(dir, sizeof dir, "%s", o->data);
    for (size_t k = strlen(dir); k > 1 && dir[k - 1] == '/'; k--) dir[k - 1] = 0; /* data/ is data */
    const char *base = strrchr(dir, '/');
    snprintf(tag1, sizeof tag1, "pretrain %.60s %s mask %g", base && base[1] ? base + 1 : dir,
             o->pairs ? "pairs" : "packed", o->mask_prob);
    if (dm_trainer_set_run_tag(r->T, tag) != DM_OK || dm_trainer_set_run_tag_v1(r->T, tag1, NULL) != DM_OK)
        return fail_dm("");
    if (o->resume) {
        if (dm_trainer_load(r->T, o->resume) != DM_OK) return fail_dm("--resume: ");
    } else if (dm_trainer_init_params(r->T, cfg->seed) != DM_OK) {
        return fail_dm("");
    } else if (o->init && dm_trainer_load_layers(r->T, o->init, o->layers_from) != DM_OK) {
        return fail_dm("--init: ");
    }
    r->start = dm_trainer_step_count(r->T);
    r->skips = r->skips0 = dm_trainer_skipped(r->T); /* a resumed run's earlier ones */
    r->stop = o->until ? o->until : o->steps;
    if (r->start >= r->stop) {
        cli_usage_error(CMD, "the checkpoint is at step %" PRId64 ", already at --%s %" PRId64, r->start,
                        o->until ? "until" : "steps", r->stop);
        return CLI_USAGE;
    }
    /* the loader at the run's next micro-batch: batch k is the same whenever it is made */
    if (dm_loader_seek(r->train, r->start * o->opt.optim.accumulate) != DM_OK) return fail_dm("--resume: ");
    const size_t n = (size_t)cfg->batch * (size_t)cfg->seq;
    if (o->eval_every < 0) o->eval_every = o->steps >= 10 ? o->steps / 10 : o->steps;
    if (o->eval_every == 0) o->eval_every = r->stop; /* at the end alone: s % stop is 0 only there */
    r->eval_cap = (r->stop - r->start) / o->eval_every + 2;
    const size_t ns = (size_t)(r->stop - r->start), ne = (size_t)r->eval_cap;
    if (!(r->maskf = malloc(n * sizeof(float))) || !(r->losses = malloc(ns * sizeof(double))) ||
        !(r->accs = malloc(ns * sizeof(double))) || !(r->step_s = malloc(ns * sizeof(double))) ||
        !(r->eval_steps = malloc(ne * sizeof(int64_t))) || !(r->eval_losses = malloc(ne * sizeof(double))) ||
        !(r->eval_accs = malloc(ne * sizeof(double)))) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    if (!o->log_every) o->log_every = o->steps > 15 ? o->steps / 15 : 1;
    return 0;
}

static void header(const pretrain_run *r, FILE *info) {
    const pretrain_opts *o = &r->o;
    const dm_layer_config *cfg = &o->c.cfg;
    fprintf(info, "dmove pretrain: BERT of %d layers (i=%" PRId64 " h=%" PRId64 " u=%" PRId64 ", %s; vocabulary %d, "
                  "%" PRId64 " positions; %.2fM parameters), batches of b=%" PRId64 " j=%" PRId64 ", dropout %g, "
                  "%d threads\n", o->layers, cfg->hidden, cfg->heads, cfg->ffn, dm_act_name(cfg->act),
            r->vocab.vocab_size, o->positions, (double)dm_trainer_num_params(r->T) / 1e6, cfg->batch, cfg->seq,
            cfg->dropout, cli_threads(o->c.threads));
    char where[160];
    if (o->dev.device == DM_DEVICE_CUDA)
        fprintf(info, "  %s\n", cli_device_where(where, sizeof where, o->dev.device, o->dev.dtype, 0));
    char lrb[32];
    dm_fmt_exact(lrb, sizeof lrb, o->opt.optim.lr);
    fprintf(info, "  data: %s (%" PRId64 " sequences an epoch%s), %s, %.0f%% masked; %s lr %s, %" PRId64 " steps\n",
            o->data, dm_loader_sequences(r->train), r->valid ? "; held-out split: yes" : "; no held-out split",
            o->pairs ? "sentence pairs" : "packed sentences", 100 * o->mask_prob,
            o->opt.optim.kind == DM_OPT_LAMB ? "LAMB" : "AdamW", lrb, o->steps);
    cli_dist_header(info, r->dist, cfg->batch, o->opt.zero);
    if (o->init) {
        fprintf(info, "  parameters from %s", o->init);
        if (o->layers_from) fprintf(info, " (layers %d to %d)", o->layers_from, o->layers_from + o->layers - 1);
        const char *note = dm_trainer_load_note(r->T);
        if (*note) fprintf(info, "; not in it, at BERT's initialisation: %s", note);
        fprintf(info, "\n");
    }
    fflush(info);
}

static int save(pretrain_run *r) {
    if (dm_trainer_save(r->T, r->o.save) != DM_OK) return fail_dm("--save: ");
    return 0;
}

/* A step (or the evaluation after it) failed: the state after step `done` is kept (--save),
 * and rc returned. */
static int failed_step(pretrain_run *r, int64_t done, int rc) {
    /* with several ranks the others are in the step, not here: the last checkpoint stays */
    if (dm_dist_size(r->dist) == 1 && r->o.save && done > r->start && save(r) == 0)
        cli_error(CMD, "the state after step %" PRId64 " is saved to %s", done, r->o.save);
    return rc;
}

static int run_loop(pretrain_run *r, FILE *info) {
    const pretrain_opts *o = &r->o;
    double t0 = cli_now(), t_last = t0;
    int64_t last = r->start, sc0 = 0, co0 = 0;
    int rc;
    cli_catch_signals(CMD, o->save != NULL);
    for (int64_t s = r->start + 1; s <= r->stop && !cli_dist_interrupted(r->dist); s++) {
        double l, ts = cli_now();
        const int64_t sc = r->scored, co = r->correct;
        if (one_step(r, s, &l) != DM_OK) {
            char where[64];
            snprintf(where, sizeof where, "step %" PRId64 ": ", s);
            return failed_step(r, s - 1, fail_dm(where));
        }
        /* a step with no masked position (on any rank) has no loss and made no update */
        const int none = dm_trainer_skipped(r->T) > r->skips;
        r->skips = dm_trainer_skipped(r->T);
        r->losses[s - r->start - 1] = none ? NAN : l;
        r->accs[s - r->start - 1] = r->scored > sc ? (double)(r->correct - co) / (double)(r->scored - sc) : NAN;
        r->step_s[s - r->start - 1] = cli_now() - ts;
        r->ran = s - r->start;
        if (s % o->log_every == 0 || s == r->start + 1 || s == r->stop || cli_interrupted()) {
            double t = cli_now(), per = (t - t_last) / (double)(s - last);
            const int64_t ds = r->scored - sc0, dc = r->correct - co0;
            char gn[40] = "";
            if (dm_trainer_grad_norm(r->T) >= 0.0) snprintf(gn, sizeof gn, "  |g| %.3g", dm_trainer_grad_norm(r->T));
            if (none) fprintf(info, "step %" PRId64 "/%" PRId64 "  no masked position in its batch: no update\n", s, o->steps);
            else fprintf(info, "step %" PRId64 "/%" PRId64 "  loss %.4f  acc %.3f  lr %.2e%s  %.3f s/step  %.0f tokens/s\n", s,
                    o->steps, l, ds ? (double)dc / (double)ds : 0.0, dm_optim_lr(&o->opt.optim, s), gn, per,
                    (double)(r->o.c.cfg.batch * r->o.c.cfg.seq * o->opt.optim.accumulate * dm_dist_size(r->dist)) /
                        per);
            t_last = t, last = s, sc0 = r->scored, co0 = r->correct;
        }
        if (r->valid && (s % o->eval_every == 0 || s == r->stop)) {
            if (evaluate(r) != DM_OK) return failed_step(r, s, fail_dm("evaluation: "));
            fprintf(info, "  held-out at step %" PRId64 ": loss %.4f, masked-token accuracy %.3f\n", s, r->eval_loss,
                    r->eval_acc);
            if (r->evaluated && r->neval < r->eval_cap) {
                r->eval_steps[r->neval] = s, r->eval_losses[r->neval] = r->eval_loss;
                r->eval_accs[r->neval++] = r->eval_acc;
            }
        }
        if (o->save && o->save_every && s % o->save_every == 0 && s < r->stop && (rc = save(r)) != 0) return rc;
        fflush(info);
    }
    r->t_total = cli_now() - t0;
    if (o->save && r->ran > 0 && (rc = save(r)) != 0) return rc;
    if (cli_interrupted() && r->start + r->ran < r->stop) {
        if (o->save)
            cli_error(CMD, "interrupted after step %" PRId64 ": checkpoint saved to %s; continue with the same "
                      "options and --resume %s", r->start + r->ran, o->save, o->save);
        else
            cli_error(CMD, "interrupted after step %" PRId64 " (no --save: nothing kept)", r->start + r->ran);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the steps' wall times (a step: its micro-batches' data, forward, backward
 * and the update; not the evaluations), sorted in place. */
static double median_step_ms(double *t, int64_t n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return 1e3 * (n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]));
}

/* The first (dir 1) or last (dir -1) step's loss that is one (a step with no masked
 * position has none): its index into r->losses, or -1. */
static int64_t loss_at(const pretrain_run *r, int dir) {
    for (int64_t k = 0; k < r->ran; k++) {
        const int64_t i = dir > 0 ? k : r->ran - 1 - k;
        if (isfinite(r->losses[i])) return i;
    }
    return -1;
}

static void summary(const pretrain_run *r) {
    const pretrain_opts *o = &r->o;
    const int64_t f = loss_at(r, 1), e = loss_at(r, -1);
    double ph[DM_TRAIN_NUM_PHASES];
    dm_trainer_times(r->T, ph);
    const double n = (double)r->ran, wait = dm_loader_wait_seconds(r->train);
    double busy, exposed;
    dm_trainer_reduce_times(r->T, &busy, &exposed);
    if (o->json) {
        printf("{\"layers\":%d,\"params\":%" PRId64 ",\"steps\":%" PRId64 ",\"loss_first\":%.6f,\"loss_last\":%.6f,"
               "\"eval_loss\":%.6f,\"eval_accuracy\":%.6f,\"tokens_per_s\":%.1f,\"ms_per_step\":{\"data_wait\":%.4f,"
               "\"forward\":%.4f,\"backward\":%.4f,\"optimizer\":%.4f,\"total\":%.4f},\"step_ms_median\":%.4f,\"ranks\":%d,\"reduce_ms\":{\"busy\":%.4f,\"exposed\":%.4f},"
               "\"masked_scored\":%" PRId64 ",\"masked_left_out\":%" PRId64 "}\n",
               o->layers,
               dm_trainer_num_params(r->T), r->ran, f >= 0 ? r->losses[f] : -1.0, e >= 0 ? r->losses[e] : -1.0,
               r->evaluated ? r->eval_loss : -1.0,
               r->evaluated ? r->eval_acc : -1.0,
               (double)r->tokens / r->t_total, 1e3 * wait / n, 1e3 * ph[DM_TRAIN_FORWARD] / n,
               1e3 * ph[DM_TRAIN_BACKWARD] / n, 1e3 * ph[DM_TRAIN_OPTIMIZER] / n, 1e3 * r->t_total / n,
               median_step_ms(r->step_s, r->ran), dm_dist_size(r->dist), 1e3 * busy / n, 1e3 * exposed / n,
               r->scored, r->dropped);
        return;
    }
    if (f >= 0)
        printf("\nloss %.4f (step %" PRId64 ") -> %.4f (step %" PRId64 ")", r->losses[f], r->start + 1 + f,
               r->losses[e], r->start + 1 + e);
    else
        printf("\nno step had a masked position: no loss, no update");
    if (r->skips > r->skips0)
        printf(" (%" PRId64 " step%s without a masked position: no update)", r->skips - r->skips0,
               r->skips - r->skips0 > 1 ? "s" : "");
    if (r->evaluated) printf("; held-out loss %.4f, masked-token accuracy %.3f", r->eval_loss, r->eval_acc);
    if (r->dropped)
        printf("\n%" PRId64 " masked positions scored, %" PRId64 " left out: past their sequence's share of "
               "--predictions, or past --predictions in all", r->scored, r->dropped);
    printf("\ntime per step %.1f ms: waiting for data %.2f, forward %.1f, backward %.1f, %s %.1f; %.0f real tokens/s\n",
           1e3 * r->t_total / n, 1e3 * wait / n, 1e3 * ph[DM_TRAIN_FORWARD] / n, 1e3 * ph[DM_TRAIN_BACKWARD] / n,
           o->opt.optim.kind == DM_OPT_LAMB ? "LAMB" : "AdamW", 1e3 * ph[DM_TRAIN_OPTIMIZER] / n,
           (double)r->tokens / r->t_total);
    cli_dist_summary(stdout, r->dist, r->T, n);
}

int cmd_pretrain(int argc, char **argv) {
    pretrain_run r;
    memset(&r, 0, sizeof r);
    int rc = cli_parse(&k_pretrain, &r.o, argc, argv);
    if (rc != CLI_GO) return rc;
    if ((rc = cli_dist_start(CMD, &k_pretrain, argc, argv, &r.dist)) != 0) return rc;
    const int rank0 = dm_dist_rank(r.dist) == 0;
    FILE *info = cli_dist_info(r.o.json ? stderr : stdout);
    if ((rc = setup(&r)) == 0) {
        header(&r, info);
        rc = run_loop(&r, info);
    }
    if (rc == 0 && r.ran > 0) {
        /* the tokens of every rank (the step times are the same on each) */
        double tok = (double)r.tokens;
        if (dm_dist_sum(r.dist, &tok, 1) != DM_OK) rc = fail_dm("");
        r.tokens = (int64_t)tok;
        if (rank0) summary(&r);
        if (rc == 0) rc = cli_finish_stdout(CMD);
        if (rank0 && r.o.svg && loss_at(&r, 1) < 0 && !r.neval) {
            fprintf(stderr, "dmove pretrain: --svg: no step had a masked position and nothing was evaluated: no "
                    "chart written\n");
        } else if (rank0 && r.o.svg) {
            char title[160];
            snprintf(title, sizeof title, "dmove pretrain: BERT, %d layers, i=%" PRId64 ", b=%" PRId64 " j=%" PRId64,
                     r.o.layers, r.o.c.cfg.hidden, r.o.c.cfg.batch, r.o.c.cfg.seq);
            const dm_train_chart ch = {.title = title, .loss_name = "masked-LM loss (cross-entropy)",
                                       .acc_name = "masked-token accuracy", .loss = r.losses, .train_acc = r.accs,
                                       .n = r.ran, .first_step = r.start + 1, .eval_step = r.eval_steps,
                                       .eval_loss = r.eval_losses, .eval_acc = r.eval_accs, .neval = r.neval};
            if (dm_train_chart_svg(&ch, r.o.svg) != DM_OK) rc = fail_dm("--svg: ");
        }
        if (rc == 0 && r.o.export_dir) {
            if (dm_trainer_export(r.T, r.o.export_dir) != DM_OK) rc = fail_dm("--export: ");
            else fprintf(info, "exported: %s/model.safetensors and %s/config.json (BertForMaskedLM)\n", r.o.export_dir,
                         r.o.export_dir);
        }
        if (rc == 0 && cli_interrupted() && r.start + r.ran < r.stop) rc = 130;
        if (rc == 0 && r.o.save)
            fprintf(info, "checkpoint: %s (step %" PRId64 "%s)\n", r.o.save, r.start + r.ran,
                    r.start + r.ran < r.o.steps ? "; go on with --resume" : "");
    }
    dm_trainer_free(r.T);
    dm_loader_free(r.train);
    dm_loader_free(r.valid);
    dm_batch_free(&r.vb);
    dm_tokenizer_free(r.tok);
    free(r.maskf);
    free(r.losses);
    free(r.accs);
    free(r.step_s);
    free(r.eval_steps);
    free(r.eval_losses);
    free(r.eval_accs);
    return cli_dist_end(r.dist, rc);
}
