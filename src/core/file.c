/* file.c: writing files safely: a file is written to a temporary name beside it and
 * renamed, so a crash never leaves half a file (and a signal handler can remove the
 * temporaries, the next run the ones a killed process left); pipes and devices written
 * directly, never replaced; inputs opened only when they are regular files; and the
 * directories above a path made. */
#include "core/file.h"
#include "dmove_tools.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "dmove_tools.h"

dm_status dm_make_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return DM_OK;
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", path);
    memcpy(dir, path, n);
    dir[n] = 0;
    for (char *q = dir + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return dm_fail(DM_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
        *q = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dm_fail(DM_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
    return DM_OK;
}

/* --- outputs ------------------------------------------------------------------------ */

/* The temporaries being written, for a signal handler to remove (dm_remove_partial_outputs). */
enum { MAX_TEMPS = 32, TEMP_PATH = 4096, BASE_CUT = 200 };
static char g_temp[MAX_TEMPS][TEMP_PATH];
static volatile sig_atomic_t g_temp_on[MAX_TEMPS];
static pthread_mutex_t g_temp_lock = PTHREAD_MUTEX_INITIALIZER;

static int temp_register(const char *tmp) {
    if (strlen(tmp) >= TEMP_PATH || pthread_mutex_lock(&g_temp_lock) != 0) return -1;
    int slot = -1;
    for (int k = 0; k < MAX_TEMPS && slot < 0; k++)
        if (!g_temp_on[k]) {
            memcpy(g_temp[k], tmp, strlen(tmp) + 1);
            __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the name before the flag */
            g_temp_on[k] = 1;
            slot = k;
        }
    (void)pthread_mutex_unlock(&g_temp_lock);
    return slot; /* -1: more than MAX_TEMPS at once; written all the same, not removable */
}

static void temp_unregister(int slot) {
    if (slot >= 0) g_temp_on[slot] = 0;
}

/* 1 if this process is writing a temporary named `name` now (by its file name: one of
 * another directory kept too, the safe side). */
static int temp_is_mine(const char *name) {
    int mine = 0;
    for (int k = 0; k < MAX_TEMPS; k++) {
        if (!g_temp_on[k]) continue;
        const char *slash = strrchr(g_temp[k], '/');
        mine |= !strcmp(slash ? slash + 1 : g_temp[k], name);
    }
    return mine;
}

void dm_remove_partial_outputs(void) {
    for (int k = 0; k < MAX_TEMPS; k++)
        if (g_temp_on[k]) (void)unlink(g_temp[k]); /* async-signal-safe; nothing to do if it fails */
}

/* Removes the temporaries "<base>.tmp.<pid>.XXXXXX" (or the older writer's
 * "<base>.tmp.<pid>") in dir that a process no longer alive left behind (killed while
 * writing): its own name's only, and only when untouched for STALE_SECS (a writer in
 * another PID namespace or on another host sharing the directory is not ours to judge by
 * its pid alone). */
enum { STALE_SECS = 600 };
static void remove_stale(const char *dir, const char *base, size_t blen) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    const time_t now = time(NULL);
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, base, blen) != 0 || strncmp(e->d_name + blen, ".tmp.", 5) != 0) continue;
        const char *q = e->d_name + blen + 5;
        char *end;
        errno = 0;
        const long pid = strtol(q, &end, 10);
        if (end == q || pid <= 0 || errno || (*end && (*end != '.' || strlen(end) != 7))) continue;
        if (pid == (long)getpid() ? temp_is_mine(e->d_name) : !(kill((pid_t)pid, 0) != 0 && errno == ESRCH))
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            now - sb.st_mtime < STALE_SECS)
            continue;
        (void)unlinkat(dirfd(d), e->d_name, 0); /* best effort: another run may remove it first */
    }
    (void)closedir(d);
}

/* Where a symbolic link whose target does not exist yet points (links followed up to 16
 * deep, a relative target taken from the link's directory); NULL if that cannot be said. */
