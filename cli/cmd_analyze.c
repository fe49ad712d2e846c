/* cmd_analyze.c: `dmove analyze`: the dataflow analysis of one encoder layer's training
 * step on a device model: per operator flop, bytes, intensity, roofline bound and
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
    const char *device, *profile, *svg, *planfile;
    int dtype_bytes, json, csv, measure, reps, recompute;
    cli_config c;
} analyze_opts;

static void init(void *p) {
    analyze_opts *o = p;
    o->device = "cpu";
    o->dtype_bytes = 4;
    o->reps = 5;
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
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error (e.g. no profile), 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove probe && dmove analyze\n"
            "  dmove analyze --preset bert-large --device h100 --dtype bf16 --svg roof.svg\n"
            "  dmove analyze --measure --csv > ops.csv\n",
    .options = k_options,
    .size = sizeof(analyze_opts),
    .init = init,
};

/* The device model: a datasheet preset, or this CPU from its profile. NULL after the
 * error. */
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
    if (dm_profile_open(&p, profile) != DM_OK || dm_device_model_cpu(&m, p, cli_threads(o->c.threads)) != DM_OK)
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
    if (cli_config_finish(&o.c, CMD, 1)) return CLI_USAGE;
    dm_device_model *dev = device_model(&o);
    if (!dev) return CLI_FAIL;
    rc = analyze(&o, dev);
    dm_device_model_free(dev);
    return rc;
}
