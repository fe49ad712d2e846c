/* cmd_analyze.c: `dmove analyze`: the dataflow analysis of one encoder layer's training
 * step (or, --model, the whole BertForMaskedLM's, by part) on a device model: per operator flop, bytes, intensity, roofline bound and
 * predicted time; per class shares; unfused vs fused bytes and floors; the fused groups;
 * the memory the step holds (what the forward keeps; intermediates per plan).
 * As a table (default), --json, --csv or an SVG roofline chart; --measure adds achieved
 * rates and MUE from a profiled run on this CPU. Builds only the graph and plans (no
 * tensors) unless --measure, so any size analyses instantly. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"

static const char *const CMD = "analyze";

typedef struct {
    const char *device, *profile, *svg, *planfile, *config;
    int dtype_bytes, json, csv, measure, reps, recompute, model, layers, model_set;
    int64_t vocab, positions, types, predictions;
    int positions_from_config;
    cli_config c;
} analyze_opts;

static void init(void *p) {
    analyze_opts *o = p;
    o->device = "cpu";
    o->dtype_bytes = 4;
    o->reps = 5;
    o->layers = 12;
    o->vocab = 30522;
    o->positions = 512;
    o->types = 2;
    cli_config_init(&o->c, CLI_CFG_ALL);
}

static int opt_device(void *base, const char *cmd, const char *v, const char *raw) {
    dm_device_model *m = NULL;
    if (strcmp(v, "cpu") != 0 && dm_device_model_preset(&m, v) != DM_OK) {
        cli_usage_error(cmd, "--device: unknown device '%s' (known: %s)", v, dm_device_names());
        return -1;
    }
    dm_device_model_free(m);
    ((analyze_opts *)base)->device = v;
    return 0;
}

static const cli_choice k_dtypes[] = {{"fp32", 4}, {"bf16", 2}, {"fp16", 2}, {NULL, 0}};

static const cli_option k_options[] = {
    CLI_CONFIG(analyze_opts, c, CLI_CFG_ALL),
    {.kind = CLI_CALL, .name = "--device", .arg = "D", .fn = opt_device,
     .help = "cpu (default; the profile from `dmove probe`), v100, a100,\n"
             "h100, h200 (datasheet rates, SXM boards)"},
    {.kind = CLI_PATH, .name = "--profile", .arg = "FILE", .off = offsetof(analyze_opts, profile),
     .help = "CPU profile (default $XDG_CACHE_HOME/dmove/cpu-profile.json\n"
             "or ~/.cache/dmove/cpu-profile.json)"},
    {.kind = CLI_CHOICE, .name = "--dtype", .arg = "T", .off = offsetof(analyze_opts, dtype_bytes),
     .choices = k_dtypes, .msg = "--dtype: unknown dtype '%s' (known: fp32, bf16, fp16)",
     .help = "fp32 (default), bf16 or fp16: the bytes per element, and the\n"
             "contraction rate (tensor cores for bf16/fp16 on GPUs)"},
    {.kind = CLI_FLAG, .name = "--json", .off = offsetof(analyze_opts, json), .lo = 1,
     .help = "one JSON object: ops, groups, classes, totals, device, config"},
    {.kind = CLI_FLAG, .name = "--csv", .off = offsetof(analyze_opts, csv), .lo = 1,
     .help = "the operator table as CSV"},
    {.kind = CLI_PATH, .name = "--svg", .arg = "FILE", .off = offsetof(analyze_opts, svg),
     .help = "write a log-log roofline chart (one point per operator)"},
    {.kind = CLI_STR, .name = "--plan", .arg = "FILE", .off = offsetof(analyze_opts, planfile),
     .help = "show the layouts and contraction algorithms of a plan from\n"
             "`dmove tune` (for the same sizes), and which GEMMs it runs\n"
             "side by side; with --json, as its \"plan\" object (layouts by\n"
             "tensor, algorithms by contraction, \"side_by_side\" pairs)"},
    {.kind = CLI_FLAG, .name = "--measure", .off = offsetof(analyze_opts, measure), .lo = 1,
     .help = "also run the unfused step on this CPU (device cpu, fp32) and\n"
             "add per operator achieved ms, GB/s, GFLOP/s, %% of its\n"
             "roofline and MUE (see README)"},
    {.kind = CLI_INT, .name = "--reps", .arg = "N", .off = offsetof(analyze_opts, reps), .lo = 1, .hi = 100000,
     .help = "profiled steps for --measure (default {}, after 2 warm-up)"},
    {.kind = CLI_FLAG, .name = "--recompute", .off = offsetof(analyze_opts, recompute), .lo = 1,
     .help = "the fused plan with attention's probabilities recomputed in\n"
             "the backward (Q K^T, mask, softmax, dropout again, inside the\n"
             "backward attention group) instead of kept from the forward"},
    {.kind = CLI_FLAG, .name = "--model", .off = offsetof(analyze_opts, model), .lo = 1,
     .help = "the whole BertForMaskedLM's step instead (dmove pretrain's:\n"
             "embeddings, --layers layers, the MLM head at the scored\n"
             "positions, clipping and AdamW): flop, bytes and floors by\n"
             "part and class (table or --json)"},
    {.kind = CLI_PATH, .name = "--config", .arg = "FILE", .off = offsetof(analyze_opts, config),
     .help = "with --model: a Hugging Face config.json gives the sizes,\n"
             "the layers, the vocabulary, positions and token types"},
    {.kind = CLI_INT, .name = "--layers", .arg = "L", .set = offsetof(analyze_opts, model_set) + 1, .off = offsetof(analyze_opts, layers), .lo = 1, .hi = 256,
     .help = "with --model: encoder layers (default {})"},
    {.kind = CLI_I64, .name = "--vocab", .arg = "V", .set = offsetof(analyze_opts, model_set) + 1, .off = offsetof(analyze_opts, vocab), .lo = 2,
     .hi = INT64_C(1) << 24, .help = "with --model: vocabulary size (default {})"},
    {.kind = CLI_I64, .name = "--positions", .arg = "P", .set = offsetof(analyze_opts, model_set) + 1, .off = offsetof(analyze_opts, positions), .lo = 1,
     .hi = INT64_C(1) << 24, .help = "with --model: position embeddings (default {})"},
    {.kind = CLI_I64, .name = "--types", .arg = "T", .set = offsetof(analyze_opts, model_set) + 1, .off = offsetof(analyze_opts, types), .lo = 1,
     .hi = 1 << 16, .help = "with --model: token types (default {})"},
    {.kind = CLI_I64, .name = "--predictions", .arg = "M", .off = offsetof(analyze_opts, predictions), .lo = 0,
     .hi = INT64_C(1) << 40, .help = "with --model: positions the head scores (0 or absent: the\n"
                                     "default, b * ceil(j / 5))"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_analyze = {
    .name = "analyze",
    .head = "usage: dmove analyze [options]\n"
            "\n"
            "Analyses one training step (forward + backward) of a BERT encoder layer without\n"
            "running it: for every graph operator its class, flop, bytes read and written\n"
            "(each input once, each output once, in --dtype), operational intensity (flop/byte)\n"
            "and, on the --device model, whether it is memory- or compute-bound and its\n"
            "predicted time max(flop / peak, bytes / bandwidth), where peak is the contraction\n"
            "rate for contractions and the vector rate for the rest. Then per class the %% of\n"
            "flop vs %% of predicted time; the bytes of the unfused schedule (every operator's\n"
            "own I/O) vs the fused one (per fused group: its materialized external inputs\n"
            "read once and materialized outputs written once), the reduction in %%, and the\n"
            "roofline floor (sum of predicted times) of each; and the fused groups, as the\n"
            "device's executor groups them (the CPU's plans also put attention's dV into\n"
            "the backward attention group, which reads the same P and dC; GPU plans do not).\n"
            "Last, memory: the tensors the forward keeps for the backward, and the peak of\n"
            "the intermediates in the fused plan, the unfused one and the fused one with\n"
            "attention recomputed in the backward (--recompute of layer, bench, tune, train).\n"
            "With --recompute the fused plan analysed is that one: its groups, bytes and\n"
            "floor with the extra flop of the recomputation.\n"
            "With --model, the whole BertForMaskedLM's step instead (as dmove pretrain runs\n"
            "it), by part: the embeddings, the encoder layers, the MLM head at the scored\n"
            "positions and the update (clipping and AdamW): parameters, flop by class, the\n"
            "unfused and fused bytes and roofline floors, and the total against 6 * parameters\n"
            "* tokens.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "On a machine without a CPU profile at the default path, analyze measures this CPU\n"
            "first, as `dmove probe` does (well under a minute), and saves it there.\n"
            "\n"
            "exit status: 0 success, 1 runtime error (e.g. a --profile that is missing), 2 usage\n"
            "error\n"
            "\n"
            "examples:\n"
            "  dmove probe && dmove analyze\n"
            "  dmove analyze --preset bert-large --device h100 --dtype bf16 --svg roof.svg\n"
            "  dmove analyze --measure --csv > ops.csv\n"
            "  dmove analyze --model --device h100 --dtype bf16 --preset bert-large --layers 24\n",
    .options = k_options,
    .size = sizeof(analyze_opts),
    .init = init,
};

static void probe_progress(const char *line) { fprintf(stderr, "analyze: probe: %s\n", line); }

/* No profile at the default path yet: measures this CPU as `dmove probe` does (its
 * threads those of the analysis) and saves it there for next time, saying so. */
