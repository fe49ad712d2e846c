/* bench_model.c: `dmove bench --model`: the whole BertForMaskedLM's training step (the
 * embeddings, the encoder layers, the MLM head at the scored positions, the optimizer) on
 * random batches. The step's median, then each part's time in profiled steps against its
 * roofline floor: its fused groups' floors as `bench --groups` takes them (at this
 * machine's probed rates, or --roofline's), which `dmove analyze --model` sums per part from
 * the unfused graph (the same contraction flop; the fused rewrite's element-wise flop a
 * little fewer); with --groups every group of the embeddings, of a layer (the layers'
 * mean) and of the head, as `bench --groups` lists a layer's. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench.h"

static const char *const CMD = "bench";

/* the parts with segments: DM_PART_EMBEDDINGS, DM_PART_LAYERS, DM_PART_MLM_HEAD (the
 * optimizer, DM_PART_OPTIMIZER, is timed by the trainer's phases) */
enum { NPARTS = DM_PART_OPTIMIZER };

/* One part of the model: segments first .. first + count - 1 (the same plan each). */
typedef struct {
    int first, count;
    double *gsec;     /* [G * reps + r]: group G's seconds in profiled step r, the segments' mean */
    double *ms;       /* [r]: the part's milliseconds in profiled step r (its segments summed) */
    double flop, cflop, bytes, floor_ms; /* the part's, all its segments (cflop: contractions') */
    bench_result res; /* its groups (a segment's) against their floors */
} model_part;

typedef struct {
    dm_trainer *T;
    int reps;
    model_part part[NPARTS];
    double *buf, *stp, *fwd, *bwd, *opt, *popt; /* [r]: ms; popt the profiled steps' optimizer */
    int32_t *ids, *labels;
} model_run;

static int fail_dm(void) {
    cli_error(CMD, "%s", dm_last_error());
    return -1;
}

static void run_free(model_run *m) {
    for (int p = 0; p < NPARTS; p++) {
        free(m->part[p].gsec);
        bench_result_free(&m->part[p].res);
    }
    free(m->buf);
    free(m->ids);
    free(m->labels);
    dm_trainer_free(m->T);
}

/* A random MLM batch: ids uniform over the vocabulary, 15% of the positions labelled, one
 * at least (a batch with none would make no update: a step not worth timing). */
static void random_batch(model_run *m, const dm_layer_config *cfg, int64_t vocab) {
    cli_rng rng;
    cli_rng_seed(&rng, cfg->seed);
    const int64_t n = cfg->batch * cfg->seq;
    int any = 0;
    for (int64_t k = 0; k < n; k++) {
        m->ids[k] = (int32_t)(cli_rng_u64(&rng) % (uint64_t)vocab);
        m->labels[k] = cli_rng_u64(&rng) % 100 < 15 ? (int32_t)(cli_rng_u64(&rng) % (uint64_t)vocab) : -100;
        any |= m->labels[k] >= 0;
    }
    if (!any) m->labels[0] = m->ids[0];
}

static int setup(model_run *m, const cli_config *c, const bench_model_opts *mo, const dm_layer_options *lo) {
    const dm_layer_config *cfg = &c->cfg;
    memset(m, 0, sizeof *m);
    m->reps = mo->reps;
    const dm_bert_model bm = {.vocab = mo->vocab, .positions = cfg->seq > 512 ? cfg->seq : 512, .types = 2,
                              .pad_id = 0, .predictions = mo->predictions, .xent = DM_XENT_AUTO};
    dm_optim_config optim;
    dm_optim_config_default(&optim);
    optim.clip_norm = 1.0; /* BERT's: the norm pass is part of the step */
    optim.kind = mo->lamb ? DM_OPT_LAMB : DM_OPT_ADAMW;
    if (dm_trainer_new_bert(&m->T, cfg, mo->layers, &bm, lo, &optim) != DM_OK ||
        dm_trainer_init_params(m->T, cfg->seed) != DM_OK)
        return fail_dm();
    const size_t n = (size_t)(cfg->batch * cfg->seq), R = (size_t)m->reps;
    m->ids = malloc(n * sizeof *m->ids);
    m->labels = malloc(n * sizeof *m->labels);
    m->buf = calloc(5 * R, sizeof *m->buf);
    if (!m->ids || !m->labels || !m->buf) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    m->stp = m->buf, m->fwd = m->stp + R, m->bwd = m->fwd + R, m->opt = m->bwd + R, m->popt = m->opt + R;
    random_batch(m, cfg, mo->vocab);
    const int nseg = dm_trainer_num_segments(m->T);
    const int first[NPARTS] = {0, 1, nseg - 1}, count[NPARTS] = {1, mo->layers, 1};
    for (int p = 0; p < NPARTS; p++) {
        model_part *x = &m->part[p];
        x->first = first[p], x->count = count[p];
        x->res.name = dm_model_part_name(p);
        const int G = dm_layer_num_groups(dm_trainer_segment(m->T, x->first));
        if (!(x->gsec = calloc((size_t)(G > 0 ? G : 1) * R + R, sizeof *x->gsec))) {
            cli_error(CMD, "out of memory");
            return -1;
        }
        x->ms = x->gsec + (size_t)(G > 0 ? G : 1) * R;
    }
    return 0;
}

