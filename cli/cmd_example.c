/* cmd_example.c: `dmove example`: writes a random, valid input file for `dmove layer`
 * (hidden_states, a padding mask, grad_output and the 16 BertLayer parameters) from a
 * layer configuration, so users and tests have something to start from. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"

static const char *const CMD = "example";

/* Refuse to write more than this: the sizes are almost certainly a typo. */
#define EXAMPLE_MAX_BYTES ((double)16 * 1024 * 1024 * 1024)

typedef struct {
    const char *out;
    int no_mask;
    cli_config c;
} example_opts;

static void init(void *p) {
    example_opts *o = p;
    cli_config_init(&o->c, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_TRAIN | CLI_CFG_ARCH);
}

static const cli_option k_options[] = {
    {.kind = CLI_STR, .name = "--out", .arg = "FILE", .off = offsetof(example_opts, out),
     .help = "the file to write (required; written atomically)"},
    CLI_CONFIG(example_opts, c, CLI_CFG_SIZES | CLI_CFG_HEADS | CLI_CFG_TRAIN | CLI_CFG_ARCH),
    {.kind = CLI_TEXT,
     .help = "                   (--seed also seeds the random values; --heads, --dropout,\n"
             "                   --seed, --act and --eps are recorded in __metadata__, where\n"
             "                   dmove layer takes them as its defaults)\n"},
    {.kind = CLI_FLAG, .name = "--no-mask", .off = offsetof(example_opts, no_mask), .lo = 1,
     .help = "leave attention_mask out (dmove layer then uses all ones)"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_example = {
    .name = "example",
    .head = "usage: dmove example --out FILE [options]\n"
            "\n"
            "Writes a random input for `dmove layer`: a safetensors file with\n"
            "hidden_states (b, j, i) ~ N(0, 1), attention_mask (b, j) with some padding at\n"
            "the end of later sequences, grad_output (b, j, i) ~ N(0, 1), and the 16\n"
            "BertLayer parameters (weights ~ N(0, 0.02) as (out, in), biases ~ N(0, 0.02),\n"
            "LayerNorm weights ~ 1 + N(0, 0.1), LayerNorm biases ~ N(0, 0.1)), all float32.\n"
            "The values depend only on the sizes and --seed. The configuration is recorded in\n"
            "the file's __metadata__.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "example:\n"
            "  dmove example --out in.safetensors --batch 2 --seq 16 --hidden 64 --heads 4 "
            "--ffn 256\n"
            "  dmove layer --in in.safetensors --out out.safetensors   (--heads 4 from the file)\n",
    .options = k_options,
    .hint = " (the file is given with --out)",
    .size = sizeof(example_opts),
    .init = init,
};

static float *alloc_floats(size_t n) {
    float *p = malloc(n ? n * sizeof *p : 1);
    if (!p)
        cli_error(CMD, "out of memory allocating %zu floats (%.1f GiB): choose smaller sizes (--batch, --seq, "
                  "--hidden, --ffn)", n, (double)n * 4 / 1073741824.0);
    return p;
}

/* Adds a tensor of n values mean + sd * N(0, 1). */
static int add_random(dm_tensor_writer *w, cli_rng *r, const char *name, int nd,
                      const int64_t *shape, double mean, double sd) {
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k]; /* bounded by the caller */
    float *v = alloc_floats(n);
    if (!v) return -1;
    for (size_t k = 0; k < n; k++) v[k] = (float)(mean + sd * cli_rng_normal(r));
    dm_status st = dm_tensor_writer_add_f32(w, name, nd, shape, v);
    free(v);
    if (st != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

/* The layer's inputs and parameters, random, into w. 0 ok, -1 after the error. */
static int add_tensors(dm_tensor_writer *w, const dm_layer_config *cfg, int no_mask) {
    const int64_t b = cfg->batch, j = cfg->seq, i = cfg->hidden, u = cfg->ffn;
    cli_rng r;
    cli_rng_seed(&r, cfg->seed ^ 0x6578616d706c65ull); /* "example" */
    int64_t bji[3] = {b, j, i};
    if (add_random(w, &r, "hidden_states", 3, bji, 0.0, 1.0)) return -1;
    if (!no_mask) {
        /* sequence s keeps j - (s mod 4) * j / 8 tokens (at least 1): padding of 0 to 3/8 */
        float *mask = alloc_floats((size_t)b * (size_t)j);
        if (!mask) return -1;
        for (int64_t s = 0; s < b; s++) {
            int64_t len = j - (s % 4) * j / 8;
            if (len < 1) len = 1;
            for (int64_t t = 0; t < j; t++) mask[s * j + t] = t < len ? 1.0f : 0.0f;
        }
        dm_status st = dm_tensor_writer_add_f32(w, "attention_mask", 2, (int64_t[]){b, j}, mask);
        free(mask);
        if (st) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
    }
    if (add_random(w, &r, "grad_output", 3, bji, 0.0, 1.0)) return -1;
    static const char *const qkvo[] = {"attention.self.query", "attention.self.key",
                                       "attention.self.value", "attention.output.dense"};
    char name[128];
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "%s.weight", qkvo[k]);
        if (add_random(w, &r, name, 2, (int64_t[]){i, i}, 0.0, 0.02)) return -1;
        snprintf(name, sizeof name, "%s.bias", qkvo[k]);
        if (add_random(w, &r, name, 1, (int64_t[]){i}, 0.0, 0.02)) return -1;
    }
    if (add_random(w, &r, "attention.output.LayerNorm.weight", 1, (int64_t[]){i}, 1.0, 0.1) ||
        add_random(w, &r, "attention.output.LayerNorm.bias", 1, (int64_t[]){i}, 0.0, 0.1) ||
        add_random(w, &r, "intermediate.dense.weight", 2, (int64_t[]){u, i}, 0.0, 0.02) ||
        add_random(w, &r, "intermediate.dense.bias", 1, (int64_t[]){u}, 0.0, 0.02) ||
        add_random(w, &r, "output.dense.weight", 2, (int64_t[]){i, u}, 0.0, 0.02) ||
        add_random(w, &r, "output.dense.bias", 1, (int64_t[]){i}, 0.0, 0.02) ||
        add_random(w, &r, "output.LayerNorm.weight", 1, (int64_t[]){i}, 1.0, 0.1) ||
        add_random(w, &r, "output.LayerNorm.bias", 1, (int64_t[]){i}, 0.0, 0.1))
        return -1;
    return 0;
}

/* The configuration into w's __metadata__. 0 ok, -1 after the error. */
static int add_metadata(dm_tensor_writer *w, const dm_layer_config *cfg) {
    struct {
        const char *k;
        char v[64];
    } meta[] = {{"format", "pt"}, {"dmove_version", DMOVE_VERSION}, {"batch", ""}, {"seq", ""},
                {"hidden", ""}, {"heads", ""}, {"ffn", ""}, {"dropout", ""}, {"seed", ""},
                {"act", ""}, {"eps", ""}, {"norm", ""}, {"causal", ""}};
    snprintf(meta[2].v, sizeof meta[2].v, "%" PRId64, cfg->batch);
    snprintf(meta[3].v, sizeof meta[3].v, "%" PRId64, cfg->seq);
    snprintf(meta[4].v, sizeof meta[4].v, "%" PRId64, cfg->hidden);
    snprintf(meta[5].v, sizeof meta[5].v, "%" PRId64, cfg->heads);
    snprintf(meta[6].v, sizeof meta[6].v, "%" PRId64, cfg->ffn);
    dm_fmt_exact(meta[7].v, sizeof meta[7].v, cfg->dropout);
    snprintf(meta[8].v, sizeof meta[8].v, "%" PRIu64, cfg->seed);
    snprintf(meta[9].v, sizeof meta[9].v, "%s", dm_act_name(cfg->act));
    dm_fmt_exact(meta[10].v, sizeof meta[10].v, cfg->eps);
    snprintf(meta[11].v, sizeof meta[11].v, "%s", dm_norm_name(cfg->norm));
    snprintf(meta[12].v, sizeof meta[12].v, "%d", cfg->causal);
    for (size_t k = 0; k < sizeof meta / sizeof *meta; k++)
        if (dm_tensor_writer_set_metadata(w, meta[k].k, meta[k].v) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
    return 0;
}

int cmd_example(int argc, char **argv) {
    example_opts o;
    int rc = cli_parse(&k_example, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (!o.out || !*o.out) {
        cli_usage_error(CMD, "--out FILE is required");
        return CLI_USAGE;
    }
    if (cli_config_finish(&o.c, CMD, 1)) return CLI_USAGE;
    int bad_out = cli_check_output(CMD, "--out", o.out);
    if (bad_out) return bad_out;
    const dm_layer_config *cfg = &o.c.cfg;
    int64_t b = cfg->batch, j = cfg->seq, i = cfg->hidden, u = cfg->ffn;

    /* The config check bounds the sizes; this bounds what we are about to allocate. */
    double bytes = 4.0 * (2.0 * (double)b * (double)j * (double)i + (double)b * (double)j +
                          4.0 * (double)i * (double)i + 2.0 * (double)i * (double)u +
                          9.0 * (double)i + (double)u);
    if (bytes > EXAMPLE_MAX_BYTES) {
        cli_usage_error(CMD, "these sizes would write %.1f GiB; dmove example writes at most "
                        "%.0f GiB (choose smaller --batch/--seq/--hidden/--ffn)",
                        bytes / 1073741824.0, EXAMPLE_MAX_BYTES / 1073741824.0);
        return CLI_USAGE;
    }

    dm_tensor_writer *w = NULL;
    rc = CLI_FAIL;
    if (dm_tensor_writer_new(&w) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    if (add_tensors(w, cfg, o.no_mask) || add_metadata(w, cfg)) goto done;
    if (dm_tensor_writer_write(w, o.out) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    printf("dmove example: wrote %s (b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           "); run it with: dmove layer --in %s --out OUT.safetensors\n", o.out, b, j, i, cfg->heads, u, o.out);
    rc = CLI_OK;
done:
    dm_tensor_writer_free(w);
    return rc;
}
