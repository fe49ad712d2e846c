/* cmd_train.c: `dmove train`: trains a stack of BERT encoder layers with AdamW on a teacher
 * task (default) or on the user's inputs and targets, with progress, checkpoints (save,
 * resume, pretrained parameters) and a loss chart. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "core/strbuf.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "graph/encoder.h"
#include "train/train.h"

static const char *const CMD = "train";

static void usage(FILE *out) {
    dm_adamw_config a;
    dm_adamw_config_default(&a);
    fprintf(out,
            "usage: dmove train [options]\n"
            "\n"
            "Trains a stack of BERT encoder layers (Hugging Face BertEncoder: post-LayerNorm\n"
            "layers, no embeddings) with AdamW, on the CPU or a GPU, to map each batch's\n"
            "hidden_states to its target: the loss is the mean squared error over the tokens\n"
            "the attention mask keeps. Every layer runs dmove's fused training step; AdamW\n"
            "updates each parameter in one pass over memory. On a GPU (--device cuda) the\n"
            "whole step stays there: layer to layer, the loss and AdamW (over fp32 master\n"
            "weights when --dtype is bf16 or fp16); only the batch goes up, the loss down.\n"
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
            "options:\n"
            "  --layers L       layers in the stack (default 2; BERT-base has 12,\n"
            "                   BERT-large 24)\n"
            "  --steps N        train until update N (default 30; a resumed run continues\n"
            "                   up to it)\n"
            "  --lr LR          peak learning rate (default %g)\n"
            "  --warmup W       steps of linear warm-up from 0 to LR (default 0)\n"
            "  --lr-schedule S  constant (default) or linear: after the warm-up, fall\n"
            "                   linearly towards 0 at step N (BERT's shape; step s of\n"
            "                   the warm-up takes LR*s/W, so no update has rate 0)\n"
            "  --weight-decay D AdamW's decoupled weight decay on the weights, not on biases\n"
            "                   and LayerNorm parameters (default %g)\n"
            "  --beta1 B, --beta2 B, --adam-eps E\n"
            "                   AdamW's moment decays and epsilon (default %g, %g, %g)\n"
            "  --data FILE      train on your samples (above) instead of the teacher\n"
            "  --teacher-scale S\n"
            "                   the teacher's weights are BERT's initialisation times S\n"
            "                   (default 5: N(0, 0.1)); larger makes its function harder\n"
            "  --init FILE      start from these parameters: Hugging Face BertEncoder names\n"
            "                   (encoder.layer.<l>.*, or under bert.; LayerNorm gamma/beta\n"
            "                   too), e.g. a pretrained BERT's model.safetensors (its\n"
            "                   first L layers)\n"
            "  --resume FILE    continue a run from its checkpoint (parameters, AdamW's\n"
            "                   moments, step): the same options give the same result as\n"
            "                   an uninterrupted run\n"
            "  --save FILE      write a checkpoint at the end (atomically; also every\n"
            "                   --save-every K steps, and on Ctrl-C: the step under way\n"
            "                   ends, the checkpoint is written, the exit status is 130)\n"
            "  --save-every K   checkpoint every K steps as well (needs --save)\n"
            "  --until K        stop after step K this time, as if interrupted (the\n"
            "                   schedule still runs to --steps): train a long run in parts,\n"
            "                   each resuming the last one's checkpoint\n"
            "  --log-every K    a progress line every K steps (default: about 15 lines)\n"
            "  --svg FILE       draw the loss curve as an SVG chart\n"
            "  --json           print one JSON object at the end instead of the summary\n"
            "  --schedule S     each layer's step: fused (default) or unfused (one pass over\n"
            "                   memory per operator, as a framework's eager mode)\n"
            "  --plan FILE      run every layer on a plan from `dmove tune` for these sizes\n"
            "                   (layouts and algorithms chosen by measurement)\n",
            a.lr, a.weight_decay, a.beta1, a.beta2, a.eps);
    cli_recompute_help(out, "in every layer; fused schedule");
    cli_device_help(out);
    cli_config_help(out, CLI_CFG_ALL);
    fprintf(out,
            "                   (--seed seeds the dropout masks, the teacher and its data,\n"
            "                   and the initial parameters)\n"
            "  --help           this text\n"
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
            "              --batch 32 --seq 128 --rows auto     (BERT-large's encoder on a GPU)\n");
}

/* --- data ------------------------------------------------------------------------------ */

typedef struct {
    dm_st_file *f;
    const dm_st_tensor *x, *y, *mask;
    int64_t n; /* samples */
} user_data;

