/* test_files.c: how dmove writes and reads files (core/file.c), as a hostile user's
 * machine would test it: outputs that are FIFOs or devices are written, never replaced; a
 * symbolic link's target is written and the link kept; a directory is refused; a name of
 * 250 characters works (the temporary stays within the file-name limit); temporaries a
 * dead process left are removed by the next write of the same name, a live one's kept;
 * the temporaries being written are removed by dm_remove_partial_outputs (what the CLI's
 * signal handler calls); inputs that are FIFOs or devices are refused at once instead of
 * blocking or never ending. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/file.h"
#include "core/safetensors.h"
#include "dmove.h"
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

/* Stale temporaries: a dead process's removed by the next write of the name, a live
 * process's kept, another name's kept. */
static void test_stale_temps(void) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    int st;
    CHECK(dead > 0 && waitpid(dead, &st, 0) == dead);
    char p1[512], p2[512], p3[512], p4[512], out[512];
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "ckpt.st.tmp.%ld.Ab12Cd", (long)dead);
    snprintf(n2, sizeof n2, "ckpt.st.tmp.%ld", (long)dead); /* the older writer's name */
    path_in(p1, sizeof p1, n1);
    path_in(p2, sizeof p2, n2);
    snprintf(n1, sizeof n1, "ckpt.st.tmp.%ld.Zz99Yy", (long)getppid()); /* alive */
    path_in(p3, sizeof p3, n1);
    snprintf(n1, sizeof n1, "other.st.tmp.%ld.Ab12Cd", (long)dead);
    path_in(p4, sizeof p4, n1);
    const char *all[4] = {p1, p2, p3, p4};
    for (int k = 0; k < 4; k++) {
        FILE *f = fopen(all[k], "wb");
        CHECK(f != NULL);
        if (f) fclose(f);
    }
    path_in(out, sizeof out, "ckpt.st");
    CHECK_OK(dm_write_file_atomic(out, "ok", 2));
    CHECK(access(p1, F_OK) != 0 && access(p2, F_OK) != 0);
    CHECK(access(p3, F_OK) == 0 && access(p4, F_OK) == 0);
    unlink(p3), unlink(p4);
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

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fifo_output();
    test_links_dirs_names();
    test_stale_temps();
    test_partial_removed();
    test_inputs();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
    TEST_END();
}
