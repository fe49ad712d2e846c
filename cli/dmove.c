/* dmove.c: the dmove command: dispatches its subcommands (layer, bench, example, analyze,
 * probe, tune, train, tokenize, help, --version). Usage errors exit 2, runtime and input errors 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} k_cmds[] = {
    {"layer", cmd_layer, "one training step of a BERT encoder layer on your tensors"},
    {"bench", cmd_bench, "time the training step, fused vs unfused, per operator class"},
    {"example", cmd_example, "write a random input file for `dmove layer`"},
    {"analyze", cmd_analyze, "per-operator flop, bytes, roofline bound; unfused vs fused bytes"},
    {"probe", cmd_probe, "measure this CPU (bandwidth, SGEMM, vector rate) for analyze"},
    {"tune", cmd_tune, "choose layouts and algorithms by measurement; write a plan"},
    {"train", cmd_train, "train a stack of encoder layers with AdamW; checkpoints, loss chart"},
    {"tokenize", cmd_tokenize, "text into BERT WordPiece ids (tokenizer.json or vocab.txt)"},
    {"prepare", cmd_prepare, "tokenize text files into token shards for pretraining"},
    {"batches", cmd_batches, "show or time the masked-LM batches made of prepared shards"},
    {"pretrain", cmd_pretrain, "pretrain a whole BERT (masked LM) on prepared shards"},
    {"embed", cmd_embed, "sentence embeddings of a Hugging Face BERT, one per input line"},
    {"export", cmd_export, "a pretrain checkpoint's model as transformers saves it"},
    {"finetune", cmd_finetune, "fine-tune a BERT for sequence classification (TSV or JSONL)"},
};
enum { NUM_CMDS = (int)(sizeof k_cmds / sizeof k_cmds[0]) };

static void usage(FILE *out) {
    fprintf(out,
            "usage: dmove <command> [options]\n"
            "\n"
            "dmove trains transformer encoders while moving as little data as possible.\n"
            "\n"
            "commands:\n");
    for (int k = 0; k < NUM_CMDS; k++) fprintf(out, "  %-9s %s\n", k_cmds[k].name, k_cmds[k].what);
    fprintf(out,
            "  help [C]  this text, or the help of command C\n"
            "\n"
            "  --version  print the version\n"
            "\n"
            "Every command explains itself: dmove <command> --help\n"
            "\n"
            "example:\n"
            "  dmove bench                  (BERT-base, fused vs unfused)\n"
            "  dmove train                  (2 BERT-base layers learn a teacher, 30 steps)\n"
            "  dmove bench --norm pre --causal --recompute\n"
            "                               (a pre-LN causal block, as GPT-2's, with\n"
            "                                attention recomputed in the backward)\n"
            "  dmove analyze --preset bert-large --device h100 --dtype bf16\n"
            "                               (roofline and memory of a BERT-large layer)\n"
            "  dmove train --device cuda --dtype bf16 --preset bert-large --layers 24\n"
            "                               (BERT-large's encoder trained on a GPU)\n");
}

/* Before any library's initializer (the executable's .preinit_array runs first): under an
 * address-space limit (ulimit -v) too small for OpenBLAS's first buffers, its initializer
 * would retry the allocation forever (issue: a 300 MiB limit hung even `dmove --help`).
 * The CPU executor checks the room for its thread count again before any GEMM. */
static void early_room_check(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    if (dm_blas_room_check(1) == DM_OK) return;
    fprintf(stderr, "dmove: %s\n", dm_last_error());
    _exit(CLI_FAIL);
}
__attribute__((section(".preinit_array"), used)) static void (*const early_room)(int, char **, char **) =
    early_room_check;

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--version") || !strcmp(c, "version")) {
        printf("dmove %s\ndata parallelism: %s\n", DMOVE_VERSION, dm_dist_build_info());
        return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
    }
    if (!strcmp(c, "--help") || !strcmp(c, "-h")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(c, "help")) {
        if (argc < 3 || !strcmp(argv[2], "help")) {
            usage(stdout);
            return CLI_OK;
        }
        for (int k = 0; k < NUM_CMDS; k++)
            if (!strcmp(argv[2], k_cmds[k].name)) {
                static char help_opt[] = "--help";
                char *sub[] = {argv[2], help_opt, NULL};
                return k_cmds[k].run(2, sub);
            }
        fprintf(stderr, "dmove help: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return CLI_USAGE;
    }
    for (int k = 0; k < NUM_CMDS; k++) {
        if (strcmp(c, k_cmds[k].name)) continue;
        const char *isa = getenv("DMOVE_ISA"), *in_use = NULL, *widest = NULL, *note = NULL;
        dm_cpu_kernel_isa(&in_use, &widest, &note);
        if (isa && note && strstr(note, "ignored")) /* every command says so, not only probe and bench */
            fprintf(stderr, "dmove %s: note: DMOVE_ISA='%s': %s; the kernels are %s's\n", c, isa, note, in_use);
        /* train and pretrain run as ranks of an MPI launch; the others alone (their files
         * would be written by every rank at once) */
        if (dm_dist_launch_size() > 1 && strcmp(c, "train") && strcmp(c, "pretrain")) {
            fprintf(stderr, "dmove %s: launched as one of %d processes (mpirun): only train and pretrain run "
                            "data-parallel; run dmove %s alone, without mpirun\n", c, dm_dist_launch_size(), c);
            return CLI_USAGE;
        }
        return k_cmds[k].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "dmove: unknown command '%s'\n\n", c);
    usage(stderr);
    return CLI_USAGE;
}