static int open_data(const char *path, user_data *d, int64_t *seq, int64_t *hidden) {
    if (dm_st_read(path, &d->f) != DM_OK) {
        cli_error(CMD, "--data: %s", dm_last_error());
        return CLI_FAIL;
    }
    d->x = dm_st_find(d->f, "hidden_states");
    d->y = dm_st_find(d->f, "target");
    d->mask = dm_st_find(d->f, "attention_mask");
    if (!d->x || !d->y) {
        cli_error(CMD, "--data %s: needs tensors 'hidden_states' (N, j, i) and 'target' (N, j, i)%s%s", path,
                  d->x ? "" : "; hidden_states is missing", d->y ? "" : "; target is missing");
        return CLI_FAIL;
    }
    if (d->x->ndim != 3 || d->y->ndim != 3 || memcmp(d->x->shape, d->y->shape, 3 * sizeof(int64_t)) != 0) {
        cli_error(CMD, "--data %s: hidden_states and target must both be (N, j, i), the same shape", path);
        return CLI_FAIL;
    }
    if (d->mask && (d->mask->ndim != 2 || d->mask->shape[0] != d->x->shape[0] || d->mask->shape[1] != d->x->shape[1])) {
        cli_error(CMD, "--data %s: attention_mask must be (N, j) = (%" PRId64 ", %" PRId64 ")", path, d->x->shape[0],
                  d->x->shape[1]);
        return CLI_FAIL;
    }
    d->n = d->x->shape[0];
    *seq = d->x->shape[1];
    *hidden = d->x->shape[2];
    return 0;
}

/* Elements [e0, e0 + n) of a file tensor into out as floats: dm_st_to_f32 on a view of
 * them (every dtype the data may have). */
static dm_status slice_f32(const dm_st_tensor *t, int64_t e0, int64_t n, float *out) {
    const size_t es = dm_st_dtype_size(t->dtype);
    dm_st_tensor v = *t;
    v.data = (const unsigned char *)t->data + (size_t)e0 * es;
    v.nbytes = (size_t)n * es;
    v.ndim = 1;
    v.shape[0] = n;
    return dm_st_to_f32(&v, out, (size_t)n);
}

static int data_dtype_ok(const dm_st_tensor *t) {
    return t->dtype == DM_ST_F32 || t->dtype == DM_ST_F64 || t->dtype == DM_ST_BF16 || t->dtype == DM_ST_F16;
}

/* The flat index of the first NaN or infinity of t, a tensor of `samples` samples of `per`
 * elements, or -1 (-2: out of memory): found when the file is opened, not when training
 * reaches that sample. */
static int64_t first_nonfinite(const dm_st_tensor *t, int64_t samples, int64_t per) {
    float *buf = malloc((size_t)per * sizeof(float));
    if (!buf) return -2;
    int64_t at = -1;
    for (int64_t q = 0; q < samples && at < 0; q++) {
        if (slice_f32(t, q * per, per, buf) != DM_OK) {
            at = q * per; /* not expected: the dtype and size were checked */
            break;
        }
        for (int64_t e = 0; e < per; e++)
            if (!isfinite(buf[e])) {
                at = q * per + e;
                break;
            }
    }
    free(buf);
    return at;
}

/* Step s's batch from the file: samples (s-1)*b .. s*b-1 modulo N. */
static dm_status fill_from_file(const user_data *d, int64_t step, int64_t b, int64_t j, int64_t i, float *x, float *y,
                                float *mask) {
    const int64_t per = j * i;
    for (int64_t q = 0; q < b; q++) {
        const int64_t smp = ((step - 1) * b + q) % d->n;
        DM_TRY(slice_f32(d->x, smp * per, per, x + q * per));
        DM_TRY(slice_f32(d->y, smp * per, per, y + q * per));
        float *m = mask + q * j;
        if (d->mask) {
            DM_TRY(slice_f32(d->mask, smp * j, j, m));
            for (int64_t t = 0; t < j; t++) m[t] = m[t] != 0.0f;
        } else {
            for (int64_t t = 0; t < j; t++) m[t] = 1.0f;
        }
    }
    return DM_OK;
}

/* The teacher task's inputs of step s: N(0, 1) from Philox (the seed, stream 2001,
 * counter s * b*j*i + element), and a padding mask keeping j - (w mod (j/4 + 1)) tokens of
 * each sequence but the first (whole). */