static char *dangling_target(const char *path) {
    char cur[TEMP_PATH], next[TEMP_PATH];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur) return NULL;
    for (int depth = 0; depth < 16; depth++) {
        struct stat sb;
        if (lstat(cur, &sb) != 0 || !S_ISLNK(sb.st_mode)) return strdup(cur);
        const ssize_t n = readlink(cur, next, sizeof next - 1);
        if (n <= 0 || (size_t)n >= sizeof next - 1) return NULL;
        next[n] = 0;
        const char *slash = strrchr(cur, '/');
        if (next[0] == '/' || !slash) {
            memcpy(cur, next, (size_t)n + 1);
        } else {
            const int dl = (int)(slash - cur) + 1;
            char joined[TEMP_PATH];
            if (snprintf(joined, sizeof joined, "%.*s%s", dl, cur, next) >= (int)sizeof joined) return NULL;
            memcpy(cur, joined, strlen(joined) + 1);
        }
    }
    return NULL;
}

/* The process's umask now, from /proc (umask() can only be read by setting it, which
 * other threads creating files at that moment would see); else by setting it back. */
static mode_t process_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    unsigned m;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &m) == 1) {
            (void)fclose(f);
            return (mode_t)(m & 0777);
        }
    if (f) (void)fclose(f);
    const mode_t u = umask(022);
    (void)umask(u);
    return u;
}

static dm_status out_stream(dm_out_file *o) {
    o->fd = open(o->path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (o->fd < 0) return dm_fail(DM_ERR_IO, "cannot open '%s' for writing: %s", o->path, strerror(errno));
    o->stream = 1;
    return DM_OK;
}

/* The temporary beside o->path, stale ones of the same name removed first. */
static dm_status out_temp(dm_out_file *o) {
    const char *slash = strrchr(o->path, '/');
    const char *base = slash ? slash + 1 : o->path;
    const size_t dlen = slash ? (size_t)(slash - o->path) : 0, blen = strlen(base);
    if (!blen) return dm_fail(DM_ERR_INVALID_ARG, "'%s' names a directory: give a file name", o->path);
    const size_t cut = blen < BASE_CUT ? blen : BASE_CUT;
    char dir[TEMP_PATH];
    if (dlen >= sizeof dir) return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", o->path);
    if (slash) memcpy(dir, o->path, dlen ? dlen : 1), dir[dlen ? dlen : 1] = 0;
    else snprintf(dir, sizeof dir, ".");
    remove_stale(dir, base, cut);
    const size_t tl = dlen + cut + 48;
    if (!(o->tmp = malloc(tl))) return dm_fail(DM_ERR_OOM, "out of memory");
    snprintf(o->tmp, tl, "%.*s%.*s.tmp.%ld.XXXXXX", (int)(base - o->path), o->path, (int)cut, base, (long)getpid());
    o->fd = mkstemp(o->tmp);
    if (o->fd < 0) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot create a file next to '%s': %s (is the directory there and "
                               "writable?)", o->path, strerror(errno));
        free(o->tmp), o->tmp = NULL;
        return st;
    }
    (void)fcntl(o->fd, F_SETFD, FD_CLOEXEC);
    o->slot = temp_register(o->tmp);
    return DM_OK;
}

dm_status dm_out_open(dm_out_file *o, const char *path) {
    if (!o) return dm_fail(DM_ERR_INVALID_ARG, "dm_out_open: NULL argument");
    memset(o, 0, sizeof *o);
    o->fd = -1, o->slot = -1;
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "no file name given");
    struct stat sb;
    char *target = NULL;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        target = realpath(path, NULL);
        if (!target) target = dangling_target(path); /* the link's target is to be made: the link kept */
    }
    o->path = target ? target : strdup(path);
    if (!o->path) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status st = DM_OK;
    if (stat(o->path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) st = dm_fail(DM_ERR_IO, "'%s' is a directory: give a file name", path);
        else if (S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode)) st = out_stream(o);
        else if (!S_ISREG(sb.st_mode))
            st = dm_fail(DM_ERR_IO, "'%s' is a socket or block device, not a file: dmove will not replace it",
                         path);
    } else if (errno != ENOENT) {
        st = dm_fail(DM_ERR_IO, "cannot use '%s': %s", path, strerror(errno));
    }
    if (st == DM_OK && !o->stream) st = out_temp(o);
    if (st != DM_OK) free(o->path), o->path = NULL;
    return st;
}

