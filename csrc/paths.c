/* paths.c: reading tracee memory and turning what it names into absolute paths. */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096u

ssize_t tracee_read(pid_t tid, uint64_t addr, void *buf, size_t n)
{
    struct iovec local = { buf, n }, remote = { (void *)(uintptr_t)addr, n };
    ssize_t r = process_vm_readv(tid, &local, 1, &remote, 1, 0);
    if (r >= 0 && (size_t)r < n) {
        errno = EFAULT;
        return -1;
    }
    return r;
}

/* A read that crosses into an unmapped page fails whole, so read up to each
 * page boundary separately. */
ssize_t tracee_read_str(pid_t tid, uint64_t addr, char *buf, size_t cap, int *truncated)
{
    size_t got = 0;
    *truncated = 0;
    if (addr == 0) {
        errno = EFAULT;
        return -1;
    }
    while (got + 1 < cap) {
        size_t chunk = PAGE - ((addr + got) % PAGE);
        if (chunk > cap - 1 - got)
            chunk = cap - 1 - got;
        if (tracee_read(tid, addr + got, buf + got, chunk) < 0)
            return -1;
        char *nul = memchr(buf + got, '\0', chunk);
        if (nul)
            return nul - buf;
        got += chunk;
    }
    buf[got] = '\0';
    *truncated = 1;
    return (ssize_t)got;
}

ssize_t proc_link(pid_t tid, const char *what, char *buf, size_t cap)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/%s", (int)tid, what);
    ssize_t n = readlink(p, buf, cap - 1);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

/* Lexical normalisation, like Python's os.path.normpath on an absolute path:
 * symlinks are not followed (the tracee's view may change under us anyway). */