static void fill_teacher_inputs(uint64_t seed, int64_t step, int64_t b, int64_t j, int64_t i, float *x, float *mask) {
    const int64_t n = b * j * i;
#pragma omp parallel for schedule(static)
    for (int64_t e0 = 0; e0 < n; e0 += 2048) {
        uint32_t w[2048];
        const int64_t m = n - e0 < 2048 ? n - e0 : 2048;
        dm_philox_words(seed, 2001u, (uint64_t)(step * n + e0), (m + 1) & ~(int64_t)1, w);
        for (int64_t k = 0; k < m; k += 2) {
            double u1 = ((double)w[k] + 1.0) / 4294967297.0, u2 = (double)w[k + 1] / 4294967296.0;
            double r = sqrt(-2.0 * log(u1));
            x[e0 + k] = (float)(r * cos(6.283185307179586 * u2));
            if (k + 1 < m) x[e0 + k + 1] = (float)(r * sin(6.283185307179586 * u2));
        }
    }
    for (int64_t q = 0; q < b; q++) {
        uint32_t w;
        dm_philox_words(seed, 2002u, (uint64_t)(step * b + q), 1, &w);
        int64_t keep = q == 0 ? j : j - (int64_t)(w % (uint32_t)(j / 4 + 1));
        for (int64_t t = 0; t < j; t++) mask[q * j + t] = t < keep ? 1.0f : 0.0f;
    }
}

/* --- the command ----------------------------------------------------------------------- */

/* Ctrl-C (SIGINT) or SIGTERM during a run: the step under way finishes, the checkpoint
 * (--save) is written, and the run ends with status 130; a second signal ends it at once
 * (the handler is reset to the default by the first). */
static volatile sig_atomic_t g_interrupted;

static void on_signal(int sig) {
    static const char msg[] = "\ndmove train: interrupted: finishing this step, then saving the checkpoint "
                              "(again to quit at once)\n";
    g_interrupted = sig;
    /* the next SIGINT or SIGTERM, whichever comes, ends the run at once */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    (void)sigaction(SIGINT, &dfl, NULL);
    (void)sigaction(SIGTERM, &dfl, NULL);
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGINT, &sa, NULL); /* without it, a signal ends the run as before */
    (void)sigaction(SIGTERM, &sa, NULL);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail_dm(const char *what) {
    cli_error(CMD, "%s%s", what, dm_last_error());
    return CLI_FAIL;
}

static float *tensor(dm_trainer *t, const char *name) {
    float *p = NULL;
    return dm_trainer_tensor(t, name, &p, NULL, NULL) == DM_OK ? p : NULL;
}