dm_status dm_out_write(dm_out_file *o, const void *data, size_t len) {
    if (!o || o->fd < 0 || (!data && len)) return dm_fail(DM_ERR_INVALID_ARG, "dm_out_write: no open output");
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(o->fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return dm_fail(DM_ERR_IO, "error writing '%s': %s", o->path, w < 0 ? strerror(errno) : "nothing written");
        p += w;
        len -= (size_t)w;
    }
    return DM_OK;
}

static void out_close(dm_out_file *o) {
    temp_unregister(o->slot);
    free(o->path), free(o->tmp);
    o->path = o->tmp = NULL, o->fd = -1, o->slot = -1;
}

void dm_out_abort(dm_out_file *o) {
    if (!o || !o->path) return;
    if (o->fd >= 0) (void)close(o->fd); /* giving up: its result changes nothing */
    if (o->tmp) (void)unlink(o->tmp);
    out_close(o);
}

/* fsync of the directory makes a rename durable; some file systems refuse it: harmless. */
static void sync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[TEMP_PATH];
    const size_t n = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    if (n >= sizeof dir) return;
    if (slash) memcpy(dir, path, n), dir[n] = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd); /* the file is in place either way */
    (void)close(fd);
}

dm_status dm_out_commit(dm_out_file *o) {
    if (!o || !o->path) return dm_fail(DM_ERR_INVALID_ARG, "dm_out_commit: no open output");
    int e = 0;
    if (o->stream) {
        if (close(o->fd) != 0) e = errno;
        dm_status st = e ? dm_fail(DM_ERR_IO, "error writing '%s': %s", o->path, strerror(e)) : DM_OK;
        out_close(o);
        return st;
    }
    /* the mode of the file replaced, or a new file's (0666 less the umask; mkstemp makes
     * 0600); a file system without modes (vfat, some FUSE) may refuse: the file stands */
    struct stat sb;
    (void)fchmod(o->fd, stat(o->path, &sb) == 0 ? (sb.st_mode & 07777) : (0666 & ~process_umask()));
    if (fsync(o->fd) != 0) e = errno;
    if (close(o->fd) != 0 && !e) e = errno;
    o->fd = -1;
    dm_status st = DM_OK;
    if (e) st = dm_fail(DM_ERR_IO, "error writing '%s': %s", o->path, strerror(e));
    else if (rename(o->tmp, o->path) != 0) st = dm_fail(DM_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    if (st != DM_OK) (void)unlink(o->tmp); /* best effort: the failure is already reported */
    else sync_dir_of(o->path);
    out_close(o);
    return st;
}

dm_status dm_write_output(const char *path, const void *data, size_t len) {
    if (!path || (!data && len)) return dm_fail(DM_ERR_INVALID_ARG, "dm_write_output: NULL argument");
    return dm_write_file_atomic(path, data, len);
}

dm_status dm_write_file_atomic(const char *path, const void *data, size_t len) {
    dm_out_file o;
    DM_TRY(dm_out_open(&o, path));
    dm_status st = dm_out_write(&o, data, len);
    if (st != DM_OK) {
        dm_out_abort(&o);
        return st;
    }
    return dm_out_commit(&o);
}

/* --- inputs ------------------------------------------------------------------------- */

/* What a path that is not a regular file is, for messages. */
static const char *kind_of(mode_t m) {
    return S_ISFIFO(m) ? "FIFO (named pipe)" : S_ISCHR(m) ? "character device" : S_ISSOCK(m) ? "socket"
         : S_ISBLK(m) ? "block device" : "special file";
}

dm_status dm_input_regular(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) return DM_OK; /* the caller's open says why */
    if (S_ISDIR(sb.st_mode)) return dm_fail(DM_ERR_IO, "'%s' is a directory, not a regular file", path);
    if (!S_ISREG(sb.st_mode))
        return dm_fail(DM_ERR_IO, "'%s' is a %s, not a regular file: dmove reads a file here (a pipe or device "
                       "could block or never end); write it to a file first", path, kind_of(sb.st_mode));
    return DM_OK;
}

