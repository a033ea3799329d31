/* names.c: acting for the tracee on names. link(2) and rename(2), in all their
 * forms, are done here, by the tracer, from its own copy of both names: the
 * kernel would read them again from the tracee's memory after any check, and
 * another thread (or a process sharing the memory) can rewrite them in
 * between (the tracer saw a decoy linked, the kernel linked the credential).
 * Each name is found as the kernel finds it for the tracee: its directory by
 * tracee_open (strictly inside the tracee's view), its last component by the
 * call itself. The tracer's credentials match the tracee's wherever these
 * calls check any (docs/tracer.md). The decoder (trace.c) reports the result
 * and the paths filled in here, which are those of what was acted on. */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Whether raw goes through the tracee's own /proc/self or thread-self (its
 * /proc a procfs): the tracer's lookup finds no "self" there (it is not in
 * the sandbox's pid namespace) and follows no magic link, so such a name is
 * refused, not answered ENOENT; but see own_fd_name. */
static int through_own_proc(pid_t tid, const char *raw)
{
    if (strncmp(raw, "/proc/self", 10) != 0 && strncmp(raw, "/proc/thread-self", 17) != 0)
        return 0;
    const char *rest = raw + (raw[6] == 's' ? 10 : 17);
    if (*rest != '\0' && *rest != '/')
        return 0;
    int refused, proc = tracee_open(tid, AT_FDCWD, "/proc", 0, &refused);
    struct statfs sf;
    int is_proc = proc >= 0 && fstatfs(proc, &sf) == 0 && sf.f_type == PROC_SUPER_MAGIC;
    if (proc >= 0)
        close(proc);
    return is_proc;
}

/* The descriptor a source of "/proc/self/fd/N" (or thread-self) names, the
 * way to give an O_TMPFILE file a name: N, or -1 for any other name. */
static int own_fd_name(pid_t tid, const char *raw)
{
    int n = -1, end = 0;
    if ((sscanf(raw, "/proc/self/fd/%9d%n", &n, &end) != 1 &&
         sscanf(raw, "/proc/thread-self/fd/%9d%n", &n, &end) != 1) || raw[end] || n < 0)
        return -1;
    return through_own_proc(tid, raw) ? n : -1;
}

/* One of the tracee's descriptors: the same open file (pidfd_getfd), or for
 * an O_PATH one (pidfd_getfd takes none) the object its /proc link lands on. */
static int own_fd(pid_t tid, int n)
{
    if (n == AT_FDCWD) {                     /* linkat(AT_FDCWD, "", AT_EMPTY_PATH): the cwd */
        int fd = tracee_start(tid, n);
        return fd < 0 ? -ESRCH : fd;
    }
    int fd = tracee_fd(tid, (uint64_t)(unsigned)n);
    if (fd < 0 && errno == EBADF && n >= 0)
        fd = tracee_start(tid, n);
    return fd < 0 ? -EBADF : fd;
}

/* The directory the last component of name is looked up in, opened (O_PATH),
 * and that component (*last points into name; trailing slashes kept: the
 * call judges them as it would the tracee's). A name of slashes only is the
 * root, whose last component "." fails as the root does (EBUSY, EEXIST).
 * Returns the descriptor or -errno. */
static int parent_of(pid_t tid, int dirfd, const char *name, const char **last, int *refused)
{
    *refused = 0;
    size_t end = strlen(name);
    if (end == 0)
        return -ENOENT;
    if (through_own_proc(tid, name)) {
        *refused = 1;
        return -EACCES;
    }
    while (end > 0 && name[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && name[start - 1] != '/')
        start--;
    *last = end ? name + start : ".";
    if (start == 0 && name[0] != '/') {      /* "x": the start directory itself */
        int fd = tracee_start(tid, dirfd);
        if (fd < 0)
            return errno == ENOENT && dirfd != AT_FDCWD ? -EBADF : -ESRCH;
        return fd;
    }
    char dir[CAPER_PATH_MAX + 1];
    size_t n = start ? start : 1;           /* "/x" and "///": the root */
    memcpy(dir, name, n);
    dir[n] = '\0';
    int fd = tracee_open(tid, dirfd, dir, 1, refused);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode))) {
        close(fd);
        return -ENOTDIR;
    }
    return fd;
}

/* The path of what descriptor fd is, as the host prints it (the form of
 * every path the tracer reports), joined to last; "" if unknown. */