/* One step: the batch, the update; *fwd, *bwd, *opt the phases' milliseconds. */
static int one_step(model_run *m, double *ms, double *fwd, double *bwd, double *opt) {
    double t0[DM_TRAIN_NUM_PHASES], t1[DM_TRAIN_NUM_PHASES], loss;
    dm_trainer_times(m->T, t0);
    const double w0 = cli_now();
    if (dm_trainer_set_mlm_batch(m->T, m->ids, NULL, NULL, m->labels) != DM_OK ||
        dm_trainer_step(m->T, &loss) != DM_OK)
        return fail_dm();
    *ms = 1e3 * (cli_now() - w0);
    dm_trainer_times(m->T, t1);
    *fwd = 1e3 * (t1[DM_TRAIN_FORWARD] - t0[DM_TRAIN_FORWARD] + t1[DM_TRAIN_LOSS] - t0[DM_TRAIN_LOSS]);
    *bwd = 1e3 * (t1[DM_TRAIN_BACKWARD] - t0[DM_TRAIN_BACKWARD]);
    *opt = 1e3 * (t1[DM_TRAIN_OPTIMIZER] - t0[DM_TRAIN_OPTIMIZER]);
    return 0;
}

/* A profiled step (r < 0: untimed): each part's groups and total. */
static int profiled_step(model_run *m, int r) {
    const int nseg = dm_trainer_num_segments(m->T);
    for (int k = 0; k < nseg; k++) {
        dm_layer_profile(dm_trainer_segment(m->T, k), 1);
        dm_layer_profile_reset(dm_trainer_segment(m->T, k));
    }
    double ms, f, b, o;
    int rc = one_step(m, &ms, &f, &b, &o);
    for (int k = 0; k < nseg; k++) dm_layer_profile(dm_trainer_segment(m->T, k), 0);
    if (rc || r < 0) return rc;
    m->popt[r] = o;
    for (int p = 0; p < NPARTS; p++) {
        model_part *x = &m->part[p];
        const int G = dm_layer_num_groups(dm_trainer_segment(m->T, x->first));
        x->ms[r] = 0;
        for (int s = 0; s < x->count; s++) {
            const dm_layer *L = dm_trainer_segment(m->T, x->first + s);
            double t[2][DM_NUM_CLASSES];
            dm_layer_profile_read(L, t);
            for (int k = 0; k < DM_NUM_CLASSES; k++) x->ms[r] += 1e3 * (t[0][k] + t[1][k]);
            for (int g = 0; g < G; g++)
                x->gsec[(size_t)g * (size_t)m->reps + (size_t)r] += dm_layer_group_seconds(L, g) / x->count;
        }
    }
    return 0;
}

/* Each part's flop, bytes and floor: one segment's (its groups against the roofline of
 * bench --groups) times the part's segments. */
static int part_facts(model_run *m, const cli_config *c, const bench_env *env, model_part *x) {
    dm_layer *L = dm_trainer_segment(m->T, x->first);
    double fl[2][DM_NUM_CLASSES];
    dm_layer_flop(L, fl);
    x->flop = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DM_NUM_CLASSES; k++) x->flop += fl[p][k] * x->count;
    x->cflop = (fl[0][DM_CLASS_CONTRACTION] + fl[1][DM_CLASS_CONTRACTION]) * x->count;
    snprintf(x->res.gpu, sizeof x->res.gpu, "%s", dm_layer_note_text(L, "gpu"));
    const int G = dm_layer_num_groups(L);
    if (bench_groups_collect(c, env, L, x->gsec, G, m->reps, &x->res)) return -1;
    x->bytes = x->floor_ms = 0;
    for (int g = 0; g < G; g++) {
        x->bytes += (x->res.groups[g].bytes_read + x->res.groups[g].bytes_written) * x->count;
        if (x->res.floor_s) x->floor_ms += 1e3 * x->res.floor_s[g] * x->count;
    }
    return 0;
}