dm_status dm_open_input(const char *path, int *fd, size_t *size) {
    *fd = -1;
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "no file name given");
    /* O_NONBLOCK: opening a FIFO does not wait for a writer */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return dm_fail(DM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    dm_status st = DM_OK;
    if (fstat(f, &sb) != 0) st = dm_fail(DM_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode)) st = dm_fail(DM_ERR_IO, "'%s' is a directory, not a regular file", path);
    else if (!S_ISREG(sb.st_mode))
        st = dm_fail(DM_ERR_IO, "'%s' is a %s, not a regular file: dmove reads a file here (a pipe or device "
                     "could block or never end); write it to a file first", path, kind_of(sb.st_mode));
    else if ((uint64_t)sb.st_size > (uint64_t)(SIZE_MAX / 2))
        st = dm_fail(DM_ERR_IO, "'%s' is too large (%lld bytes)", path, (long long)sb.st_size);
    else if (fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK) != 0)
        st = dm_fail(DM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    if (st != DM_OK) {
        (void)close(f); /* already failing */
        return st;
    }
    if (size) *size = (size_t)sb.st_size;
    *fd = f;
    return DM_OK;
}

dm_status dm_fopen_input(const char *path, FILE **out, size_t *size) {
    *out = NULL;
    int fd;
    DM_TRY(dm_open_input(path, &fd, size));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        (void)close(fd);
        return st;
    }
    *out = f;
    return DM_OK;
}

dm_status dm_read_stream(FILE *f, size_t size, size_t max, char **text, size_t *len, int *too_large) {
    *text = NULL;
    *len = 0;
    *too_large = 0;
    if (max > SIZE_MAX / 4) max = SIZE_MAX / 4;
    /* a buffer of the file's size (and one byte more, to see one that grew), doubled as it
     * proves short: a small file costs its size, never the limit */
    size_t cap = (size < max ? size : max) + 1, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        const size_t want = cap - n, got = fread(buf + n, 1, want, f);
        n += got;
        if (got < want || n > max) break; /* the end, an error, or past the limit */
        const size_t nc = cap > (max + 1) / 2 ? max + 1 : cap * 2;
        char *nb = realloc(buf, nc + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap = nc;
    }
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory");
    if (ferror(f) || n > max) {
        free(buf);
        *too_large = !ferror(f);
        return dm_fail(ferror(f) ? DM_ERR_IO : DM_ERR_FORMAT, ferror(f) ? "read error" : "larger than %zu bytes", max);
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return DM_OK;
}

dm_status dm_read_file(const char *path, size_t max, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    FILE *f;
    size_t size = 0, n = 0;
    int too_large = 0;
    DM_TRY(dm_fopen_input(path, &f, &size));
    const dm_status st = dm_read_stream(f, size, max, text, &n, &too_large);
    fclose(f);
    if (st == DM_ERR_OOM) return dm_fail(DM_ERR_OOM, "out of memory reading '%s'", path);
    if (too_large) return dm_fail(DM_ERR_FORMAT, "'%s' is larger than %zu bytes: not the file expected here", path, max);
    if (st != DM_OK) return dm_fail(DM_ERR_IO, "cannot read '%s'", path);
    if (len) *len = n;
    return DM_OK;
}
