/* bench/gpu/bert_step.c: times dmove's whole BertForMaskedLM training step (the library's
 * dm_trainer_new_bert: embeddings, encoder layers, the MLM head with its decoder tied to
 * the word table, AdamW over every parameter; dmove pretrain's step without its data
 * loader), one JSON line, as bench/gpu/bert_gpu.py prints PyTorch's.
 * A step: the batch set (dm_trainer_set_mlm_batch: ids, 15% of positions masked, all
 * tokens real, token type 0), dm_trainer_step (forward, loss, backward, the update); the
 * time of each step by the host's clock around both (the step returns the loss: the
 * device's work is done), the median over --steps after --warmup; phase_ms: the mean
 * per step of the trainer's own phase clocks (dm_trainer_times; on a GPU the forward's
 * includes bringing the logits down for the argmax hits, predictions x vocab floats).
 * Built by bench/gpu/bench.mk (make -f Makefile -f bench/gpu/bench.mk build/bench/bert_step).
 * Usage: bert_step [--device cpu|cuda] [--dtype fp32|bf16] [--layers 24] [--hidden 1024]
 *        [--heads 16] [--ffn 4096] [--vocab 30522] [--batch 8] [--seq 512] [--steps 10]
 *        [--warmup 3] [--rows interp|gen|auto] [--streams 0|1|2] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dmove.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int die(const char *what, dm_status s) {
    fprintf(stderr, "bert_step: %s: %s (status %d)\n", what, dm_last_error(), (int)s);
    return 1;
}

int main(int argc, char **argv) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    dm_layer_options opt = {0};
    int64_t layers = 24, vocab = 30522, steps = 10, warmup = 3;
    cfg.hidden = 1024, cfg.heads = 16, cfg.ffn = 4096, cfg.batch = 8, cfg.seq = 512, cfg.dropout = 0.1;
    const char *rows = "";
    for (int a = 1; a + 1 < argc; a += 2) {
        const char *k = argv[a], *v = argv[a + 1];
        int64_t n = strtoll(v, NULL, 10);
        if (!strcmp(k, "--device")) {
            if (dm_device_kind_parse(v, &opt.device) != DM_OK) return die("--device", DM_ERR_INVALID_ARG);
        } else if (!strcmp(k, "--dtype")) {
            if (dm_dtype_parse(v, &opt.dtype) != DM_OK) return die("--dtype", DM_ERR_INVALID_ARG);
        } else if (!strcmp(k, "--rows")) {
            rows = v;
            if (dm_rows_parse(v, &opt.rows) != DM_OK) return die("--rows", DM_ERR_INVALID_ARG);
        } else if (!strcmp(k, "--streams")) opt.streams = (int)n;
        else if (!strcmp(k, "--layers")) layers = n;
        else if (!strcmp(k, "--hidden")) cfg.hidden = n;
        else if (!strcmp(k, "--heads")) cfg.heads = n;
        else if (!strcmp(k, "--ffn")) cfg.ffn = n;
        else if (!strcmp(k, "--vocab")) vocab = n;
        else if (!strcmp(k, "--batch")) cfg.batch = n;
        else if (!strcmp(k, "--seq")) cfg.seq = n;
        else if (!strcmp(k, "--steps")) steps = n;
        else if (!strcmp(k, "--warmup")) warmup = n;
        else {
            fprintf(stderr, "bert_step: unknown option %s (see the file's head)\n", k);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || vocab < 6 || layers < 1) {
        fprintf(stderr, "bert_step: --steps >= 1, --warmup >= 0, --vocab >= 6, --layers >= 1\n");
        return 2;
    }
    dm_bert_model bm = {.vocab = vocab, .positions = cfg.seq > 512 ? cfg.seq : 512, .types = 2, .pad_id = 0};
    dm_optim_config oc;
    dm_optim_config_default(&oc);
    dm_trainer *T = NULL;
    double t0 = now();
    dm_status s = dm_trainer_new_bert(&T, &cfg, (int)layers, &bm, &opt, &oc);
    if (s != DM_OK) return die("dm_trainer_new_bert", s);
    /* the step alone, as the PyTorch side times it: no accuracy counted (on a GPU it would
     * copy the logits to the host each step) */
    if ((s = dm_trainer_set_count_correct(T, 0)) != DM_OK) return die("dm_trainer_set_count_correct", s);
    if ((s = dm_trainer_init_params(T, 1)) != DM_OK) return die("dm_trainer_init_params", s);
    const double made = now() - t0;
    const int64_t n = cfg.batch * cfg.seq;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), *labels = malloc(sizeof(int32_t) * (size_t)n);
    double *ms = malloc(sizeof(double) * (size_t)steps);
    if (!ids || !labels || !ms) return die("out of memory", DM_ERR_OOM);
    uint64_t z = 12345;
    double ph0[DM_TRAIN_NUM_PHASES], ph1[DM_TRAIN_NUM_PHASES];
    double loss = 0.0, first = 0.0;
    for (int64_t k = 0; k < warmup + steps; k++) {
        for (int64_t r = 0; r < n; r++) { /* new tokens each step; 15% masked ([MASK] = 4 here) */
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t id = 5 + (int64_t)((z >> 33) % (uint64_t)(vocab - 5));
            const int masked = (z >> 20) % 100 < 15;
            ids[r] = (int32_t)(masked ? 4 : id);
            labels[r] = masked ? (int32_t)id : -100;
        }
        if (k == warmup) dm_trainer_times(T, ph0);
        const double a = now();
        if ((s = dm_trainer_set_mlm_batch(T, ids, NULL, NULL, labels)) != DM_OK) return die("set batch", s);
        if ((s = dm_trainer_step(T, &loss)) != DM_OK) return die("dm_trainer_step", s);
        const double b = now();
        if (k == 0) first = loss;
        if (k >= warmup) ms[k - warmup] = 1e3 * (b - a);
    }
    dm_trainer_times(T, ph1);
    qsort(ms, (size_t)steps, sizeof(double), cmp);
    const double med = ms[steps / 2];
    dm_layer_memory mem;
    size_t optb = 0;
    dm_trainer_memory_info(T, &mem, &optb);
    printf("{\"framework\":\"dmove\",\"recipe\":\"%s%s%s, %s\",\"layers\":%lld,\"batch\":%lld,\"seq\":%lld,"
           "\"step_ms\":%.3f,\"step_ms_min\":%.3f,\"step_ms_max\":%.3f,\"seq_per_s\":%.2f,\"loss_first\":%.4f,"
           "\"loss\":%.4f,\"setup_s\":%.2f,\"gflop_per_step\":%.1f,\"memory_mb\":%.0f,"
           "\"phase_ms\":{\"forward\":%.3f,\"loss\":%.3f,\"backward\":%.3f,\"optimizer\":%.3f,\"input\":%.3f}}\n",
           dm_device_kind_name(opt.device), " ", dm_dtype_name(opt.dtype),
           opt.device == DM_DEVICE_CPU ? "threads all" : *rows ? rows : "rows default",
           (long long)layers, (long long)cfg.batch, (long long)cfg.seq, med, ms[0], ms[steps - 1],
           1e3 * (double)cfg.batch / med, first, loss, made, dm_trainer_step_flop(T) / 1e9,
           (double)(mem.arena + mem.scratch + optb) / 1e6, 1e3 * (ph1[DM_TRAIN_FORWARD] - ph0[DM_TRAIN_FORWARD]) / steps,
           1e3 * (ph1[DM_TRAIN_LOSS] - ph0[DM_TRAIN_LOSS]) / steps, 1e3 * (ph1[DM_TRAIN_BACKWARD] - ph0[DM_TRAIN_BACKWARD]) / steps,
           1e3 * (ph1[DM_TRAIN_OPTIMIZER] - ph0[DM_TRAIN_OPTIMIZER]) / steps,
           1e3 * (ph1[DM_TRAIN_INPUT] - ph0[DM_TRAIN_INPUT]) / steps);
    free(ids), free(labels), free(ms);
    dm_trainer_free(T);
    return 0;
}