static dm_status probe_now(dm_profile **p, const char *path) {
    fprintf(stderr, "analyze: no CPU profile at '%s' yet: measuring this CPU now, as `dmove probe` does "
                    "(well under a minute), and saving it there\n", path);
    const dm_status s = dm_profile_measure(p, 0, probe_progress);
    if (s != DM_OK) return s;
    if (dm_profile_measure_direct(*p, probe_progress) != DM_OK) /* SGEMM's rates stand alone */
        fprintf(stderr, "analyze: note: dmove's own kernel was not timed (%s)\n", dm_last_error());
    if (dm_profile_write(*p, path) != DM_OK) /* the analysis goes on with the measurement */
        fprintf(stderr, "analyze: note: the profile was not saved (%s)\n", dm_last_error());
    return DM_OK;
}

/* The device model: a datasheet preset, or this CPU from its profile (measured first on a
 * machine without one at the default path). NULL after the error. */
static dm_device_model *device_model(const analyze_opts *o) {
    dm_device_model *m = NULL;
    if (strcmp(o->device, "cpu") != 0) {
        if (dm_device_model_preset(&m, o->device) != DM_OK) cli_error(CMD, "%s", dm_last_error());
        return m;
    }
    char defpath[4096];
    const char *profile = o->profile;
    if (!profile) {
        if (dm_profile_default_path(defpath, sizeof defpath) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return NULL;
        }
        profile = defpath;
    }
    dm_profile *p = NULL;
    dm_status s = dm_profile_open(&p, profile);
    if (s == DM_ERR_NOT_FOUND && !o->profile) s = probe_now(&p, profile); /* a fresh machine */
    if (s != DM_OK || dm_device_model_cpu(&m, p, cli_threads(o->c.threads)) != DM_OK)
        cli_error(CMD, "%s", dm_last_error());
    dm_profile_free(p);
    return m;
}

