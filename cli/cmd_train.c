/* cmd_train.c: `dmove train`: trains a stack of BERT encoder layers with AdamW on a teacher
 * task (default) or on the user's inputs and targets, with progress, checkpoints (save,
 * resume, pretrained parameters) and a loss chart. The data and the teacher are the
 * library's (dm_train_data, dm_teacher). */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"

static const char *const CMD = "train";

typedef struct {
    int layers, layers_set, layers_from, json, linear, unfused, recompute;
    int64_t steps, save_every, log_every, until;
    double teacher_scale;
    const char *data, *init, *resume, *save, *svg, *plan;
    cli_optim opt;
    cli_device dev;
    cli_config c;
} train_opts;

static void init(void *p) {
    train_opts *o = p;
    o->layers = 2;
    o->steps = 30;
    o->teacher_scale = 5.0;
    cli_optim_init(&o->opt);
    cli_config_init(&o->c, CLI_CFG_ALL);
}

static int check_teacher_scale(void *base, const char *cmd, const char *v, const char *raw) {
    const double s = ((const train_opts *)base)->teacher_scale;
    if (!(s > 0 && s <= 100)) {
        cli_usage_error(cmd, "--teacher-scale: %s is outside (0, 100]", v);
        return -1;
    }
    return 0;
}

static const cli_choice k_schedules[] = {{"fused", 0}, {"unfused", 1}, {NULL, 0}};

#define O(field) .off = offsetof(train_opts, field)
#define STEPS(nm, a, field, min, h) {.kind = CLI_I64, .name = nm, .arg = a, O(field), .lo = min, .hi = INT64_C(1000000000), .help = h}