static void path_at(int fd, const char *last, char *out)
{
    char self[64], dir[CAPER_PATH_MAX];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(self, dir, sizeof dir - 1);
    if (n < 0) {
        out[0] = '\0';
        return;
    }
    dir[n] = '\0';
    if (last)
        path_join_normalize(dir, last, out, CAPER_PATH_MAX);
    else
        memcpy(out, dir, (size_t)n + 1);
}

/* linkat's source: the object the name leads to (a final symlink followed
 * only with AT_SYMLINK_FOLLOW); with AT_EMPTY_PATH and no name, the
 * descriptor itself, so the kernel's rule on who may give it a name judges
 * the file the tracee opened; "/proc/self/fd/N", descriptor N. *empty is set
 * for a descriptor given by AT_EMPTY_PATH. */
static int link_source(pid_t tid, const struct name_call *nc, int *empty, int *refused)
{
    *refused = *empty = 0;
    if (nc->raw[0][0] == '\0' && !(nc->flags & AT_EMPTY_PATH))
        return -ENOENT;
    if (nc->raw[0][0] == '\0') {
        *empty = 1;
        return own_fd(tid, nc->dirfd[0]);
    }
    int n = (nc->flags & AT_SYMLINK_FOLLOW) ? own_fd_name(tid, nc->raw[0]) : -1;
    if (n >= 0)
        return own_fd(tid, n);
    if (through_own_proc(tid, nc->raw[0])) {
        *refused = 1;
        return -EACCES;
    }
    return tracee_open(tid, nc->dirfd[0], nc->raw[0], (nc->flags & AT_SYMLINK_FOLLOW) != 0,
                       refused);
}

static int64_t do_link(pid_t tid, const struct name_call *nc, char paths[3][CAPER_PATH_MAX],
                       int *refused)
{
    if (nc->flags & ~(uint32_t)(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH))
        return -EINVAL;
    int empty, src = link_source(tid, nc, &empty, refused);
    if (src < 0)
        return src;
    const char *last;
    int dir = parent_of(tid, nc->dirfd[1], nc->raw[1], &last, refused);
    if (dir < 0) {
        close(src);
        return dir;
    }
    path_at(src, NULL, paths[2]);
    path_at(dir, last, paths[1]);
    int64_t r = 0;
    if (empty) {
        /* The tracee's own descriptor: the kernel checks who opened it. */
        if (linkat(src, "", dir, last, AT_EMPTY_PATH) < 0)
            r = -errno;
    } else {
        /* The object found above, exactly (its /proc link, followed, lands on
         * it and nothing else: a symlink stays itself). */
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", src);
        if (linkat(AT_FDCWD, self, dir, last, AT_SYMLINK_FOLLOW) < 0)
            r = -errno;
    }
    close(src);
    close(dir);
    return r;
}

/* Whether name in dir is a mount's root in the tracee's mounts (dir is one of
 * its directories, so the lookup crosses its mount points, not the
 * tracer's). The kernel answers EBUSY to a rename at or onto one only for
 * mounts of the caller's namespace: the tracer's call would detach the
 * sandbox's /proc, /sys or /dev, or move a cover (adv13a 01). */
static int mount_root_at(int dir, const char *name)
{
    struct statx x;
    return statx(dir, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, 0, &x) == 0 &&
           (x.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
           (x.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

static int64_t do_rename(pid_t tid, const struct name_call *nc, char paths[3][CAPER_PATH_MAX],
                         int *refused)
{
    const char *last[2];
    int dir[2] = { -1, -1 };
    int64_t r = 0;
    for (int i = 0; i < 2 && r == 0; i++)
        if ((dir[i] = parent_of(tid, nc->dirfd[i], nc->raw[i], &last[i], refused)) < 0)
            r = dir[i];
    if (r == 0) {
        path_at(dir[0], last[0], paths[0]);
        path_at(dir[1], last[1], paths[1]);
        memcpy(paths[2], paths[0], CAPER_PATH_MAX);  /* a rename does not follow its source */
        if (mount_root_at(dir[0], last[0]) || mount_root_at(dir[1], last[1]))
            r = -EBUSY;
        else if (syscall(SYS_renameat2, dir[0], last[0], dir[1], last[1], nc->flags) < 0)
            r = -errno;
    }
    for (int i = 0; i < 2; i++)
        if (dir[i] >= 0)
            close(dir[i]);
    return r;
}

int64_t name_call_for(pid_t tid, const struct name_call *nc, char paths[3][CAPER_PATH_MAX],
                      int *refused)
{
    for (int i = 0; i < 3; i++)
        paths[i][0] = '\0';
    return nc->is_link ? do_link(tid, nc, paths, refused) : do_rename(tid, nc, paths, refused);
}