/* The report in the format asked for, on stdout. 0 ok, -1 after the error. */
static int print_report(const analyze_opts *o, const dm_analysis *a) {
    char *text = NULL;
    dm_status s = DM_OK;
    if (o->json) s = dm_analysis_json(a, &text);
    else if (o->csv) s = dm_analysis_csv(a, &text);
    else if (!o->svg) s = dm_analysis_table(a, &text);
    else printf("wrote %s (%d operators)\n", o->svg, dm_analysis_num_ops(a));
    if (s != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    int wr = text ? fputs(text, stdout) : 0;
    free(text);
    return wr == EOF ? -1 : 0;
}

/* The step analysed on the model, the plan shown, measured, charted and reported. */
static int analyze(const analyze_opts *o, const dm_device_model *dev) {
    const dm_layer_config *cfg = &o->c.cfg;
    dm_analysis *a = NULL;
    char *text = NULL;
    int rc = CLI_FAIL;
    if (dm_analysis_new(&a, cfg, dev, o->dtype_bytes, o->recompute) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    /* --plan: its layouts and algorithms beside the builder's, as a table (on stderr when
     * stdout carries CSV), or with --json in the report */
    if (o->planfile) {
        if (dm_analysis_load_plan(a, o->planfile) != DM_OK ||
            (!o->json && dm_analysis_plan_text(a, &text) != DM_OK)) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
        if (text) fputs(text, o->csv ? stderr : stdout);
    }
    if (o->measure) {
        fprintf(stderr, "analyze: measuring the unfused step on this CPU (%d profiled steps)\n",
                o->reps);
        if (dm_analysis_measure(a, o->c.threads, 2, o->reps) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
    }
    if (o->svg) {
        char title[256];
        snprintf(title, sizeof title,
                 "dmove roofline: BERT layer b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                 " h=%" PRId64 " u=%" PRId64 "%s, %s, training step (%d ops)",
                 cfg->batch, cfg->seq, cfg->hidden, cfg->heads, cfg->ffn, cli_variant(cfg),
                 dm_dtype_bytes_name(o->dtype_bytes), dm_analysis_num_ops(a));
        if (dm_analysis_write_svg(a, title, o->svg) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
    }
    if (print_report(o, a)) goto done;
    if (fflush(stdout) != 0) {
        cli_error(CMD, "cannot write the report to stdout");
        goto done;
    }
    rc = CLI_OK;
done:
    free(text);
    dm_analysis_free(a);
    return rc;
}

/* --- --model: the whole BertForMaskedLM ---------------------------------------------- */

/* --config: the sizes, layers and tables of a Hugging Face config; -1 after the error. */
static int apply_hf_config(analyze_opts *o) {
    dm_hf_config hc;
    if (o->model_set) {
        cli_usage_error(CMD, "--config gives the layers, vocabulary, positions and types: leave out --layers, "
                        "--vocab, --positions and --types");
        return CLI_USAGE;
    }
    if (dm_hf_config_read(o->config, &hc) != DM_OK) {
        cli_error(CMD, "--config: %s", dm_last_error());
        return CLI_FAIL;
    }
    if (!hc.tie_word_embeddings) {
        cli_error(CMD, "--config: tie_word_embeddings is false: dmove's model ties the MLM decoder to the word "
                  "embeddings (as BERT's), and counts it so: set it true, or leave it out");
        return CLI_FAIL;
    }
    o->positions_from_config = 1;
    int rc = cli_config_from_hf(&o->c, CMD, "--config", o->config, &hc);
    if (rc) return rc;
    o->layers = (int)hc.num_hidden_layers;
    o->vocab = hc.vocab_size, o->positions = hc.max_position_embeddings, o->types = hc.type_vocab_size;
    return 0;
}

static void part_json(const dm_model_part_cost *p) {
    printf("{\"name\":\"%s\",\"count\":%d,\"params\":%" PRId64 ",\"flop\":%.17g,\"class_flop\":{", p->name,
           p->count, p->params, p->flop);
    for (int c = 0; c < DM_NUM_CLASSES; c++)
        printf("%s\"%s\":%.17g", c ? "," : "", dm_class_name((dm_op_class)c), p->class_flop[c]);
    printf("},\"unfused_bytes\":%.17g,\"fused_bytes\":%.17g,\"unfused_floor_s\":%.9g,\"fused_floor_s\":%.9g}",
           p->unfused_bytes, p->fused_bytes, p->unfused_floor_s, p->fused_floor_s);
}

static void part_row(const dm_model_part_cost *p) {
    char cnt[16];
    snprintf(cnt, sizeof cnt, "%d", p->count);
    printf("%-15s %5s %8.2fM %10.2f", p->name, cnt, (double)p->params / 1e6, p->flop / 1e9);
    for (int c = 0; c < DM_NUM_CLASSES; c++) printf(" %6.1f", p->flop > 0 ? 100 * p->class_flop[c] / p->flop : 0.0);
    printf(" %10.1f %10.1f %9.2f %9.2f\n", p->unfused_bytes / 1e6, p->fused_bytes / 1e6, 1e3 * p->unfused_floor_s,
           1e3 * p->fused_floor_s);
}

/* The links of the data-parallel table: an NVLink domain as large as the job (NVLink 4:
 * 450 GB/s a direction per GPU), and InfiniBand NDR (400 Gb/s, one adapter per GPU); the
 * latencies are NCCL's order of magnitude per hop. */
static const dm_link k_links[2] = {{"NVLink", 450e9, 3e-6}, {"InfiniBand", 50e9, 10e-6}};
static const int k_dp_ranks[3] = {8, 64, 512};

/* Data parallelism predicted (dm_dp_predict): each rank's step as this one, the gradients
 * in the storage type summed over 8, 64 and 512 ranks on each link. */
static void dp_report(const analyze_opts *o, const dm_model_cost *m) {
    dm_dp_prediction p;
    if (o->json) {
        printf(",\"data_parallel\":[");
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < 3; k++) {
                if (dm_dp_predict(m, o->dtype_bytes, k_dp_ranks[k], &k_links[l], &p) != DM_OK) continue;
                printf("%s{\"link\":\"%s\",\"busbw\":%.6g,\"ranks\":%d,\"grad_bytes\":%.6g,\"wire_bytes\":%.6g,"
                       "\"compute_s\":%.6g,\"comm_s\":%.6g,\"exposed_s\":%.6g,\"efficiency\":%.4f}",
                       l || k ? "," : "", k_links[l].name, k_links[l].busbw, p.ranks, p.grad_bytes, p.wire_bytes,
                       p.compute_s, p.comm_s, p.exposed_s, p.efficiency);
            }
        printf("]");
        return;
    }
    if (dm_dp_predict(m, o->dtype_bytes, 8, &k_links[0], &p) != DM_OK) return;
    printf("\ndata-parallel (mpirun -np N: each rank this step, b=%" PRId64 "; the gradients, %.1f MB in %s, summed in\n"
           "buckets as the backward pass ends each segment, overlapping the segments below; %.1f ms of compute):\n",
           o->c.cfg.batch, p.grad_bytes / 1e6, o->dtype_bytes == 2 ? "16 bits" : "fp32", 1e3 * p.compute_s);
    printf("  %-11s %9s %6s %12s %12s %12s %11s\n", "link", "busbw", "ranks", "sent/rank MB", "all-reduce ms",
           "exposed ms", "efficiency");
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 3; k++)
            if (dm_dp_predict(m, o->dtype_bytes, k_dp_ranks[k], &k_links[l], &p) == DM_OK)
                printf("  %-11s %6.0f GB/s %6d %12.1f %12.2f %12.2f %10.1f%%\n", k_links[l].name,
                       k_links[l].busbw / 1e9, p.ranks, p.wire_bytes / 1e6, 1e3 * p.comm_s, 1e3 * p.exposed_s,
                       100 * p.efficiency);
    printf("(the ring's 2(N-1)/N of the bytes at the bus bandwidth plus 2 log2(N) hops of latency per bucket; the\n"
           "compute at its roofline floor, so the efficiency is the least this link gives)\n");
}

/* The whole model's report: a table, or one JSON object. */
static void model_report(const analyze_opts *o, const dm_device_model *dev, const dm_model_cost *m) {
    const dm_layer_config *cfg = &o->c.cfg;
    /* the rule of thumb: 6 flop per parameter per token (forward 2, backward 4), the
     * head's decoder counted at the scored positions only, as dmove runs it */
    const double tied = (double)o->vocab * (double)cfg->hidden;
    const double six = 6.0 * ((double)m->total.params - tied) * (double)m->tokens +
                       6.0 * tied * (double)m->predictions;
    if (o->json) {
        printf("{\"model\":{\"layers\":%d,\"hidden\":%" PRId64 ",\"heads\":%" PRId64 ",\"ffn\":%" PRId64
               ",\"vocab\":%" PRId64 ",\"positions\":%" PRId64 ",\"types\":%" PRId64 ",\"batch\":%" PRId64
               ",\"seq\":%" PRId64 ",\"tokens\":%" PRId64 ",\"predictions\":%" PRId64 "},\"device\":\"%s\","
               "\"dtype\":\"%s\",\"parts\":[", o->layers, cfg->hidden, cfg->heads, cfg->ffn, o->vocab, o->positions,
               o->types, cfg->batch, cfg->seq, m->tokens, m->predictions, dm_device_model_name(dev),
               dm_dtype_bytes_name(o->dtype_bytes));
        for (int k = 0; k < DM_NUM_PARTS; k++) {
            if (k) printf(",");
            part_json(&m->part[k]);
        }
        printf("],\"total\":");
        part_json(&m->total);
        printf(",\"six_params_tokens_flop\":%.17g", six);
        dp_report(o, m);
        printf("}\n");
        return;
    }
    printf("the whole BertForMaskedLM's training step: %d layers (i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           "), vocabulary %" PRId64 ", b=%" PRId64 " j=%" PRId64 " (%" PRId64 " tokens, %" PRId64
           " scored by the head), %s, on %s\n\n", o->layers, cfg->hidden, cfg->heads, cfg->ffn, o->vocab,
           cfg->batch, cfg->seq, m->tokens, m->predictions, dm_dtype_bytes_name(o->dtype_bytes),
           dm_device_model_desc(dev));
    printf("%-15s %5s %9s %10s %6s %6s %6s %10s %10s %9s %9s\n", "part", "count", "params", "GFLOP", "contr%",
           "norm%", "elem%", "unfused MB", "fused MB", "floor ms", "fused ms");
    for (int k = 0; k < DM_NUM_PARTS; k++) part_row(&m->part[k]);
    part_row(&m->total);
    printf("\n(floor ms: the unfused schedule's roofline floor; fused ms: the fused one's. The optimizer: clipping's\n"
           "norm and AdamW, 18 flop and 32 bytes a parameter, fp32 state.) 6 * parameters * tokens (the decoder at\n"
           "the scored positions): %.2f GFLOP; the whole step counts %.3f times that.\n", six / 1e9,
           m->total.flop / six);
    dp_report(o, m);
}

static int analyze_model(analyze_opts *o, const dm_device_model *dev) {
    const dm_bert_model bm = {.vocab = o->vocab, .positions = o->positions, .types = o->types,
                              .predictions = o->predictions};
    if (o->positions < o->c.cfg.seq) {
        cli_usage_error(CMD, "%s %" PRId64 " is less than --seq %" PRId64,
                        o->positions_from_config ? "the config's max_position_embeddings" : "--positions",
                        o->positions, o->c.cfg.seq);
        return CLI_USAGE;
    }
    if (o->predictions > o->c.cfg.batch * o->c.cfg.seq) {
        cli_usage_error(CMD, "--predictions %" PRId64 ": a batch has b * j = %" PRId64 " positions to score", o->predictions,
                        o->c.cfg.batch * o->c.cfg.seq);
        return CLI_USAGE;
    }
    dm_model_cost m;
    if (dm_model_cost_analyze(&o->c.cfg, o->layers, &bm, dev, o->dtype_bytes, &m) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    model_report(o, dev, &m);
    if (fflush(stdout) != 0) {
        cli_error(CMD, "cannot write the report to stdout");
        return CLI_FAIL;
    }
    return CLI_OK;
}

int cmd_analyze(int argc, char **argv) {
    analyze_opts o;
    int rc = cli_parse(&k_analyze, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (o.json && o.csv) {
        cli_usage_error(CMD, "--json and --csv: choose one output format");
        return CLI_USAGE;
    }
    if (o.measure && strcmp(o.device, "cpu") != 0) {
        cli_usage_error(CMD, "--measure runs on this CPU: it needs --device cpu (not '%s'); "
                        "to time the step on a GPU, per group, use dmove bench --device cuda --groups", o.device);
        return CLI_USAGE;
    }
    if (o.measure && o.dtype_bytes != 4) {
        cli_usage_error(CMD, "--measure: the CPU backend computes in fp32: use --dtype fp32");
        return CLI_USAGE;
    }
    if (!o.model && (o.config || o.model_set || o.predictions)) {
        cli_usage_error(CMD, "--config, --layers, --vocab, --positions, --types and --predictions are --model's");
        return CLI_USAGE;
    }
    if (o.model && (o.csv || o.svg || o.measure || o.planfile || o.recompute)) {
        cli_usage_error(CMD, "--model reports a table or --json (no --csv, --svg, --measure, --plan or --recompute)");
        return CLI_USAGE;
    }
    if (o.config && (rc = apply_hf_config(&o)) != 0) return rc;
    if (cli_config_finish(&o.c, CMD, 1)) return CLI_USAGE;
    dm_device_model *dev = device_model(&o);
    if (!dev) return CLI_FAIL;
    rc = o.model ? analyze_model(&o, dev) : analyze(&o, dev);
    dm_device_model_free(dev);
    return rc;
}