static const cli_option k_options[] = {
    {.kind = CLI_INT, .name = "--layers", .arg = "L", O(layers), .set = offsetof(train_opts, layers_set) + 1, .lo = 1,
     .hi = 256,
     .help = "layers in the stack (default {}; BERT-base has 12,\n"
             "BERT-large 24)"},
    STEPS("--steps", "N", steps, 1, "train until update N (default {}; a resumed run continues\n"
                                    "up to it)"),
    CLI_OPTIM(train_opts, opt),
    {.kind = CLI_STR, .name = "--data", .arg = "FILE", O(data),
     .help = "train on your samples (above) instead of the teacher"},
    {.kind = CLI_DOUBLE, .name = "--teacher-scale", .arg = "S", O(teacher_scale), .fn = check_teacher_scale,
     .help = "the teacher's weights are BERT's initialisation times S\n"
             "(default {}: N(0, 0.1)); larger makes its function harder"},
    {.kind = CLI_STR, .name = "--init", .arg = "PATH", O(init),
     .help = "start from a pretrained BERT: a Hugging Face model directory\n"
             "(config.json, model.safetensors) or a safetensors file\n"
             "(encoder.layer.<l>.*, under bert., 0.auto_model. or model.\n"
             "too; LayerNorm gamma/beta too). A config.json (in the\n"
             "directory, or beside the file) gives the sizes, eps,\n"
             "activation and dropout, and --layers defaults to all the\n"
             "model's layers; an option that contradicts it is refused"},
    {.kind = CLI_INT, .name = "--layers-from", .arg = "N", O(layers_from), .lo = 0, .hi = 4095,
     .help = "with --init: take the model's layers N, N+1, ... (default {})"},
    {.kind = CLI_STR, .name = "--resume", .arg = "FILE", O(resume),
     .help = "continue a run from its checkpoint (parameters, AdamW's\n"
             "moments, step): the same options give the same result as\n"
             "an uninterrupted run"},
    {.kind = CLI_STR, .name = "--save", .arg = "FILE", O(save),
     .help = "write a checkpoint at the end (atomically; also every\n"
             "--save-every K steps, and on Ctrl-C: the step under way\n"
             "ends, the checkpoint is written, the exit status is 130)"},
    STEPS("--save-every", "K", save_every, 1, "checkpoint every K steps as well (needs --save)"),
    STEPS("--until", "K", until, 1, "stop after step K this time, as if interrupted (the\n"
                                    "schedule still runs to --steps): train a long run in parts,\n"
                                    "each resuming the last one's checkpoint"),
    STEPS("--log-every", "K", log_every, 1, "a progress line every K steps (default: about 15 lines)"),
    {.kind = CLI_STR, .name = "--svg", .arg = "FILE", O(svg), .help = "draw the loss curve as an SVG chart"},
    {.kind = CLI_FLAG, .name = "--json", O(json), .lo = 1,
     .help = "print one JSON object at the end instead of the summary"},
    {.kind = CLI_CHOICE, .name = "--schedule", .arg = "S", O(unfused), .choices = k_schedules,
     .msg = "--schedule: unknown schedule '%s' (known: fused, unfused; the learning rate's is --lr-schedule)",
     .help = "each layer's step: fused (default) or unfused (one pass over\n"
             "memory per operator, as a framework's eager mode)"},
    {.kind = CLI_STR, .name = "--plan", .arg = "FILE", O(plan),
     .help = "run every layer on a plan from `dmove tune` for these sizes\n"
             "(layouts and algorithms chosen by measurement)"},
    {.kind = CLI_FLAG, .name = "--recompute", O(recompute), .lo = 1,
     .help = CLI_RECOMPUTE_HELP("in every layer; fused schedule")},
    CLI_DEVICE(train_opts, dev),
    CLI_CONFIG(train_opts, c, CLI_CFG_ALL),
    {.kind = CLI_TEXT,
     .help = "                   (--seed seeds the dropout masks, the teacher and its data,\n"
             "                   and the initial parameters)\n"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_train = {
    .name = "train",
    .head =
            "usage: dmove train [options]\n"
            "\n"
            "Trains a stack of BERT encoder layers (Hugging Face BertEncoder: post-LayerNorm\n"
            "layers, no embeddings) with AdamW or LAMB, on the CPU or a GPU, to map each\n"
            "batch's hidden_states to its target: the loss is the mean squared error over the\n"
            "tokens the attention mask keeps. Every layer runs dmove's fused training step;\n"
            "the optimizer updates each parameter in one pass over memory (LAMB: two). On a\n"
            "GPU (--device cuda) the whole step stays there: layer to layer, the loss and\n"
            "the update (over fp32 master weights when --dtype is bf16 or fp16); only the\n"
            "batch goes up, the loss down.\n"
            "\n"
            "What it learns:\n"
            "  by default, a teacher: a second stack with its own random weights (scaled by\n"
            "  --teacher-scale, dropout off) turns fresh random inputs N(0, 1), with random\n"
            "  padding, into the targets; the loss falls as the stack learns its function.\n"
            "  --data FILE: your samples, a safetensors file with hidden_states (N, j, i),\n"
            "  target (N, j, i) and optionally attention_mask (N, j) (1 token, 0 padding),\n"
            "  any float dtype; step s trains on samples (s-1)*b .. s*b-1, wrapping around;\n"
            "  j and i come from the file.\n"
            "\n"
            "options:\n",
    .foot =
            "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove train                                 (2 BERT-base layers, 30 steps)\n"
            "  dmove train --layers 4 --batch 4 --seq 64 --steps 200 --lr 3e-4 --warmup 20 \\\n"
            "              --lr-schedule linear --svg loss.svg --save run.ckpt --until 100\n"
            "  dmove train --layers 4 --batch 4 --seq 64 --steps 200 --lr 3e-4 --warmup 20 \\\n"
            "              --lr-schedule linear --svg loss.svg --save run.ckpt --resume run.ckpt\n"
            "                                              (the same options, continued)\n"
            "  dmove train --device cuda --dtype bf16 --preset bert-large --layers 24 \\\n"
            "              --batch 32 --seq 128 --rows auto     (BERT-large's encoder on a GPU)\n",
    .options = k_options,
    .size = sizeof(train_opts),
    .init = init,
};

/* Ctrl-C (SIGINT) or SIGTERM during a run: the step under way finishes, the checkpoint
 * (--save) is written, and the run ends with status 130; a second signal ends it at once
 * (the handler is reset to the default by the first). */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail_dm(const char *what) { return cli_fail_dm(CMD, what); }

static float *tensor(dm_trainer *t, const char *name) {
    float *p = NULL;
    return dm_trainer_tensor(t, name, &p, NULL, NULL) == DM_OK ? p : NULL;
}

static void fmt_secs(char *buf, size_t n, double s) {
    if (s < 90) snprintf(buf, n, "%.0f s", s);
    else if (s < 5400) snprintf(buf, n, "%.1f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}


/* One run: its options, the data or the teacher, the trainer and the history. */
typedef struct {
    train_opts o;
    dm_tensor_file *file;  /* --data */
    dm_train_data *data;
    dm_teacher *teacher;   /* without --data */
    dm_trainer *T;
    dm_dist *dist;         /* the ranks of an MPI launch (alone: one) */
    float *x, *y, *mask;   /* the trainer's batch */
    double *losses, *step_secs; /* per step run, growing */
    int64_t cap, start, stop, ran;
    double t_data, t_save, t_total;
    char weights[4096];    /* --init: the safetensors file */
} train_run;

static void run_free(train_run *r) {
    free(r->losses);
    free(r->step_secs);
    dm_trainer_free(r->T);
    dm_teacher_free(r->teacher);
    dm_train_data_free(r->data);
    dm_tensor_file_free(r->file);
}

/* The options together, before any work. 0 ok, else the exit status after the error. */
static int check_options(train_opts *o) {
    const cli_path reads[4] = {{.opt = "--data", .path = o->data},
                               {.opt = "--init", .path = o->init, .dir = 1},
                               {.opt = "--resume", .path = o->resume, .same_ok = "--save"},
                               {.opt = "--plan", .path = o->plan}};
    const cli_path writes[2] = {{.opt = "--save", .path = o->save}, {.opt = "--svg", .path = o->svg}};
    const int bad = cli_check_paths(CMD, reads, 4, writes, 2);
    if (bad) return bad;
    if (o->layers_from && !o->init) {
        cli_usage_error(CMD, "--layers-from picks layers of a pretrained model: it needs --init");
        return CLI_USAGE;
    }
    if (o->init && o->resume) {
        cli_usage_error(CMD, "--init and --resume both give the starting parameters: use one (a checkpoint "
                        "already holds them)");
        return CLI_USAGE;
    }
    if (o->until && !o->save) {
        cli_usage_error(CMD, "--until needs --save FILE (the checkpoint the run resumes from)");
        return CLI_USAGE;
    }
    if (o->save_every && !o->save) {
        cli_usage_error(CMD, "--save-every needs --save FILE (where to write the checkpoints)");
        return CLI_USAGE;
    }
    if (o->data && o->teacher_scale != 5.0) {
        cli_usage_error(CMD, "--teacher-scale applies to the teacher task, not to --data");
        return CLI_USAGE;
    }
    if (o->until > o->steps) {
        cli_usage_error(CMD, "--until %" PRId64 " is past --steps %" PRId64 " (the run's last step)", o->until,
                        o->steps);
        return CLI_USAGE;
    }
    if (cli_optim_finish(&o->opt, CMD, o->steps)) return CLI_USAGE;
    const char *outs[2] = {o->save, o->svg}, *outn[2] = {"--save", "--svg"};
    for (int k = 0; k < 2; k++)
        if (outs[k]) {
            int bad = cli_check_output(CMD, outn[k], outs[k]);
            if (bad) return bad;
        }
    return 0;
}

/* --data: the file opened and checked whole; its j and i become the sizes. 0 ok, else the
 * exit status after the error. */
static int open_data(train_run *r) {
    train_opts *o = &r->o;
    if (dm_tensor_file_open(&r->file, o->data) != DM_OK) return fail_dm("--data: ");
    if (dm_train_data_new(&r->data, r->file) != DM_OK) return fail_dm("--data ");
    int64_t seq, hid;
    dm_train_data_sizes(r->data, NULL, &seq, &hid);
    cli_config *c = &o->c;
    if ((c->size_set[1] && c->size[1] != seq) || (c->size_set[2] && c->size[2] != hid)) {
        cli_usage_error(CMD, "--data holds sequences of %" PRId64 " tokens of width %" PRId64
                        ": leave --seq and --hidden out (they come from the file)", seq, hid);
        return CLI_USAGE;
    }
    if (dm_train_data_check_dtypes(r->data) != DM_OK) return fail_dm("--data: ");
    dm_status st = dm_train_data_check_finite(r->data);
    if (st != DM_OK) {
        if (st == DM_ERR_OOM) {
            cli_error(CMD, "out of memory checking --data");
            return CLI_FAIL;
        }
        return fail_dm("--data ");
    }
    c->size[1] = seq, c->size_set[1] = 1;
    c->size[2] = hid, c->size_set[2] = 1;
    return 0;
}

/* --init: the model's files; with a config.json, the sizes, eps, activation and dropout
 * from it (an option that contradicts it refused), --layers defaulting to its layers from
 * --layers-from on, and the tensors checked against it. 0 ok, else the exit status. */
static int model_config(train_run *r) {
    train_opts *o = &r->o;
    char config[4096];
    if (dm_hf_model_files(o->init, r->weights, sizeof r->weights, config, sizeof config) != DM_OK)
        return fail_dm("--init: ");
    struct stat sb;
    if (!config[0] && stat(o->init, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        cli_error(CMD, "--init %s: a model directory without config.json: its sizes, activation and eps are read "
                  "from it (give model.safetensors itself to take them from the options)", o->init);
        return CLI_FAIL;
    }
    if (!config[0]) return 0; /* a bare file: the sizes are the options' */
    dm_hf_config hc;
    if (dm_hf_config_read(config, &hc) != DM_OK) return fail_dm("--init: ");
    int rc = cli_config_from_hf(&o->c, CMD, "--init", config, &hc);
    if (rc) return rc;
    if (o->layers_from >= hc.num_hidden_layers) {
        cli_usage_error(CMD, "--layers-from %d: the model has layers 0 to %" PRId64, o->layers_from,
                        hc.num_hidden_layers - 1);
        return CLI_USAGE;
    }
    if (!o->layers_set) o->layers = (int)(hc.num_hidden_layers - o->layers_from < 256 ? hc.num_hidden_layers - o->layers_from : 256);
    if (o->layers_from + o->layers > hc.num_hidden_layers) {
        cli_usage_error(CMD, "--layers %d from layer %d: the model has %" PRId64 " layers", o->layers, o->layers_from,
                        hc.num_hidden_layers);
        return CLI_USAGE;
    }
    dm_tensor_file *f = NULL;
    dm_status st = dm_tensor_file_open(&f, r->weights);
    if (st == DM_OK) st = dm_hf_config_check_tensors(&hc, f);
    dm_tensor_file_free(f);
    return st == DM_OK ? 0 : fail_dm("--init: ");
}

/* The trainer, on the parameters it starts from (a checkpoint, a pretrained file or
 * BERT's initialisation), and the data or the teacher. 0 ok, else the exit status after
 * the error. */
static int setup(train_run *r) {
    train_opts *o = &r->o;
    int rc;
    if (o->init && (rc = model_config(r)) != 0) return rc;
    if (cli_config_finish(&o->c, CMD, 1)) return CLI_USAGE;
    const dm_layer_config *cfg = &o->c.cfg;
    int64_t n = 0;
    if (r->data) dm_train_data_sizes(r->data, &n, NULL, NULL);
    const int64_t ranks = dm_dist_size(r->dist), global = cfg->batch * ranks; /* every rank's share */
    if (r->data && n < global) {
        if (ranks > 1)
            cli_usage_error(CMD, "--data holds %" PRId64 " samples, fewer than the global batch (%" PRId64
                            " ranks x --batch %" PRId64 ")", n, ranks, cfg->batch);
        else
            cli_usage_error(CMD, "--data holds %" PRId64 " samples, fewer than a batch (--batch %" PRId64 ")", n,
                            cfg->batch);
        return CLI_USAGE;
    }
    dm_layer_options opt = {.threads = o->c.threads, .schedule = o->unfused ? DM_SCHED_UNFUSED : DM_SCHED_FUSED,
                            .plan = o->plan, .recompute = o->recompute, .device = o->dev.device,
                            .dtype = o->dev.dtype, .rows = o->dev.rows, .streams = o->dev.streams};
    if (cli_options_check(CMD, &opt)) return CLI_USAGE;
    if (o->plan && o->unfused) {
        cli_usage_error(CMD, "--plan is a plan of the fused schedule: leave out --schedule unfused");
        return CLI_USAGE;
    }
    if (dm_trainer_new(&r->T, cfg, o->layers, &opt, &o->opt.optim) != DM_OK) return fail_dm("");
    if (dm_trainer_set_dist(r->T, r->dist) != DM_OK || dm_trainer_set_zero(r->T, o->opt.zero) != DM_OK)
        return fail_dm("");
    char what[96] = "the teacher task"; /* every rank the same samples (the paths may name other files) */
    if (r->data) snprintf(what, sizeof what, "%" PRId64 " samples, contents %016" PRIx64, n, dm_train_data_fingerprint(r->data));
    if (dm_dist_agree(r->dist, "the training data", what) != DM_OK) return fail_dm("");
    /* what this run trains on: a checkpoint of another run is not resumed */
    char tag[128];
    const char *base = o->data ? strrchr(o->data, '/') : NULL;
    if (o->data) snprintf(tag, sizeof tag, "data %.100s", base ? base + 1 : o->data);
    else snprintf(tag, sizeof tag, "teacher scale %.17g", o->teacher_scale);
    if (dm_trainer_set_run_tag(r->T, tag) != DM_OK) return fail_dm("");
    if (o->resume) {
        if (dm_trainer_load(r->T, o->resume) != DM_OK) return fail_dm("--resume: ");
    } else if (o->init) {
        if (dm_trainer_load_layers(r->T, r->weights, o->layers_from) != DM_OK) return fail_dm("--init: ");
    } else if (dm_trainer_init_params(r->T, cfg->seed) != DM_OK) {
        return fail_dm("");
    }
    r->start = dm_trainer_step_count(r->T);
    r->stop = o->until ? o->until : o->steps;
    if (r->start >= r->stop) {
        cli_usage_error(CMD, "the checkpoint is at step %" PRId64 ", already at %s %" PRId64
                        ": give a larger one to go on", r->start, o->until ? "--until" : "--steps", r->stop);
        return CLI_USAGE;
    }
    /* the teacher, on the trainer's device: its forward pass makes each step's targets */
    dm_status st = r->data ? DM_OK : dm_teacher_new(&r->teacher, cfg, o->layers, &opt, o->teacher_scale);
    if (st == DM_OK && r->teacher) st = dm_teacher_set_part(r->teacher, dm_dist_rank(r->dist), dm_dist_size(r->dist));
    if (st != DM_OK) return fail_dm(st == DM_ERR_INTERNAL ? "internal: " : "the teacher: ");
    r->x = tensor(r->T, "hidden_states"), r->y = tensor(r->T, "target"), r->mask = tensor(r->T, "attention_mask");
    if (!r->x || !r->y || !r->mask) return fail_dm("internal: ");
    /* the per-step history grows as the run goes (a long --steps costs no memory up front) */
    const int64_t todo = r->stop - r->start;
    r->cap = todo < 4096 ? todo : 4096;
    if (!(r->losses = malloc((size_t)r->cap * sizeof(double))) ||
        !(r->step_secs = malloc((size_t)r->cap * sizeof(double)))) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    if (!o->log_every) o->log_every = todo <= 15 ? 1 : (todo + 14) / 15;
    return 0;
}

/* What the run is: the stack, the data, AdamW and the steps (stderr with --json). */
static void print_header(const train_run *r, FILE *info) {
    const train_opts *o = &r->o;
    const dm_layer_config *cfg = &o->c.cfg;
    const int threads = cli_threads(o->c.threads), layers = o->layers;
    char lrb[32], where[128];
    dm_fmt_exact(lrb, sizeof lrb, o->opt.optim.lr);
    cli_device_where(where, sizeof where, o->dev.device, o->dev.dtype, threads);
    fprintf(info, "dmove train: %d layer%s (i=%" PRId64 " h=%" PRId64 " u=%" PRId64 ", %s%s; %.2fM parameters), "
                  "batches of b=%" PRId64 " j=%" PRId64 ", dropout %g, %s\n",
            layers, layers > 1 ? "s" : "", cfg->hidden, cfg->heads, cfg->ffn, dm_act_name(cfg->act), cli_variant(cfg),
            (double)dm_trainer_num_params(r->T) / 1e6, cfg->batch, cfg->seq, cfg->dropout, where);
    fprintf(info, "  data: %s\n", o->data ? o->data : "the teacher task (a random stack to imitate; inputs N(0, 1))");
    cli_dist_header(info, r->dist, cfg->batch, o->opt.zero);
    char extra[96] = "";
    int n = 0;
    if (o->opt.optim.clip_norm > 0.0) n += snprintf(extra + n, sizeof extra - (size_t)n, ", gradient norm clipped to %g", o->opt.optim.clip_norm);
    if (o->opt.optim.accumulate > 1) snprintf(extra + n, sizeof extra - (size_t)n, ", %d micro-batches a step", o->opt.optim.accumulate);
    static const char *const decay[3] = {"", ", linear decay", ", polynomial decay"};
    fprintf(info, "  %s: lr %s%s%s, weight decay %g%s; %s%s; steps %" PRId64 " to %" PRId64 " of %" PRId64 "\n",
            o->opt.optim.kind == DM_OPT_LAMB ? "LAMB" : "AdamW", lrb, o->opt.optim.warmup ? ", warm-up" : "",
            decay[o->opt.schedule], o->opt.optim.weight_decay, extra,
            o->resume ? "resumed from " : o->init ? "parameters from " : "BERT initialisation",
            o->resume ? o->resume : o->init ? o->init : "", r->start + 1, r->stop, o->steps);
    fflush(info);
}

/* Step s's batch into the trainer: from the file or from the teacher. */
static int fill_batch(train_run *r, int64_t s) {
    if (r->data) { /* this rank's share of the global batch */
        if (dm_train_data_batch_part(r->data, s, r->o.c.cfg.batch, dm_dist_rank(r->dist), dm_dist_size(r->dist), r->x,
                                     r->y, r->mask) != DM_OK)
            return fail_dm("--data: ");
    } else if (dm_teacher_batch(r->teacher, s, r->x, r->y, r->mask) != DM_OK) {
        return fail_dm("the teacher: ");
    }
    return 0;
}

/* Step s: its micro-batches (--accumulate) and the update, its time without sending the
 * batches up (on a GPU: the data's cost, as the teacher's), the history grown as needed;
 * the step's loss is its micro-batches' mean. */
static int one_step(train_run *r, int64_t s) {
    const int k = r->o.opt.optim.accumulate;
    double loss = 0.0, ts = cli_now(), up0[DM_TRAIN_NUM_PHASES], up1[DM_TRAIN_NUM_PHASES], t_fill = 0.0;
    dm_trainer_times(r->T, up0);
    int rc = 0;
    for (int m = 0; m < k && !rc; m++) {
        double t0 = cli_now(), lm = 0.0;
        if ((rc = fill_batch(r, (s - 1) * k + m + 1)) != 0) break; /* the save below as for a failed step */
        t_fill += cli_now() - t0;
        if (dm_trainer_step(r->T, &lm) != DM_OK) {
            char where[128];
            if (k > 1) snprintf(where, sizeof where, "step %" PRId64 ", micro-batch %d: ", s, m + 1);
            else snprintf(where, sizeof where, "step %" PRId64 ": ", s);
            rc = fail_dm(where);
        }
        loss += lm / k;
    }
    r->t_data += t_fill;
    if (rc) {
        /* the failed step changed nothing: keep what the steps before it learned (alone:
         * with several ranks the others are in the step, and the last checkpoint stays) */
        if (r->o.save && s > r->start + 1 && dm_dist_size(r->dist) == 1) {
            if (dm_trainer_save(r->T, r->o.save) == DM_OK)
                cli_error(CMD, "the state after step %" PRId64 " is saved to %s", s - 1, r->o.save);
            else
                cli_error(CMD, "and the state after step %" PRId64 " could not be saved: %s", s - 1, dm_last_error());
        }
        return rc;
    }
    const int64_t todo = r->stop - r->start;
    if (s - r->start > r->cap) {
        r->cap = r->cap * 2 < todo ? r->cap * 2 : todo;
        double *l2 = realloc(r->losses, (size_t)r->cap * sizeof(double));
        if (l2) r->losses = l2;
        double *s2 = l2 ? realloc(r->step_secs, (size_t)r->cap * sizeof(double)) : NULL;
        if (s2) r->step_secs = s2;
        if (!l2 || !s2) {
            cli_error(CMD, "out of memory for the loss history at step %" PRId64, s);
            return CLI_FAIL;
        }
    }
    dm_trainer_times(r->T, up1);
    r->step_secs[s - r->start - 1] = cli_now() - ts - t_fill - (up1[DM_TRAIN_INPUT] - up0[DM_TRAIN_INPUT]);
    r->losses[s - r->start - 1] = loss;
    r->ran = s - r->start;
    return 0;
}

/* The steps from start + 1 to stop, or to a signal: progress lines, checkpoints every
 * --save-every steps and at the end, the loss chart. 0 ok, else the exit status. */
static int train_loop(train_run *r, FILE *info) {
    const train_opts *o = &r->o;
    const int64_t b = o->c.cfg.batch, j = o->c.cfg.seq;
    double t_begin = cli_now(), t_last = t_begin;
    int64_t last_logged = r->start;
    int rc;
    cli_catch_signals(CMD, o->save != NULL);
    for (int64_t s = r->start + 1; s <= r->stop && !cli_dist_interrupted(r->dist); s++) {
        if ((rc = one_step(r, s)) != 0) return rc;
        if (o->save && o->save_every && s % o->save_every == 0 && s < r->stop) {
            double t1 = cli_now();
            if (dm_trainer_save(r->T, o->save) != DM_OK) return fail_dm("--save: ");
            r->t_save += cli_now() - t1;
        }
        if ((s - r->start) % o->log_every == 0 || s == r->stop || s == r->start + 1 || cli_interrupted()) {
            double t = cli_now(), per = (t - t_last) / (double)(s - last_logged);
            char eta[32];
            fmt_secs(eta, sizeof eta, per * (double)(r->stop - s));
            char gn[40] = "";
            if (dm_trainer_grad_norm(r->T) >= 0.0) snprintf(gn, sizeof gn, "  |g| %.3g", dm_trainer_grad_norm(r->T));
            fprintf(info, "step %*" PRId64 "/%" PRId64 "  loss %.6f  lr %.2e%s  %.3f s/step  %.0f tokens/s  eta %s\n",
                    (int)snprintf(NULL, 0, "%" PRId64, o->steps), s, o->steps, r->losses[s - r->start - 1],
                    dm_optim_lr(&o->opt.optim, s), gn, per,
                    (double)(b * j * o->opt.optim.accumulate * dm_dist_size(r->dist)) / per, eta);
            fflush(info);
            t_last = t;
            last_logged = s;
        }
    }
    r->t_total = cli_now() - t_begin; /* the loop's time, its periodic saves in t_save */
    if (o->save && r->ran > 0 && dm_trainer_save(r->T, o->save) != DM_OK) /* the last: outside both */
        return fail_dm("--save: ");
    if (o->svg && dm_dist_rank(r->dist) == 0) {
        char title[160], lrb[32];
        dm_fmt_exact(lrb, sizeof lrb, o->opt.optim.lr);
        snprintf(title, sizeof title, "dmove train: %d layer%s, i=%" PRId64 ", b=%" PRId64 " j=%" PRId64 ", lr %s",
                 o->layers, o->layers > 1 ? "s" : "", o->c.cfg.hidden, b, j, lrb);
        if (r->ran > 0 && dm_loss_svg(r->losses, r->ran, r->start + 1, title, o->svg) != DM_OK)
            return fail_dm("--svg: ");
    }
    return 0;
}

/* What the report shows: times per phase, the median step, its flop, the memory. */
typedef struct {
    double ph[DM_TRAIN_NUM_PHASES], n, med, opt_gbs, step_flop;
    int64_t np;
    dm_layer_memory mem;
    size_t opt_bytes;
} train_summary;

static void summarize(train_run *r, train_summary *m) {
    dm_trainer_times(r->T, m->ph);
    m->np = dm_trainer_num_params(r->T);
    /* AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter per step */
    m->opt_gbs = m->ph[DM_TRAIN_OPTIMIZER] > 0
                     ? 28.0 * (double)m->np * (double)r->ran / m->ph[DM_TRAIN_OPTIMIZER] / 1e9 : 0;
    m->n = (double)r->ran;
    /* the median training step (forward, loss, backward, AdamW; not the data) */
    qsort(r->step_secs, (size_t)r->ran, sizeof(double), cmp_double);
    const int64_t ran = r->ran;
    m->med = ran % 2 ? r->step_secs[ran / 2] : 0.5 * (r->step_secs[ran / 2 - 1] + r->step_secs[ran / 2]);
    m->step_flop = dm_trainer_step_flop(r->T) * r->o.opt.optim.accumulate; /* a step: its micro-batches */
    dm_trainer_memory_info(r->T, &m->mem, &m->opt_bytes);
}

static void print_json(const train_run *r, const train_summary *m) {
    const train_opts *o = &r->o;
    const dm_layer_config *cfg = &o->c.cfg;
    const int64_t b = cfg->batch, j = cfg->seq;
    const double n = m->n, *ph = m->ph;
    double busy, exposed;
    dm_trainer_reduce_times(r->T, &busy, &exposed);
    printf("{\"layers\":%d,\"params\":%" PRId64 ",\"batch\":%" PRId64 ",\"seq\":%" PRId64 ",\"hidden\":%" PRId64
           ",\"heads\":%" PRId64 ",\"ffn\":%" PRId64 ",\"dropout\":%.17g,\"lr\":%.17g,\"first_step\":%" PRId64
           ",\"last_step\":%" PRId64 ",\"data\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"loss\":[",
           o->layers, m->np, b, j, cfg->hidden, cfg->heads, cfg->ffn, cfg->dropout, o->opt.optim.lr, r->start + 1,
           r->start + r->ran, o->data ? "file" : "teacher", dm_device_kind_name(o->dev.device),
           dm_dtype_name(o->dev.dtype));
    for (int64_t k = 0; k < r->ran; k++) printf("%s%.9g", k ? "," : "", r->losses[k]);
    printf("],\"ms_per_step\":{\"data\":%.4f,\"input\":%.4f,\"forward\":%.4f,\"loss\":%.4f,\"backward\":%.4f,"
           "\"optimizer\":%.4f,\"total\":%.4f},\"step_ms_median\":%.4f,\"step_flop\":%.6g,\"gflop_per_s\":%.2f,"
           "\"optimizer_gb_per_s\":%.3f,\"tokens_per_s\":%.1f,"
           "\"memory_bytes\":{\"arenas\":%zu,\"intermediates\":%zu,\"scratch\":%zu,\"optimizer\":%zu},"
           "\"ranks\":%d,\"reduce_ms\":{\"busy\":%.4f,\"exposed\":%.4f}}\n",
           1e3 * r->t_data / n, 1e3 * ph[DM_TRAIN_INPUT] / n, 1e3 * ph[DM_TRAIN_FORWARD] / n,
           1e3 * ph[DM_TRAIN_LOSS] / n, 1e3 * ph[DM_TRAIN_BACKWARD] / n, 1e3 * ph[DM_TRAIN_OPTIMIZER] / n,
           1e3 * (r->t_total - r->t_save) / n, 1e3 * m->med, m->step_flop, m->step_flop / m->med / 1e9, m->opt_gbs,
           (double)(b * j * o->opt.optim.accumulate * dm_dist_size(r->dist)) * n / (r->t_total - r->t_save),
           m->mem.arena, m->mem.activations,
           m->mem.scratch, m->opt_bytes, dm_dist_size(r->dist), 1e3 * busy / n, 1e3 * exposed / n);
}

static void print_summary(const train_run *r, const train_summary *m) {
    const train_opts *o = &r->o;
    const int cuda = o->dev.device == DM_DEVICE_CUDA;
    const double n = m->n, *ph = m->ph;
    const int64_t last = r->start + r->ran;
    printf("\nloss %.6f (step %" PRId64 ") -> %.6f (step %" PRId64 ")\n", r->losses[0], r->start + 1,
           r->losses[r->ran - 1], last);
    char up[64] = "";
    if (cuda) snprintf(up, sizeof up, ", batch to the GPU %.1f", 1e3 * ph[DM_TRAIN_INPUT] / n);
    printf("time per step %.1f ms: %s %.1f%s, forward %.1f, loss %.1f, backward %.1f, %s %.1f (%.1f GB/s)\n",
           1e3 * (r->t_total - r->t_save) / n, o->data ? "reading data" : "teacher", 1e3 * r->t_data / n, up,
           1e3 * ph[DM_TRAIN_FORWARD] / n, 1e3 * ph[DM_TRAIN_LOSS] / n, 1e3 * ph[DM_TRAIN_BACKWARD] / n,
           o->opt.optim.kind == DM_OPT_LAMB ? "LAMB" : "AdamW", 1e3 * ph[DM_TRAIN_OPTIMIZER] / n, m->opt_gbs);
    printf("median training step (forward, loss, backward, update): %.1f ms, %.1f GFLOP of the layers: %.1f %s\n",
           1e3 * m->med, m->step_flop / 1e9, m->step_flop / m->med / (cuda ? 1e12 : 1e9),
           cuda ? "TFLOP/s" : "GFLOP/s");
    printf("memory%s: %.1f MB (the layers' arenas %.1f MB, of them intermediates %.1f MB%s; scratch %.1f MB; "
           "the optimizer's moments%s %.1f MB)\n", cuda ? " on the GPU" : "",
           (double)(m->mem.arena + m->mem.scratch + m->opt_bytes) / 1e6, m->mem.arena / 1e6,
           m->mem.activations / 1e6, o->recompute ? ", attention recomputed" : "", m->mem.scratch / 1e6,
           cuda && o->dev.dtype != DM_DTYPE_FP32 ? " and fp32 master weights" : "", m->opt_bytes / 1e6);
    if (o->save && last < o->steps)
        printf("checkpoint: %s (step %" PRId64 " of %" PRId64 "; continue with the same options and --resume %s)\n",
               o->save, last, o->steps, o->save);
    else if (o->save)
        printf("checkpoint: %s (step %" PRId64 "; go on with --resume %s and a larger --steps)\n", o->save, last,
               o->save);
    if (o->svg) printf("loss chart: %s\n", o->svg);
}

/* The end: the report, and the exit status (130 when a signal cut the run short). */
static int finish(train_run *r) {
    const train_opts *o = &r->o;
    if (r->ran == 0) {
        cli_error(CMD, "interrupted before the first step ended: nothing trained, nothing saved");
        return 130;
    }
    train_summary m;
    summarize(r, &m);
    if (dm_dist_rank(r->dist) == 0) { /* the others' summaries are the same */
        if (o->json) print_json(r, &m);
        else print_summary(r, &m);
        if (!o->json) cli_dist_summary(stdout, r->dist, r->T, m.n);
    }
    int rc = cli_finish_stdout(CMD);
    const int64_t last = r->start + r->ran;
    if (cli_interrupted() && last < r->stop) {
        if (o->save)
            cli_error(CMD, "interrupted after step %" PRId64 " of %" PRId64 ": checkpoint saved to %s; continue with "
                      "the same options and --resume %s", last, o->steps, o->save, o->save);
        else
            cli_error(CMD, "interrupted after step %" PRId64 " of %" PRId64 " (without --save, nothing was kept)",
                      last, o->steps);
        rc = 130;
    }
    return rc;
}

int cmd_train(int argc, char **argv) {
    train_run r;
    memset(&r, 0, sizeof r);
    int rc = cli_parse(&k_train, &r.o, argc, argv);
    if (rc != CLI_GO) return rc;
    if ((rc = check_options(&r.o)) != 0) return rc;
    if ((rc = cli_dist_start(CMD, &k_train, argc, argv, &r.dist)) != 0) return rc;
    if ((r.o.data && (rc = open_data(&r)) != 0) || (rc = setup(&r)) != 0) goto done;
    FILE *info = cli_dist_info(r.o.json ? stderr : stdout);
    print_header(&r, info);
    if ((rc = train_loop(&r, info)) == 0) rc = finish(&r);
done:
    run_free(&r);
    return cli_dist_end(r.dist, rc);
}
