/* cmd_export.c: `dmove export`: the model of a `dmove pretrain` or `dmove finetune`
 * checkpoint written standalone as transformers saves a BertForMaskedLM or a
 * BertForSequenceClassification (dm_checkpoint_export): the same files as the command's
 * --export at that step. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_common.h"
#include "dmove_text.h"

static const char *const CMD = "export";

typedef struct {
    const char *checkpoint, *out, *tokenizer;
    int lowercase, cased;
} export_opts;

static void init(void *p) { (void)p; }

static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--checkpoint", .arg = "FILE", .off = offsetof(export_opts, checkpoint),
     .help = "a checkpoint of dmove pretrain or finetune (--save FILE)\n(required)"},
    {.kind = CLI_PATH, .name = "--out", .arg = "DIR", .off = offsetof(export_opts, out),
     .help = "write DIR/model.safetensors and DIR/config.json (required;\n"
             "each atomically, the directory made if needed)"},
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", .off = offsetof(export_opts, tokenizer),
     .help = "the run's tokenizer (tokenizer.json, a vocab.txt with\n"
             "--lowercase or --cased, or a model directory): written\n"
             "beside the model as transformers' BertTokenizer saves one\n"
             "(DIR/vocab.txt, DIR/tokenizer_config.json), so that\n"
             "AutoTokenizer.from_pretrained(DIR) and pipelines load it;\n"
             "a tokenizer.json BertTokenizer cannot be is written as it\n"
             "is, as PreTrainedTokenizerFast. Checked before anything is\n"
             "written (also that DIR holds no other tokenizer's files)"},
    {.kind = CLI_FLAG, .name = "--lowercase", .off = offsetof(export_opts, lowercase), .lo = 1,
     .left = "--lowercase, --cased", .help = "how a vocab.txt normalizes, as for dmove tokenize"},
    {.kind = CLI_FLAG, .name = "--cased", .off = offsetof(export_opts, cased), .lo = 1},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_export = {
    .name = "export",
    .head = "usage: dmove export --checkpoint FILE --out DIR\n"
            "\n"
            "Writes the model of a `dmove pretrain` checkpoint as Hugging Face transformers\n"
            "saves a BertForMaskedLM, and of a `dmove finetune` checkpoint as it saves a\n"
            "BertForSequenceClassification (its classes' names in id2label):\n"
            "DIR/model.safetensors (the parameters alone, fp32, under the class's names, the\n"
            "tied decoder left out) and DIR/config.json. from_pretrained(DIR) loads it with no\n"
            "key missing or left over; the optimizer's state stays in the checkpoint. The\n"
            "checkpoint is validated whole (format, every tensor, its checksum) first; the\n"
            "files are those the command's --export DIR writes at the step it was saved.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "example:\n"
            "  dmove pretrain --data data --tokenizer tokenizer.json --steps 2000 --save run.ckpt\n"
            "  dmove export --checkpoint run.ckpt --out my-bert --tokenizer tokenizer.json\n"
            "  python -c 'import transformers as t; print(t.pipeline(\"fill-mask\", \"my-bert\")(\"a [MASK] day\"))'\n",
    .options = k_options,
    .hint = "",
    .size = sizeof(export_opts),
    .init = init,
};

int cmd_export(int argc, char **argv) {
    export_opts o;
    int rc = cli_parse(&k_export, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (!o.checkpoint || !o.out) {
        cli_usage_error(CMD, "--checkpoint FILE and --out DIR are required");
        return CLI_USAGE;
    }
    if (!o.tokenizer && (o.lowercase || o.cased)) {
        cli_usage_error(CMD, "--lowercase and --cased say how a --tokenizer vocab.txt normalizes: give --tokenizer");
        return CLI_USAGE;
    }
    const cli_path reads[2] = {{.opt = "--checkpoint", .path = o.checkpoint}, {.opt = "--tokenizer", .path = o.tokenizer}};
    const cli_path writes[1] = {{.opt = "--out", .path = o.out, .dir = 1}};
    if ((rc = cli_check_paths(CMD, reads, 2, writes, 1)) != 0) return rc;
    dm_tokenizer *tok = NULL; /* read and checked before anything is written */
    if (o.tokenizer && (rc = cli_open_tokenizer(CMD, o.tokenizer, o.lowercase, o.cased, &tok)) != CLI_OK) return rc;
    dm_bert_model bm = {0};
    /* (a checkpoint whose header cannot say: the export below says what is wrong with it, as
     * it reads the same metadata) */
    if (tok && dm_checkpoint_bert_sizes(o.checkpoint, &bm) == DM_OK && dm_tokenizer_vocab_size(tok) > bm.vocab) {
        cli_error(CMD, "--tokenizer %s has %d tokens and the model's vocabulary %" PRId64 ": it is not the run's "
                  "tokenizer (nothing written)", o.tokenizer, dm_tokenizer_vocab_size(tok), bm.vocab);
        dm_tokenizer_free(tok);
        return CLI_FAIL;
    }
    if (tok && dm_tokenizer_check_save(tok, o.out, NULL) != DM_OK) {
        dm_tokenizer_free(tok);
        cli_error(CMD, "--tokenizer %s: %s (nothing written)", o.tokenizer, dm_last_error());
        return CLI_FAIL;
    }
    if (dm_checkpoint_export(o.checkpoint, o.out) != DM_OK) {
        dm_tokenizer_free(tok);
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    printf("dmove export: %s/model.safetensors and %s/config.json from %s\n", o.out, o.out, o.checkpoint);
    static const char *const tok_files[3] = {"tokenizer.json", "vocab.txt", "tokenizer_config.json"};
    for (int k = 0; k < 3 && !tok; k++) {
        char p[4096];
        struct stat sb;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", o.out, tok_files[k]) < sizeof p && stat(p, &sb) == 0) {
            fprintf(stderr, "dmove export: note: %s holds a tokenizer from before (%s), not rewritten: give "
                    "--tokenizer to write the run's\n", o.out, tok_files[k]);
            break;
        }
    }
    if (tok) { /* model_max_length: the checkpoint's positions (read above, as the export read them) */
        int json_form = 0;
        rc = CLI_OK;
        if (dm_tokenizer_save(tok, o.out, bm.positions, &json_form) != DM_OK) {
            cli_fail_dm(CMD, "--tokenizer: (the model is written, the tokenizer not) ");
            rc = CLI_FAIL;
        } else {
            printf("dmove export: %s/%s and %s/tokenizer_config.json (%s) from %s (%s)\n", o.out,
                   json_form ? "tokenizer.json" : "vocab.txt", o.out,
                   json_form ? "PreTrainedTokenizerFast: BertTokenizer cannot be it" : "BertTokenizer", o.tokenizer,
                   dm_tokenizer_describe(tok));
        }
        dm_tokenizer_free(tok);
        if (rc != CLI_OK) return rc;
    }
    return cli_finish_stdout(CMD);
}
