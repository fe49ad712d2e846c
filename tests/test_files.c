/* test_files.c: how dmove writes and reads files (core/file.c), as a hostile user's
 * machine would test it: outputs that are FIFOs or devices are written, never replaced; a
 * symbolic link's target is written and the link kept; a directory is refused; a name of
 * 250 characters works (the temporary stays within the file-name limit); temporaries a
 * dead process left are removed by the next write of the same name, a live one's kept;
 * the temporaries being written are removed by dm_remove_partial_outputs (what the CLI's
 * signal handler calls); inputs that are FIFOs or devices are refused at once instead of
 * blocking or never ending; a small file read costs its size in memory, not the reader's
 * limit (a 64 MiB manifest limit allocated whole failed under a memory limit). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "analysis/device.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "dmove.h"
#include "dmove_data.h"
#include "dmove_tools.h"
#include "testutil.h"

static char g_dir[] = "/tmp/dmove_test_files.XXXXXX";

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static int count_temps(const char *base) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '^%.40s.*\\.tmp\\.' ", g_dir, base);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

static int read_all(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

/* A FIFO output: a child reads it; the bytes arrive and the FIFO stays a FIFO. */
static void test_fifo_output(void) {
    char fifo[512], got[512];
    path_in(fifo, sizeof fifo, "out.fifo");
    path_in(got, sizeof got, "fifo.got");
    CHECK(mkfifo(fifo, 0600) == 0);
    pid_t kid = fork();
    if (kid == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", fifo, got);
        _exit(system(cmd) == 0 ? 0 : 1);
    }
    CHECK_OK(dm_write_file_atomic(fifo, "through a pipe\n", 15));
    int st = 0;
    CHECK(kid > 0 && waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char buf[64];
    CHECK(read_all(got, buf, sizeof buf) == 15 && !strcmp(buf, "through a pipe\n"));
    struct stat sb;
    CHECK(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    /* a character device: written, not replaced */
    CHECK_OK(dm_write_file_atomic("/dev/null", "x", 1));
    CHECK(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
    /* /dev/full: the write fails with a message, the device stays */
    CHECK(dm_write_file_atomic("/dev/full", "x", 1) == DM_ERR_IO && strstr(dm_last_error(), "/dev/full"));
    CHECK(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode));
}

/* A link's target is written, the link kept; a directory refused; a long name works. */
static void test_links_dirs_names(void) {
    char target[512], link[512];
    path_in(target, sizeof target, "target.txt");
    path_in(link, sizeof link, "link.txt");
    CHECK_OK(dm_write_file_atomic(target, "old", 3));
    CHECK(symlink(target, link) == 0);
    CHECK_OK(dm_write_file_atomic(link, "new!", 4));
    struct stat sb;
    char buf[64];
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(read_all(target, buf, sizeof buf) == 4 && !strcmp(buf, "new!"));
    CHECK(dm_write_file_atomic(g_dir, "x", 1) == DM_ERR_IO && strstr(dm_last_error(), "directory"));
    char name[260], path[800];
    memset(name, 'n', 250);
    name[250] = 0;
    path_in(path, sizeof path, name);
    CHECK_OK(dm_write_file_atomic(path, "long", 4));
    CHECK(read_all(path, buf, sizeof buf) == 4);
    CHECK(count_temps(name) == 0);
    /* a safetensors file through the same path (the checkpoint writer) */
    dm_st_writer *w = NULL;
    CHECK_OK(dm_st_writer_new(&w));
    const float x[2] = {1, 2};
    if (w) {
        CHECK_OK(dm_st_writer_add(w, "x", DM_ST_F32, 1, (int64_t[]){2}, x));
        CHECK_OK(dm_st_writer_write(w, path));
        dm_st_file *f = NULL;
        CHECK_OK(dm_st_read(path, &f));
        CHECK(f && dm_st_count(f) == 1);
        dm_st_free(f);
    }
    dm_st_writer_free(w);
}

/* Stale temporaries: a dead process's, untouched for over 10 minutes, removed by the next
 * write of the name; a live process's kept, a dead one's written a moment ago kept (it may
 * be a writer in another PID namespace), another name's kept, a user's file that only
 * looks like one kept. */
static void test_stale_temps(void) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    int st;
    CHECK(dead > 0 && waitpid(dead, &st, 0) == dead);
    enum { N = 6 };
    char p[N][512], n[64], out[512];
    const char *fmt[N] = {"ckpt.st.tmp.%ld.Ab12Cd", "ckpt.st.tmp.%ld", /* removed: the older writer's name too */
                          "ckpt.st.tmp.%ld.Zz99Yy", "other.st.tmp.%ld.Ab12Cd", "ckpt.st.tmp.%ld.bak",
                          "ckpt.st.tmp.%ld.Qq11Rr"};
    const long pid[N] = {dead, dead, (long)getppid(), dead, dead, dead};
    for (int k = 0; k < N; k++) {
        snprintf(n, sizeof n, fmt[k], pid[k]);
        path_in(p[k], sizeof p[k], n);
        FILE *f = fopen(p[k], "wb");
        CHECK(f != NULL);
        if (f) fclose(f);
        if (k < N - 1) { /* an hour old; the last one just written */
            struct timeval tv[2];
            gettimeofday(&tv[0], NULL);
            tv[0].tv_sec -= 3600, tv[1] = tv[0];
            CHECK(utimes(p[k], tv) == 0);
        }
    }
    path_in(out, sizeof out, "ckpt.st");
    CHECK_OK(dm_write_file_atomic(out, "ok", 2));
    CHECK(access(p[0], F_OK) != 0 && access(p[1], F_OK) != 0);
    for (int k = 2; k < N; k++) CHECK(access(p[k], F_OK) == 0);
    for (int k = 2; k < N; k++) unlink(p[k]);
}

/* A new file takes 0666 less the umask (not a fixed mode); a replaced one keeps its mode;
 * a dangling link's target is made and the link kept. */
static void test_modes_links(void) {
    char path[512], link[512], target[512];
    path_in(path, sizeof path, "mode.txt");
    const mode_t old = umask(077);
    CHECK_OK(dm_write_file_atomic(path, "m", 1));
    umask(old);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
    CHECK(chmod(path, 0640) == 0);
    CHECK_OK(dm_write_file_atomic(path, "mm", 2));
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0640);
    path_in(link, sizeof link, "dangling.lnk");
    path_in(target, sizeof target, "made-later.txt");
    CHECK(symlink("made-later.txt", link) == 0); /* relative, and not there yet */
    CHECK_OK(dm_write_file_atomic(link, "via", 3));
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(stat(target, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 3);
}

/* An output half written: dm_remove_partial_outputs removes its temporary; the target
 * keeps its old contents. */
static void test_partial_removed(void) {
    char path[512], buf[64];
    path_in(path, sizeof path, "half.txt");
    CHECK_OK(dm_write_file_atomic(path, "whole", 5));
    dm_out_file o;
    CHECK_OK(dm_out_open(&o, path));
    CHECK_OK(dm_out_write(&o, "hal", 3));
    CHECK(count_temps("half.txt") == 1);
    dm_remove_partial_outputs();
    CHECK(count_temps("half.txt") == 0);
    CHECK(read_all(path, buf, sizeof buf) == 5 && !strcmp(buf, "whole"));
    dm_out_abort(&o);
    /* abort alone removes it too */
    CHECK_OK(dm_out_open(&o, path));
    CHECK(count_temps("half.txt") == 1);
    dm_out_abort(&o);
    CHECK(count_temps("half.txt") == 0);
}

/* Inputs that are not regular files: refused at once (an alarm ends a hang). */
static void test_inputs(void) {
    char fifo[512];
    path_in(fifo, sizeof fifo, "in.fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20); /* a blocked open fails the test instead of hanging it */
    dm_st_file *f = NULL;
    CHECK(dm_st_read(fifo, &f) == DM_ERR_IO && strstr(dm_last_error(), "FIFO"));
    char *text = NULL;
    CHECK(dm_read_file(fifo, 1 << 20, &text, NULL) == DM_ERR_IO && strstr(dm_last_error(), "FIFO"));
    CHECK(dm_read_file("/dev/zero", 1 << 20, &text, NULL) == DM_ERR_IO &&
          strstr(dm_last_error(), "character device"));
    CHECK(dm_input_regular(fifo) == DM_ERR_IO && dm_input_regular("/no/such/file") == DM_OK);
    int fd = -1;
    CHECK(dm_open_input(g_dir, &fd, NULL) == DM_ERR_IO && fd == -1 && strstr(dm_last_error(), "directory"));
    alarm(0);
    printf("  a FIFO as input: %s\n", (dm_st_read(fifo, &f), dm_last_error()));
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* The readers of small files (dm_read_file: config.json; a dataset's manifest, a CPU
 * profile, a plan) allocate what the file holds, not their limit: under an address-space
 * limit 512 KiB above what the process has mapped (as a batch scheduler's memory limit), a
 * 9-byte file read with a 1 GiB limit, a dataset manifest (64 MiB limit), a profile and a
 * plan (tests/fuzz/corpus/plan/tuned.json, for b2 j8 i16 h2 u32) are read; each asked
 * malloc for its whole limit before (fuzz_dataset ran at 17 inputs a second for it). The
 * limits still hold, at the byte. */
static void test_small_reads(void) {
    char small[512], dir[512], man[600], prof[512];
    path_in(small, sizeof small, "small.json");
    FILE *f = fopen(small, "wb");
    CHECK(f && fputs("{\"a\": 12}", f) >= 0 && fclose(f) == 0);
    path_in(dir, sizeof dir, "ds");
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(man, sizeof man, "%s/dataset.json", dir);
    f = fopen(man, "wb");
    CHECK(f && fputs("{\"format\": \"dmove-dataset\", \"version\": 1, \"tokenizer\": {\"hash\": "
                     "\"0123456789abcdef\", \"description\": \"t\"}, \"splits\": {}}", f) >= 0 && fclose(f) == 0);
    path_in(prof, sizeof prof, "profile.json");
    f = fopen(prof, "wb");
    CHECK(f && fputs("{\"version\": 1, \"machine\": {\"cpu\": \"c\", \"host\": \"h\"}, \"threads\": 1, "
                     "\"bandwidth_gbs\": {\"triad\": 20, \"read\": 30}, \"vector_gflops\": 100, \"sgemm_n\": 512, "
                     "\"sgemm\": [{\"threads\": 1, \"gflops\": 50}]}", f) >= 0 && fclose(f) == 0);
    dm_cpu_profile cp;
    CHECK_OK(dm_profile_load(prof, &cp));
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32;
    dm_device_model *dev = NULL;
    dm_analysis *an = NULL;
    CHECK_OK(dm_device_model_preset(&dev, "h100"));
    CHECK_OK(dm_analysis_new(&an, &cfg, dev, 4, 0));
    char *t = NULL;
    size_t n = 0;
    CHECK_OK(dm_read_file(small, 9, &t, &n));
    CHECK(t && n == 9 && !strcmp(t, "{\"a\": 12}"));
    free(t);
    CHECK(dm_read_file(small, 8, &t, &n) == DM_ERR_FORMAT && !t && strstr(dm_last_error(), "larger than 8"));
    /* a file longer than its size said (it grew): read whole, within the limit */
    int too_large = 0;
    f = fopen(small, "rb");
    CHECK(f && dm_read_stream(f, 2, 100, &t, &n, &too_large) == DM_OK && n == 9 && !too_large);
    if (f) fclose(f);
    free(t);
    f = fopen(small, "rb");
    CHECK(f && dm_read_stream(f, 2, 5, &t, &n, &too_large) == DM_ERR_FORMAT && too_large && !t);
    if (f) fclose(f);
#ifdef UNDER_ASAN
    printf("  SKIP the address-space limit (ASan maps its shadow memory beyond any such limit)\n");
#else
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        long pages = 0;
        FILE *sf = fopen("/proc/self/statm", "r");
        if (!sf || fscanf(sf, "%ld", &pages) != 1) _exit(3);
        fclose(sf);
        const rlim_t lim = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)512 << 10);
        const struct rlimit rl = {lim, lim};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(4);
        char *text = NULL;
        dm_dataset *d = NULL;
        const int a = dm_read_file(small, (size_t)1 << 30, &text, NULL) == DM_OK;
        if (!a) fprintf(stderr, "  dm_read_file: %s\n", dm_last_error());
        const int b = dm_dataset_open(&d, dir) == DM_OK;
        if (!b) fprintf(stderr, "  dm_dataset_open: %s\n", dm_last_error());
        dm_cpu_profile p;
        const int c = dm_profile_load(prof, &p) == DM_OK;
        if (!c) fprintf(stderr, "  dm_profile_load: %s\n", dm_last_error());
        const int e = dm_analysis_load_plan(an, "tests/fuzz/corpus/plan/tuned.json") == DM_OK;
        if (!e) fprintf(stderr, "  dm_analysis_load_plan: %s\n", dm_last_error());
        free(text);
        dm_dataset_free(d);
        _exit(a && b && c && e ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
    dm_analysis_free(an);
    dm_device_model_free(dev);
}

/* dm_st_first_bad: NaN and infinity in each float dtype, negatives where asked, an f64
 * past float's range (infinite once read as f32); integers never bad. */
static void test_first_bad(void) {
    const double d[4] = {1.0, -2.0, 1e300, 3.0};
    dm_st_tensor t = {.name = "t", .dtype = DM_ST_F64, .ndim = 1, .shape = {4}, .data = d, .nbytes = sizeof d};
    CHECK(dm_st_first_bad(&t, 0) == 2 && dm_st_first_bad(&t, 1) == 1);
    const float f[3] = {0.5f, -0.0f, NAN};
    t = (dm_st_tensor){.name = "t", .dtype = DM_ST_F32, .ndim = 1, .shape = {3}, .data = f, .nbytes = sizeof f};
    CHECK(dm_st_first_bad(&t, 1) == 2); /* -0 is not below zero */
    const uint16_t bf[3] = {0x3F80, 0x7F80, 0x0000}, hf[3] = {0x3C00, 0xBC00, 0x7E00}; /* bf16 1, inf; f16 1, -1, NaN */
    t = (dm_st_tensor){.name = "t", .dtype = DM_ST_BF16, .ndim = 1, .shape = {3}, .data = bf, .nbytes = sizeof bf};
    CHECK(dm_st_first_bad(&t, 0) == 1);
    t = (dm_st_tensor){.name = "t", .dtype = DM_ST_F16, .ndim = 1, .shape = {3}, .data = hf, .nbytes = sizeof hf};
    CHECK(dm_st_first_bad(&t, 0) == 2 && dm_st_first_bad(&t, 1) == 1);
    const int32_t i[2] = {-5, 7};
    t = (dm_st_tensor){.name = "t", .dtype = DM_ST_I32, .ndim = 1, .shape = {2}, .data = i, .nbytes = sizeof i};
    CHECK(dm_st_first_bad(&t, 1) == -1);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fifo_output();
    test_links_dirs_names();
    test_stale_temps();
    test_first_bad();
    test_modes_links();
    test_partial_removed();
    test_inputs();
    test_small_reads();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
    TEST_END();
}
