/* file.c: writing files safely: a file is written to a temporary name beside it and
 * renamed, so a crash never leaves half a file; and the directories above a path made. */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

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

dm_status dm_write_file_atomic(const char *path, const void *data, size_t len) {
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "no file name given");
    size_t plen = strlen(path) + 16;
    char *tmp = malloc(plen);
    if (!tmp) return dm_fail(DM_ERR_OOM, "out of memory");
    snprintf(tmp, plen, "%s.tmpXXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot create a file next to '%s': %s (is the "
                               "directory there and writable?)", path, strerror(errno));
        free(tmp);
        return st;
    }
    const char *p = data;
    size_t left = len;
    int e = 0;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            e = errno;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (!e && fchmod(fd, 0644) != 0) e = errno; /* mkstemp makes 0600 */
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    dm_status st = DM_OK;
    if (e)
        st = dm_fail(DM_ERR_IO, "error writing '%s': %s", path, strerror(e));
    else if (rename(tmp, path) != 0)
        st = dm_fail(DM_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (st != DM_OK) unlink(tmp); /* best effort: the failure is already reported */
    free(tmp);
    return st;
}

dm_status dm_read_file(const char *path, size_t max, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "no file name given");
    struct stat sb;
    if (stat(path, &sb) != 0) return dm_fail(DM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return dm_fail(DM_ERR_IO, "'%s' is a directory, not a file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return dm_fail(DM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    const int err = buf && ferror(f);
    fclose(f);
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory reading '%s'", path);
    if (err || n > max) {
        free(buf);
        if (err) return dm_fail(DM_ERR_IO, "cannot read '%s'", path);
        return dm_fail(DM_ERR_FORMAT, "'%s' is larger than %zu bytes: not the file expected here", path, max);
    }
    buf[n] = 0;
    *text = buf;
    if (len) *len = n;
    return DM_OK;
}