/* The optimizer's floor: its bytes (as `dmove analyze --model` counts them; LAMB's are
 * AdamW's) at the model's bandwidth; 0 without a model. */
static double optimizer_floor_ms(const model_run *m, double *bytes) {
    *bytes = (double)DM_OPT_BYTES_PER_PARAM * (double)dm_trainer_num_params(m->T);
    const dm_device_model *dev = m->part[DM_PART_LAYERS].res.model;
    return dev && dm_device_model_bandwidth(dev) > 0 ? 1e3 * *bytes / dm_device_model_bandwidth(dev) : 0;
}

static void print_row(const char *name, double gflop, double mb, double ms, double floor_ms, double step_ms) {
    char rt[32];
    printf("%-22s %10.3f %10.1f %10.2f %10.2f %8s %8.1f\n", name, gflop, mb, ms, floor_ms,
           floor_ms > 0 ? dm_ratio_text(ms / floor_ms, rt, sizeof rt) : "-", step_ms > 0 ? 100 * ms / step_ms : 0.0);
}

static void print_table(const model_run *m, const cli_config *c, const bench_model_opts *mo, double step,
                        double fwd, double bwd, double opt, double popt, double obytes, double ofloor) {
    const dm_layer_config *cfg = &c->cfg;
    double flop = 0, floor = ofloor, parts = popt;
    for (int p = 0; p < NPARTS; p++) flop += m->part[p].flop, floor += m->part[p].floor_ms;
    printf("dmove %s bench --model: BertForMaskedLM, %d layers, b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64
           " u=%" PRId64 ", vocabulary %" PRId64 ", up to %" PRId64 " masked positions scored, %s with clipping, dropout %g, "
           "%d threads; medians of %d reps after %d warm-up\n\n", DMOVE_VERSION, mo->layers, cfg->batch, cfg->seq,
           cfg->hidden, cfg->heads, cfg->ffn, mo->vocab, mo->predictions_used, mo->lamb ? "LAMB" : "AdamW",
           cfg->dropout, cli_threads(c->threads), m->reps, mo->warmup);
    printf("step %.2f ms (forward %.2f, backward %.2f, optimizer %.2f), %.1f GFLOP/s; %.1f M parameters\n\n", step,
           fwd, bwd, opt, step > 0 ? flop / (step * 1e-3) / 1e9 : 0.0, dm_trainer_num_params(m->T) / 1e6);
    const bench_result *lr = &m->part[DM_PART_LAYERS].res;
    printf("per part (profiled steps: timers around each group; floors on %s):\n",
           lr->floor_s ? dm_device_model_name(lr->model) : lr->model_note);
    printf("%-22s %10s %10s %10s %10s %8s %8s\n", "part", "GFLOP", "MB moved", "ms", "floor ms", "x floor",
           "% step");
    for (int p = 0; p < NPARTS; p++) {
        const model_part *x = &m->part[p];
        char name[40];
        snprintf(name, sizeof name, p == DM_PART_LAYERS ? "%s (%d)" : "%s", dm_model_part_name(p), x->count);
        double ms = bench_median(x->ms, m->reps);
        parts += ms;
        print_row(name, x->flop / 1e9, x->bytes / 1e6, ms, x->floor_ms, step);
    }
    print_row(dm_model_part_name(DM_PART_OPTIMIZER), 0, obytes / 1e6, popt, ofloor, step);
    /* the parts' medians come from the profiled steps (timers around each group), the step's
     * from the plain ones: the rest is approximate */
    print_row("rest (links, batch)", 0, 0, step > parts ? step - parts : 0, 0, step);
    print_row("step", flop / 1e9, 0, step, floor, step);
    if (ofloor > 0 && popt < ofloor)
        printf("(the optimizer below its floor: it streams faster than the bandwidth the floors take, %.4g GB/s)\n",
               dm_device_model_bandwidth(lr->model) / 1e9);
}

