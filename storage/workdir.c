/* workdir.c: see workdir.h. */
#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct sl_workdir {
    int lock_fd;
    char path[PATH_MAX];
};

/* mkdir -p: creates each missing parent in turn. */
static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int sl_workdir_open(const char *path, sl_workdir_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = mkdirs(path);
    if (rc < 0) {
        snprintf(err, errlen, "work dir %s: cannot create: %s", path, strerror(-rc));
        return rc;
    }
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "work dir %s: not a directory", path);
        return -ENOTDIR;
    }
    if (access(path, W_OK) < 0) {
        rc = -errno;
        snprintf(err, errlen, "work dir %s: not writable: %s", path, strerror(errno));
        return rc;
    }
    sl_workdir_t *wd = calloc(1, sizeof *wd);
    if (!wd)
        return -ENOMEM;
    snprintf(wd->path, sizeof wd->path, "%s", path);
    char lock[PATH_MAX + 8];
    snprintf(lock, sizeof lock, "%s/LOCK", path);
    wd->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (wd->lock_fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "work dir %s: cannot open %s: %s", path, lock, strerror(errno));
        goto fail;
    }
    if (flock(wd->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        snprintf(err, errlen, "work dir %s: in use by another process (%s is locked)", path, lock);
        goto fail;
    }
    *out = wd;
    return 0;
fail:
    if (wd->lock_fd >= 0)
        close(wd->lock_fd);
    free(wd);
    return rc;
}

const char *sl_workdir_path(const sl_workdir_t *wd)
{
    return wd->path;
}

void sl_workdir_close(sl_workdir_t *wd)
{
    if (!wd)
        return;
    close(wd->lock_fd);
    free(wd);
}