size_t path_join_normalize(const char *base, const char *rel, char *out, size_t cap)
{
    char tmp[2 * CAPER_PATH_MAX + 2];
    if (rel[0] == '/' || !base)
        snprintf(tmp, sizeof tmp, "%s", rel);
    else
        snprintf(tmp, sizeof tmp, "%s/%s", base, rel);
    size_t o = 0;
    out[o++] = '/';
    char *save = NULL;
    for (char *seg = strtok_r(tmp, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
        if (strcmp(seg, ".") == 0)
            continue;
        if (strcmp(seg, "..") == 0) {
            while (o > 1 && out[o - 1] != '/')
                o--;
            if (o > 1)
                o--;  /* drop the slash too */
            continue;
        }
        size_t n = strlen(seg);
        if (o > 1) {
            if (o + 1 >= cap)
                break;
            out[o++] = '/';
        }
        if (o + n >= cap)
            n = cap - 1 - o;
        memcpy(out + o, seg, n);
        o += n;
    }
    /* "/.." leaves o == 1 with out "/" */
    out[o] = '\0';
    return o;
}

/* ---- opening what a tracee names, inside the tracee's root ----------------
 *
 * The tracer lives in the host's root and mount namespace. A path the tracee
 * passes means something only in the tracee's: /proc/<tid>/root/<path> would
 * let an absolute symlink component, '..' or a magic link (/proc/self/cwd)
 * be resolved in the tracer's root instead, and so name a host object. So
 * every path is resolved by openat2 from a descriptor of the tracee's root,
 * with RESOLVE_IN_ROOT (absolute symlinks and '..' stop at that root, as the
 * kernel does for the tracee) and RESOLVE_NO_MAGICLINKS (a /proc link would
 * jump wherever its target is, the tracer's own cwd included). A relative
 * path is joined to the tracee's cwd written inside that root, and that text
 * is checked to name the very directory the cwd is. */

#define TRACEE_RESOLVE (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)

static int openat2_(int dirfd, const char *path, uint64_t flags, uint64_t resolve)
{
    struct open_how how = { .flags = flags | O_PATH | O_CLOEXEC, .resolve = resolve };
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

int have_openat2(void)
{
    int fd = openat2_(AT_FDCWD, "/", O_DIRECTORY, RESOLVE_IN_ROOT);
    if (fd < 0)
        return errno != ENOSYS && errno != EINVAL ? 1 : 0;
    close(fd);
    return 1;
}

static int same_object(int a, int b)
{
    struct statx x, y;
    if (statx(a, "", AT_EMPTY_PATH, STATX_INO | STATX_MNT_ID, &x) < 0 ||
        statx(b, "", AT_EMPTY_PATH, STATX_INO | STATX_MNT_ID, &y) < 0 ||
        !(x.stx_mask & y.stx_mask & STATX_MNT_ID))
        return 0;
    return x.stx_dev_major == y.stx_dev_major && x.stx_dev_minor == y.stx_dev_minor &&
           x.stx_ino == y.stx_ino && x.stx_mnt_id == y.stx_mnt_id;
}

/* A directory of the tracee (its cwd, or "fd/N") as a path inside its root,
 * into out (CAPER_PATH_MAX): 0, or -EACCES when it cannot be written there
 * (a cwd outside a chroot, a deleted directory, one moved meanwhile). */
static int dir_in_root(pid_t tid, const char *which, int root, char *out)
{
    char dir[CAPER_PATH_MAX], top[CAPER_PATH_MAX];
    /* Both links read from the host print the path from the top of the
     * sandbox's mount tree; under a chroot inside it, the root is a prefix. */
    if (proc_link(tid, which, dir, sizeof dir) < 0 || proc_link(tid, "root", top, sizeof top) < 0)
        return -EACCES;
    const char *rel = dir;
    if (strcmp(top, "/") != 0) {
        size_t n = strlen(top);
        if (strncmp(dir, top, n) != 0 || (dir[n] != '/' && dir[n] != '\0'))
            return -EACCES;
        rel = dir[n] ? dir + n : "/";
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/%d/%s", (int)tid, which);
    int real = open(self, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (real < 0)
        return -EACCES;
    int named = openat2_(root, rel, O_DIRECTORY, TRACEE_RESOLVE | RESOLVE_NO_SYMLINKS);
    int ok = named >= 0 && same_object(real, named);
    close(real);
    if (named >= 0)
        close(named);
    if (!ok)
        return -EACCES;
    snprintf(out, CAPER_PATH_MAX, "%s", rel);
    return 0;
}

/* The directory a relative name starts from: the tracee's cwd or its dirfd
 * itself (opened through its /proc link, which the tracer may follow: it
 * lands on that very directory, in the tracee's mounts), or -1. */
int tracee_start(pid_t tid, int dirfd)
{
    char at[64];
    if (dirfd == AT_FDCWD)
        snprintf(at, sizeof at, "/proc/%d/cwd", (int)tid);
    else
        snprintf(at, sizeof at, "/proc/%d/fd/%d", (int)tid, dirfd);
    return open(at, O_PATH | O_CLOEXEC);
}

int tracee_open(pid_t tid, int dirfd, const char *raw, int follow, int *refused)
{
    char root_link[64], dir[CAPER_PATH_MAX], path[2 * CAPER_PATH_MAX + 2];
    *refused = 0;
    if (raw[0] != '\0' && raw[0] != '/' && (dirfd == AT_FDCWD || dirfd >= 0)) {
        /* A name that stays below the directory it starts from means the same
         * to the tracer as to the kernel: looked up from that directory, with
         * no '..' above it and no absolute symlink (RESOLVE_BENEATH answers
         * EXDEV to both), no magic link (ELOOP). Those go the long way. */
        int start = tracee_start(tid, dirfd);
        if (start < 0 && errno == ENOENT && dirfd >= 0)
            return -EBADF;   /* no such descriptor: the kernel's answer */
        if (start >= 0) {
            int fd = openat2_(start, raw, follow ? 0 : O_NOFOLLOW,
                              RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
            int err = errno;
            close(start);
            if (fd >= 0)
                return fd;
            if (err != EXDEV && err != ELOOP && err != EAGAIN && err != ENOSYS && err != EINVAL)
                return -err;
        }
    }
    snprintf(root_link, sizeof root_link, "/proc/%d/root", (int)tid);
    int root = open(root_link, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return -ESRCH;
    const char *name = raw;
    if (raw[0] != '/') {
        char which[32];
        if (dirfd == AT_FDCWD)
            snprintf(which, sizeof which, "cwd");
        else
            snprintf(which, sizeof which, "fd/%d", dirfd);
        int r = dir_in_root(tid, which, root, dir);
        if (r < 0) {
            close(root);
            *refused = 1;
            return r;
        }
        snprintf(path, sizeof path, "%s/%s", dir, raw[0] ? raw : ".");
        name = path;
    }
    int fd = openat2_(root, name, follow ? 0 : O_NOFOLLOW, TRACEE_RESOLVE);
    int err = errno;
    close(root);
    if (fd >= 0)
        return fd;
    /* A magic link (ELOOP), a '..' race (EAGAIN), or no openat2 at all
     * (ENOSYS, EINVAL from an old kernel): what the tracee meant cannot be
     * found safely, so the call is refused. Other errors are the kernel's
     * answer to the tracee's own lookup. */
    if (err == ELOOP || err == EAGAIN || err == EXDEV || err == ENOSYS || err == EINVAL) {
        *refused = 1;
        return -EACCES;
    }
    return -err;
}

ssize_t tracee_real_path(pid_t tid, int dirfd, const char *raw, int follow, char *out, size_t cap)
{
    int refused;
    int fd = tracee_open(tid, dirfd, raw, follow, &refused);
    if (fd < 0) {
        errno = -fd;
        return -1;
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(self, out, cap - 1);
    close(fd);
    if (n >= 0)
        out[n] = '\0';
    return n;
}

/* Whether the object fd is on a mount of tid's mount namespace: mount ids
 * are not shared between namespaces (a copied namespace gets new ones), so a
 * host object reached by any route fails this. */
int in_mount_ns_of(pid_t tid, int fd)
{
    struct statx x;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &x) < 0 || !(x.stx_mask & STATX_MNT_ID))
        return 0;
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/mountinfo", (int)tid);
    FILE *f = fopen(p, "re");
    if (!f)
        return 0;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long long id;
        size_t n = strlen(line);
        if (sscanf(line, "%llu ", &id) == 1 && id == x.stx_mnt_id)
            found = 1;
        while (n && line[n - 1] != '\n' && fgets(line, sizeof line, f))  /* a long line's rest */
            n = strlen(line);
    }
    fclose(f);
    return found;
}