static void fmt_secs(char *buf, size_t n, double s) {
    if (s < 90) snprintf(buf, n, "%.0f s", s);
    else if (s < 5400) snprintf(buf, n, "%.1f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}

int cmd_train(int argc, char **argv) {
    cli_config c;
    cli_config_init(&c, CLI_CFG_ALL);
    dm_adamw_config adam;
    dm_adamw_config_default(&adam);
    int layers = 2, json = 0, linear = 0, unfused = 0, recompute = 0, streams = 0;
    dm_device_kind device = DM_DEVICE_CPU;
    dm_dtype dtype = DM_DTYPE_FP32;
    dm_rows rows = DM_ROWS_DEFAULT;
    int64_t steps = 30, save_every = 0, log_every = 0, until = 0;
    double teacher_scale = 5.0;
    const char *data = NULL, *init = NULL, *resume = NULL, *save = NULL, *svg = NULL, *plan = NULL;
    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return CLI_OK;
        }
#define OPT(name) ((r = cli_opt(CMD, argc, argv, &a, name, &v)) != 0)
        if (OPT("--layers")) {
            if (r < 0 || cli_parse_int(CMD, "--layers", v, 1, 256, &layers)) return CLI_USAGE;
        } else if (OPT("--steps")) {
            if (r < 0 || cli_parse_i64(CMD, "--steps", v, 1, INT64_C(1000000000), &steps)) return CLI_USAGE;
        } else if (OPT("--lr")) {
            if (r < 0 || cli_parse_double(CMD, "--lr", v, &adam.lr)) return CLI_USAGE;
        } else if (OPT("--warmup")) {
            if (r < 0 || cli_parse_i64(CMD, "--warmup", v, 0, INT64_C(1000000000), &adam.warmup)) return CLI_USAGE;
        } else if (OPT("--lr-schedule")) {
            if (r < 0) return CLI_USAGE;
            if (strcmp(v, "constant") && strcmp(v, "linear")) {
                cli_usage_error(CMD, "--lr-schedule: '%s' is not constant or linear", v);
                return CLI_USAGE;
            }
            linear = !strcmp(v, "linear");
        } else if (OPT("--schedule")) {
            if (r < 0) return CLI_USAGE;
            if (strcmp(v, "fused") && strcmp(v, "unfused")) {
                cli_usage_error(CMD, "--schedule: unknown schedule '%s' (known: fused, unfused; the learning "
                                "rate's is --lr-schedule)", v);
                return CLI_USAGE;
            }
            unfused = !strcmp(v, "unfused");
        } else if (OPT("--plan")) {
            if (r < 0) return CLI_USAGE;
            plan = v;
        } else if (OPT("--weight-decay")) {
            if (r < 0 || cli_parse_double(CMD, "--weight-decay", v, &adam.weight_decay)) return CLI_USAGE;
        } else if (OPT("--beta1")) {
            if (r < 0 || cli_parse_double(CMD, "--beta1", v, &adam.beta1)) return CLI_USAGE;
        } else if (OPT("--beta2")) {
            if (r < 0 || cli_parse_double(CMD, "--beta2", v, &adam.beta2)) return CLI_USAGE;
        } else if (OPT("--adam-eps")) {
            if (r < 0 || cli_parse_double(CMD, "--adam-eps", v, &adam.eps)) return CLI_USAGE;
        } else if (OPT("--teacher-scale")) {
            if (r < 0 || cli_parse_double(CMD, "--teacher-scale", v, &teacher_scale)) return CLI_USAGE;
            if (!(teacher_scale > 0 && teacher_scale <= 100)) {
                cli_usage_error(CMD, "--teacher-scale: %s is outside (0, 100]", v);
                return CLI_USAGE;
            }
        } else if (OPT("--data")) {
            if (r < 0) return CLI_USAGE;
            data = v;
        } else if (OPT("--init")) {
            if (r < 0) return CLI_USAGE;
            init = v;
        } else if (OPT("--resume")) {
            if (r < 0) return CLI_USAGE;
            resume = v;
        } else if (OPT("--save")) {
            if (r < 0) return CLI_USAGE;
            save = v;
        } else if (OPT("--save-every")) {
            if (r < 0 || cli_parse_i64(CMD, "--save-every", v, 1, INT64_C(1000000000), &save_every)) return CLI_USAGE;
        } else if (OPT("--until")) {
            if (r < 0 || cli_parse_i64(CMD, "--until", v, 1, INT64_C(1000000000), &until)) return CLI_USAGE;
        } else if (OPT("--log-every")) {
            if (r < 0 || cli_parse_i64(CMD, "--log-every", v, 1, INT64_C(1000000000), &log_every)) return CLI_USAGE;
        } else if (OPT("--svg")) {
            if (r < 0) return CLI_USAGE;
            svg = v;
        } else if ((r = cli_flag(CMD, argv, a, "--json")) != 0) {
            if (r < 0) return CLI_USAGE;
            json = 1;
        } else if ((r = cli_flag(CMD, argv, a, "--recompute")) != 0) {
            if (r < 0) return CLI_USAGE;
            recompute = 1;
        } else if ((r = cli_device_option(CMD, argc, argv, &a, &device, &dtype, &rows, &streams)) != 0) {
            if (r < 0) return CLI_USAGE;
        } else if ((r = cli_config_option(&c, CMD, argc, argv, &a)) != 0) {
            if (r < 0) return CLI_USAGE;
        } else {
            return cli_unknown(CMD, argv[a], "");
        }
#undef OPT
    }
    if (init && resume) {
        cli_usage_error(CMD, "--init and --resume both give the starting parameters: use one (a checkpoint "
                        "already holds them)");
        return CLI_USAGE;
    }
    if (until && !save) {
        cli_usage_error(CMD, "--until needs --save FILE (the checkpoint the run resumes from)");
        return CLI_USAGE;
    }
    if (save_every && !save) {
        cli_usage_error(CMD, "--save-every needs --save FILE (where to write the checkpoints)");
        return CLI_USAGE;
    }
    if (data && teacher_scale != 5.0) {
        cli_usage_error(CMD, "--teacher-scale applies to the teacher task, not to --data");
        return CLI_USAGE;
    }
    if (until > steps) {
        cli_usage_error(CMD, "--until %" PRId64 " is past --steps %" PRId64 " (the run's last step)", until, steps);
        return CLI_USAGE;
    }
    const int64_t stop = until ? until : steps;
    if (linear) adam.total = steps;
    if (dm_adamw_config_check(&adam) != DM_OK) {
        cli_usage_error(CMD, "%s", dm_last_error());
        return CLI_USAGE;
    }
    const char *outs[2] = {save, svg}, *outn[2] = {"--save", "--svg"};
    for (int k = 0; k < 2; k++)
        if (outs[k]) {
            int bad = cli_check_output(CMD, outn[k], outs[k]);
            if (bad) return bad;
        }

    user_data ud = {0};
    int rc = CLI_FAIL;
    dm_trainer *T = NULL, *teacher = NULL;
    double *losses = NULL, *step_secs = NULL;
    if (data) {
        int64_t seq, hid;
        if ((rc = open_data(data, &ud, &seq, &hid)) != 0) goto done;
        rc = CLI_USAGE;
        if ((c.size_set[1] && c.size[1] != seq) || (c.size_set[2] && c.size[2] != hid)) {
            cli_usage_error(CMD, "--data holds sequences of %" PRId64 " tokens of width %" PRId64
                            ": leave --seq and --hidden out (they come from the file)", seq, hid);
            goto done;
        }
        if (!data_dtype_ok(ud.x) || !data_dtype_ok(ud.y) || (ud.mask && !data_dtype_ok(ud.mask) &&
                                                             ud.mask->dtype != DM_ST_I64 && ud.mask->dtype != DM_ST_I32 &&
                                                             ud.mask->dtype != DM_ST_U8 && ud.mask->dtype != DM_ST_BOOL)) {
            cli_error(CMD, "--data: hidden_states and target must be f32, f64, bf16 or f16 (attention_mask may also "
                      "be i64, i32, u8 or bool)");
            rc = CLI_FAIL;
            goto done;
        }
        for (int q = 0; q < 2; q++) {
            const dm_st_tensor *t = q ? ud.y : ud.x;
            const int64_t at = first_nonfinite(t, ud.n, seq * hid);
            if (at == -2) {
                cli_error(CMD, "out of memory checking --data");
                rc = CLI_FAIL;
                goto done;
            }
            if (at >= 0) {
                cli_error(CMD, "--data %s: %s has a NaN or infinity in sample %" PRId64 " (flat index %" PRId64
                          "): training on it would stop there", data, t->name, at / (seq * hid), at);
                rc = CLI_FAIL;
                goto done;
            }
        }
        c.size[1] = seq, c.size_set[1] = 1;
        c.size[2] = hid, c.size_set[2] = 1;
    }
    if (cli_config_finish(&c, CMD, 1)) {
        rc = CLI_USAGE;
        goto done;
    }
    const dm_layer_config *cfg = &c.cfg;
    const int64_t b = cfg->batch, j = cfg->seq, I = cfg->hidden;
    if (data && ud.n < b) {
        cli_usage_error(CMD, "--data holds %" PRId64 " samples, fewer than a batch (--batch %" PRId64 ")", ud.n, b);
        rc = CLI_USAGE;
        goto done;
    }
    rc = CLI_FAIL;
    dm_layer_options opt = {.threads = c.threads, .schedule = unfused ? DM_SCHED_UNFUSED : DM_SCHED_FUSED,
                            .plan = plan, .recompute = recompute, .device = device, .dtype = dtype,
                            .rows = rows, .streams = streams};
    if (cli_options_check(CMD, &opt)) {
        rc = CLI_USAGE;
        goto done;
    }
    if (plan && unfused) {
        cli_usage_error(CMD, "--plan is a plan of the fused schedule: leave out --schedule unfused");
        rc = CLI_USAGE;
        goto done;
    }
    if (dm_trainer_new(&T, cfg, layers, &opt, &adam) != DM_OK) {
        rc = fail_dm("");
        goto done;
    }
    {
        /* what this run trains on: a checkpoint of another run is not resumed */
        char tag[128];
        const char *base = data ? strrchr(data, '/') : NULL;
        if (data) snprintf(tag, sizeof tag, "data %.100s", base ? base + 1 : data);
        else snprintf(tag, sizeof tag, "teacher scale %.17g", teacher_scale);
        if (dm_trainer_set_run_tag(T, tag) != DM_OK) {
            rc = fail_dm("");
            goto done;
        }
    }
    if (resume) {
        if (dm_trainer_load(T, resume) != DM_OK) {
            rc = fail_dm("--resume: ");
            goto done;
        }
    } else if (init) {
        if (dm_trainer_load_params(T, init) != DM_OK) {
            rc = fail_dm("--init: ");
            goto done;
        }
    } else if (dm_trainer_init_params(T, cfg->seed) != DM_OK) {
        rc = fail_dm("");
        goto done;
    }
    const int64_t start = dm_trainer_step_count(T);
    if (start >= stop) {
        cli_usage_error(CMD, "the checkpoint is at step %" PRId64 ", already at %s %" PRId64
                        ": give a larger one to go on", start, until ? "--until" : "--steps", stop);
        rc = CLI_USAGE;
        goto done;
    }
    if (!data) {
        dm_layer_config tc = *cfg;
        tc.dropout = 0.0;
        /* on the trainer's device: its forward pass makes each step's targets (with the
         * generated kernels rather than auto's per-group timing of both, at creation) */
        dm_layer_options to = {.threads = c.threads, .forward_only = 1, .device = device, .dtype = dtype,
                               .rows = rows == DM_ROWS_AUTO ? DM_ROWS_GEN : rows, .streams = streams};
        if (dm_trainer_new(&teacher, &tc, layers, &to, NULL) != DM_OK ||
            dm_trainer_init_params(teacher, cfg->seed ^ 0x7465616368657200ull /* "teacher" */) != DM_OK) {
            rc = fail_dm("the teacher: ");
            goto done;
        }
        char name[160];
        for (int l = 0; l < layers; l++)
            for (int k = 0; k < DM_NUM_PARAMS; k++) {
                float *p;
                int nd;
                int64_t sh[4];
                snprintf(name, sizeof name, "encoder.layer.%d.%s", l, dm_param_names[k]);
                if (dm_trainer_tensor(teacher, name, &p, &nd, sh) != DM_OK) {
                    rc = fail_dm("the teacher: ");
                    goto done;
                }
                if (nd == 2)
                    for (int64_t e = 0; e < sh[0] * sh[1]; e++) p[e] *= (float)teacher_scale;
            }
    }
    float *x = tensor(T, "hidden_states"), *y = tensor(T, "target"), *mask = tensor(T, "attention_mask");
    float *tx = teacher ? tensor(teacher, "hidden_states") : NULL, *tm = teacher ? tensor(teacher, "attention_mask") : NULL;
    float *ty = teacher ? tensor(teacher, "output") : NULL;
    if (!x || !y || !mask || (teacher && (!tx || !tm || !ty))) {
        rc = fail_dm("internal: ");
        goto done;
    }
    const int64_t todo = stop - start;
    /* the per-step history grows as the run goes (a long --steps costs no memory up front) */
    int64_t cap = todo < 4096 ? todo : 4096;
    if (!(losses = malloc((size_t)cap * sizeof(double))) || !(step_secs = malloc((size_t)cap * sizeof(double)))) {
        cli_error(CMD, "out of memory");
        goto done;
    }
    if (!log_every) log_every = todo <= 15 ? 1 : (todo + 14) / 15;
    const int64_t np = dm_trainer_num_params(T);
    FILE *info = json ? stderr : stdout;
    char lrb[32];
    dm_fmt_exact(lrb, sizeof lrb, adam.lr);
    char where[128];
    if (device == DM_DEVICE_CUDA)
        snprintf(where, sizeof where, "on the GPU (%s storage%s)", dm_dtype_name(dtype), cli_emulated_note(device));
    else snprintf(where, sizeof where, "%d thread%s", cli_threads(c.threads), cli_threads(c.threads) > 1 ? "s" : "");
    fprintf(info, "dmove train: %d layer%s (i=%" PRId64 " h=%" PRId64 " u=%" PRId64 ", %s%s; %.2fM parameters), "
                  "batches of b=%" PRId64 " j=%" PRId64 ", dropout %g, %s\n",
            layers, layers > 1 ? "s" : "", I, cfg->heads, cfg->ffn, dm_act_name(cfg->act), cli_variant(cfg),
            (double)np / 1e6, b, j, cfg->dropout, where);
    fprintf(info, "  data: %s\n", data ? data : "the teacher task (a random stack to imitate; inputs N(0, 1))");
    fprintf(info, "  AdamW: lr %s%s%s, weight decay %g; %s%s; steps %" PRId64 " to %" PRId64 " of %" PRId64 "\n", lrb,
            adam.warmup ? ", warm-up" : "", linear ? ", linear decay" : "", adam.weight_decay,
            resume ? "resumed from " : init ? "parameters from " : "BERT initialisation", resume ? resume : init ? init : "",
            start + 1, stop, steps);
    fflush(info);

    double t_begin = cli_now(), t_data = 0.0, t_save = 0.0, t_last = t_begin;
    int64_t last_logged = start, ran = 0;
    catch_signals();
    for (int64_t s = start + 1; s <= stop && !g_interrupted; s++) {
        double t0 = cli_now();
        if (data) {
            if (fill_from_file(&ud, s, b, j, I, x, y, mask) != DM_OK) {
                rc = fail_dm("--data: ");
                goto done;
            }
        } else {
            fill_teacher_inputs(cfg->seed, s, b, j, I, tx, tm);
            double tl;
            if (dm_trainer_forward(teacher, &tl) != DM_OK) {
                rc = fail_dm("the teacher: ");
                goto done;
            }
            memcpy(x, tx, (size_t)(b * j * I) * sizeof(float));
            memcpy(y, ty, (size_t)(b * j * I) * sizeof(float));
            memcpy(mask, tm, (size_t)(b * j) * sizeof(float));
        }
        t_data += cli_now() - t0;
        double loss, ts = cli_now(), up0[DM_TRAIN_NUM_PHASES], up1[DM_TRAIN_NUM_PHASES];
        dm_trainer_times(T, up0);
        if (dm_trainer_step(T, &loss) != DM_OK) {
            char where[128];
            snprintf(where, sizeof where, "step %" PRId64 ": ", s);
            rc = fail_dm(where);
            /* the failed step changed nothing: keep what the steps before it learned */
            if (save && s > start + 1) {
                if (dm_trainer_save(T, save) == DM_OK)
                    cli_error(CMD, "the state after step %" PRId64 " is saved to %s", s - 1, save);
                else
                    cli_error(CMD, "and the state after step %" PRId64 " could not be saved: %s", s - 1, dm_last_error());
            }
            goto done;
        }
        if (s - start > cap) {
            cap = cap * 2 < todo ? cap * 2 : todo;
            double *l2 = realloc(losses, (size_t)cap * sizeof(double));
            if (l2) losses = l2;
            double *s2 = l2 ? realloc(step_secs, (size_t)cap * sizeof(double)) : NULL;
            if (s2) step_secs = s2;
            if (!l2 || !s2) {
                cli_error(CMD, "out of memory for the loss history at step %" PRId64, s);
                goto done;
            }
        }
        /* the step without sending its batch up (on a GPU: the data's cost, as the teacher's) */
        dm_trainer_times(T, up1);
        step_secs[s - start - 1] = cli_now() - ts - (up1[DM_TRAIN_INPUT] - up0[DM_TRAIN_INPUT]);
        losses[s - start - 1] = loss;
        ran = s - start;
        if (save && save_every && s % save_every == 0 && s < stop) {
            double t1 = cli_now();
            if (dm_trainer_save(T, save) != DM_OK) {
                rc = fail_dm("--save: ");
                goto done;
            }
            t_save += cli_now() - t1;
        }
        if ((s - start) % log_every == 0 || s == stop || s == start + 1 || g_interrupted) {
            double t = cli_now(), per = (t - t_last) / (double)(s - last_logged);
            char eta[32];
            fmt_secs(eta, sizeof eta, per * (double)(stop - s));
            fprintf(info, "step %*" PRId64 "/%" PRId64 "  loss %.6f  lr %.2e  %.3f s/step  %.0f tokens/s  eta %s\n",
                    (int)snprintf(NULL, 0, "%" PRId64, steps), s, steps, loss, dm_adamw_lr(&adam, s), per,
                    (double)(b * j) / per, eta);
            fflush(info);
            t_last = t;
            last_logged = s;
        }
    }
    double t_total = cli_now() - t_begin;
    const int64_t last = start + ran;
    if (save && ran > 0) {
        double t1 = cli_now();
        if (dm_trainer_save(T, save) != DM_OK) {
            rc = fail_dm("--save: ");
            goto done;
        }
        t_save += cli_now() - t1;
    }
    if (svg) {
        char title[160];
        snprintf(title, sizeof title, "dmove train: %d layer%s, i=%" PRId64 ", b=%" PRId64 " j=%" PRId64 ", lr %s",
                 layers, layers > 1 ? "s" : "", I, b, j, lrb);
        if (ran > 0 && dm_loss_svg(losses, ran, start + 1, title, svg) != DM_OK) {
            rc = fail_dm("--svg: ");
            goto done;
        }
    }
    double ph[DM_TRAIN_NUM_PHASES];
    dm_trainer_times(T, ph);
    /* AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter per step */
    if (ran == 0) {
        cli_error(CMD, "interrupted before the first step ended: nothing trained, nothing saved");
        rc = 130;
        goto done;
    }
    const double opt_gbs = ph[DM_TRAIN_OPTIMIZER] > 0 ? 28.0 * (double)np * (double)ran / ph[DM_TRAIN_OPTIMIZER] / 1e9 : 0;
    const double n = (double)ran;
    /* the median training step (forward, loss, backward, AdamW; not the data) */
    qsort(step_secs, (size_t)ran, sizeof(double), cmp_double);
    const double med = ran % 2 ? step_secs[ran / 2] : 0.5 * (step_secs[ran / 2 - 1] + step_secs[ran / 2]);
    const double step_flop = dm_trainer_step_flop(T);
    dm_layer_memory mem;
    size_t opt_bytes;
    dm_trainer_memory_info(T, &mem, &opt_bytes);
    if (json) {
        printf("{\"layers\":%d,\"params\":%" PRId64 ",\"batch\":%" PRId64 ",\"seq\":%" PRId64 ",\"hidden\":%" PRId64
               ",\"heads\":%" PRId64 ",\"ffn\":%" PRId64 ",\"dropout\":%.17g,\"lr\":%.17g,\"first_step\":%" PRId64
               ",\"last_step\":%" PRId64 ",\"data\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"loss\":[",
               layers, np, b, j, I, cfg->heads, cfg->ffn, cfg->dropout, adam.lr, start + 1, last,
               data ? "file" : "teacher", dm_device_kind_name(device), dm_dtype_name(dtype));
        for (int64_t k = 0; k < ran; k++) printf("%s%.9g", k ? "," : "", losses[k]);
        printf("],\"ms_per_step\":{\"data\":%.4f,\"input\":%.4f,\"forward\":%.4f,\"loss\":%.4f,\"backward\":%.4f,"
               "\"optimizer\":%.4f,\"total\":%.4f},\"step_ms_median\":%.4f,\"step_flop\":%.6g,\"gflop_per_s\":%.2f,"
               "\"optimizer_gb_per_s\":%.3f,\"tokens_per_s\":%.1f,"
               "\"memory_bytes\":{\"arenas\":%zu,\"intermediates\":%zu,\"scratch\":%zu,\"optimizer\":%zu}}\n",
               1e3 * t_data / n, 1e3 * ph[DM_TRAIN_INPUT] / n, 1e3 * ph[DM_TRAIN_FORWARD] / n, 1e3 * ph[DM_TRAIN_LOSS] / n,
               1e3 * ph[DM_TRAIN_BACKWARD] / n, 1e3 * ph[DM_TRAIN_OPTIMIZER] / n, 1e3 * (t_total - t_save) / n,
               1e3 * med, step_flop, step_flop / med / 1e9, opt_gbs, (double)(b * j) * n / (t_total - t_save), mem.arena,
               mem.activations, mem.scratch, opt_bytes);
    } else {
        printf("\nloss %.6f (step %" PRId64 ") -> %.6f (step %" PRId64 ")\n", losses[0], start + 1, losses[ran - 1],
               last);
        char up[64] = "";
        if (device == DM_DEVICE_CUDA) snprintf(up, sizeof up, ", batch to the GPU %.1f", 1e3 * ph[DM_TRAIN_INPUT] / n);
        printf("time per step %.1f ms: %s %.1f%s, forward %.1f, loss %.1f, backward %.1f, AdamW %.1f (%.1f GB/s)\n",
               1e3 * (t_total - t_save) / n, data ? "reading data" : "teacher", 1e3 * t_data / n, up,
               1e3 * ph[DM_TRAIN_FORWARD] / n, 1e3 * ph[DM_TRAIN_LOSS] / n, 1e3 * ph[DM_TRAIN_BACKWARD] / n,
               1e3 * ph[DM_TRAIN_OPTIMIZER] / n, opt_gbs);
        printf("median training step (forward, loss, backward, AdamW): %.1f ms, %.1f GFLOP of the layers: %.1f %s\n",
               1e3 * med, step_flop / 1e9, step_flop / med / (device == DM_DEVICE_CUDA ? 1e12 : 1e9),
               device == DM_DEVICE_CUDA ? "TFLOP/s" : "GFLOP/s");
        printf("memory%s: %.1f MB (the layers' arenas %.1f MB, of them intermediates %.1f MB%s; scratch %.1f MB; "
               "AdamW's moments%s %.1f MB)\n", device == DM_DEVICE_CUDA ? " on the GPU" : "",
               (double)(mem.arena + mem.scratch + opt_bytes) / 1e6, mem.arena / 1e6, mem.activations / 1e6,
               recompute ? ", attention recomputed" : "", mem.scratch / 1e6,
               device == DM_DEVICE_CUDA && dtype != DM_DTYPE_FP32 ? " and fp32 master weights" : "", opt_bytes / 1e6);
        if (save && last < steps)
            printf("checkpoint: %s (step %" PRId64 " of %" PRId64 "; continue with the same options and --resume %s)\n",
                   save, last, steps, save);
        else if (save)
            printf("checkpoint: %s (step %" PRId64 "; go on with --resume %s and a larger --steps)\n", save, last, save);
        if (svg) printf("loss chart: %s\n", svg);
    }
    rc = fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
    if (g_interrupted && last < stop) {
        if (save)
            cli_error(CMD, "interrupted after step %" PRId64 " of %" PRId64 ": checkpoint saved to %s; continue with "
                      "the same options and --resume %s", last, steps, save, save);
        else
            cli_error(CMD, "interrupted after step %" PRId64 " of %" PRId64 " (without --save, nothing was kept)", last,
                      steps);
        rc = 130;
    }
done:
    free(losses);
    free(step_secs);
    dm_trainer_free(T);
    dm_trainer_free(teacher);
    dm_st_free(ud.f);
    return rc;
}