static int print_json(const model_run *m, const cli_config *c, const bench_model_opts *mo, const bench_env *env,
                      double step, double fwd, double bwd, double opt, double popt, double obytes, double ofloor) {
    const dm_layer_config *cfg = &c->cfg;
    cJSON *root = cJSON_CreateObject(), *conf = NULL, *arr = NULL;
    int ok = root && (conf = cJSON_AddObjectToObject(root, "config")) != NULL &&
             bench_jnum(conf, "layers", mo->layers) && bench_jnum(conf, "batch", (double)cfg->batch) &&
             bench_jnum(conf, "seq", (double)cfg->seq) && bench_jnum(conf, "hidden", (double)cfg->hidden) &&
             bench_jnum(conf, "heads", (double)cfg->heads) && bench_jnum(conf, "ffn", (double)cfg->ffn) &&
             bench_jnum(conf, "vocab", (double)mo->vocab) && bench_jnum(conf, "predictions", (double)mo->predictions_used) &&
             cJSON_AddStringToObject(conf, "optimizer", mo->lamb ? "lamb" : "adamw") &&
             bench_jnum(conf, "dropout", cfg->dropout) && bench_jnum(conf, "threads", cli_threads(c->threads)) &&
             bench_jnum(conf, "warmup", mo->warmup) && bench_jnum(conf, "reps", m->reps) &&
             bench_jnum(root, "step_ms", step) && bench_jnum(root, "forward_ms", fwd) &&
             bench_jnum(root, "backward_ms", bwd) && bench_jnum(root, "optimizer_ms", opt) &&
             bench_jnum(root, "parameters", (double)dm_trainer_num_params(m->T)) &&
             (arr = cJSON_AddArrayToObject(root, "parts")) != NULL;
    for (int p = 0; ok && p <= NPARTS; p++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            ok = 0;
            break;
        }
        if (p == NPARTS) {
            ok = cJSON_AddStringToObject(o, "part", dm_model_part_name(DM_PART_OPTIMIZER)) && bench_jnum(o, "ms", popt) &&
                 bench_jnum(o, "bytes", obytes) && bench_jnum(o, "floor_ms", ofloor);
            break;
        }
        const model_part *x = &m->part[p];
        ok = cJSON_AddStringToObject(o, "part", dm_model_part_name(p)) && bench_jnum(o, "segments", x->count) &&
             bench_jnum(o, "ms", bench_median(x->ms, m->reps)) && bench_jnum(o, "flop", x->flop) &&
             bench_jnum(o, "flop_contraction", x->cflop) &&
             bench_jnum(o, "bytes", x->bytes) && bench_jnum(o, "floor_ms", x->floor_ms);
        if (ok && mo->groups) ok = bench_groups_json(o, env, &x->res);
    }
    return bench_json_emit(root, ok);
}

int bench_model_run(const cli_config *c, bench_model_opts *mo, const dm_layer_options *lo, const bench_env *env) {
    model_run m;
    int rc = setup(&m, c, mo, lo);
    const double t_start = cli_now();
    double last = t_start, ms, f, b, o;
    const int total = mo->warmup + 2 * m.reps + 1;
    for (int i = 0; !rc && i < total; i++) {
        const int r = i - mo->warmup;
        if (r < 0) rc = one_step(&m, &ms, &f, &b, &o);
        else if (r < m.reps) rc = one_step(&m, &m.stp[r], &m.fwd[r], &m.bwd[r], &m.opt[r]);
        else rc = profiled_step(&m, r - m.reps - 1); /* the first untimed */
        const double now = cli_now();
        if (!rc && now - t_start > 3.0 && now - last > 1.0 && !mo->json) {
            last = now;
            fprintf(stderr, "bench --model: step %d of %d (~%.0f s left)\n", i + 1, total,
                    (now - t_start) / (i + 1) * (total - i - 1));
        }
    }
    for (int p = 0; !rc && p < NPARTS; p++) rc = part_facts(&m, c, env, &m.part[p]);
    if (!rc) {
        const double step = bench_median(m.stp, m.reps), fwd = bench_median(m.fwd, m.reps),
                     bwd = bench_median(m.bwd, m.reps), opt = bench_median(m.opt, m.reps),
                     popt = bench_median(m.popt, m.reps);
        double obytes;
        const double ofloor = optimizer_floor_ms(&m, &obytes);
        if (mo->json) rc = print_json(&m, c, mo, env, step, fwd, bwd, opt, popt, obytes, ofloor);
        else {
            print_table(&m, c, mo, step, fwd, bwd, opt, popt, obytes, ofloor);
            if (fflush(stdout) != 0) rc = (cli_error(CMD, "cannot write the report to stdout"), -1);
        }
        for (int p = 0; !rc && mo->groups && p < NPARTS; p++) {
            char name[64];
            snprintf(name, sizeof name, p == DM_PART_LAYERS ? "%s (a layer: the mean of %d)" : "%s", dm_model_part_name(p),
                     m.part[p].count);
            m.part[p].res.name = name;
            bench_groups_print(env, &m.part[p].res);
            m.part[p].res.name = dm_model_part_name(p);
        }
    }
    run_free(&m);
    return rc;
}
