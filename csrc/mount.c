/* mount.c: the sandbox's own view of the filesystem, set up by its init.
 *
 * Order: (1) make every mount private, so nothing propagates to the host;
 * (2) hold the host's harmless device nodes by O_PATH descriptors; (3) the
 * caller's mounts (the snapshot layers, assembled under new_root); (4) a
 * fresh read-only /proc for the new pid namespace;
 * (5) a minimal /dev of the held nodes; (6) a fresh read-only /sys for the
 * new net namespace; (7) move into new_root and drop the old root. Steps 4-6
 * mount below new_root, so they come along.
 * Runs in a fork()ed child of a threaded process: no malloc.
 */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MNT_SAFE (MS_NOSUID | MS_NODEV | MS_NOEXEC)
#define PTY_MAX "48"   /* ptys of the sandbox's devpts */

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
/* struct mount_attr and its bits (linux/mount.h, not in every libc's headers) */
struct setattr_args { uint64_t attr_set, attr_clr, propagation, userns_fd; };
#define ATTR_RDONLY 0x1
#define ATTR_NOSUID 0x2
#define ATTR_NODEV  0x4
#define ATTR_NOEXEC 0x8

/* A read-only remount of a bind with MS_REC: mount(2) would change the top
 * mount only and leave the mounts below it writable, reaching the host. */
static int remount_tree(const char *dst, unsigned long flags)
{
    struct setattr_args a = { 0 };
    a.attr_set = (flags & MS_RDONLY ? ATTR_RDONLY : 0) | (flags & MS_NOSUID ? ATTR_NOSUID : 0) |
                 (flags & MS_NODEV ? ATTR_NODEV : 0) | (flags & MS_NOEXEC ? ATTR_NOEXEC : 0);
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, dst, AT_RECURSIVE, &a, sizeof a);
}

int caper_can_remount_tree(void)
{
    /* A size below the first struct's: EINVAL where the call exists, before any
     * permission check; ENOSYS from an old kernel, EPERM from a seccomp policy. */
    return syscall(SYS_mount_setattr, -1, "", 0, NULL, 0) < 0 && errno != ENOSYS && errno != EPERM;
}

static int do_mount(struct caper_failure *f, uint32_t step, const char *src, const char *dst,
                    const char *type, unsigned long flags, const char *data)
{
    const unsigned long tree = MS_BIND | MS_REMOUNT | MS_REC;
    if ((flags & tree) == tree) {
        if (remount_tree(dst, flags) == 0)
            return 0;
        int e = errno;
        fail_set(f, step, e, "mount_setattr(%s, AT_RECURSIVE, 0x%lx)%s", dst, flags,
                 e == ENOSYS ? " (hint: Linux 5.12 or later is needed)" : "");
        return -1;
    }
    if (mount(src, dst, type, flags, data) == 0)
        return 0;
    int e = errno;
    fail_set(f, step, e, "mount(%s, %s, %s, 0x%lx)%s", src ? src : "none", dst,
             type ? type : "none", flags,
             e == EPERM ? " (hint: needs root or a user namespace)" : "");
    return -1;
}

/* root + path into buf: the sandbox's tree is assembled below its new root
 * (or in place, when root is ""), before the sandbox moves in. */
static const char *at(char *buf, const char *root, const char *path)
{
    snprintf(buf, CAPER_PATH_MAX, "%s%s", root, path);
    return buf;
}

/* Bind a path onto itself read-only (a knob of the host kernel). */
static int make_readonly(struct caper_failure *f, uint32_t step, const char *path)
{
    if (access(path, F_OK) != 0)
        return 0;
    if (do_mount(f, step, path, path, NULL, MS_BIND | MS_REC, NULL) < 0)
        return -1;
    return do_mount(f, step, NULL, path, NULL,
                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* A fresh /proc for the new pid namespace, read-only as a whole. Its
 * entries outside the process directories are one set of objects for every
 * proc mount of the host: a write to a knob, or a chmod or chown of any
 * entry (/proc/cpuinfo as much as /proc/scsi/scsi), would reach the host.
 * A list of knobs to cover leaves out the ones nobody listed, so there is
 * none: what a command loses is writing its own process files (comm,
 * oom_score_adj, a nested user namespace's uid_map), which fail with EROFS. */
static int setup_proc(const char *root, struct caper_failure *f)
{
    char p[CAPER_PATH_MAX];
    return do_mount(f, CAPER_STEP_MOUNT_PROC, "proc", at(p, root, "/proc"), "proc",
                    MS_RDONLY | MNT_SAFE, NULL);
}

static const char *const dev_nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
enum { NNODES = sizeof dev_nodes / sizeof dev_nodes[0] };

/* The host's nodes are held by O_PATH descriptors before the root moves or
 * a tmpfs covers /dev, then bind-mounted by their /proc/self/fd names. */
static int hold_dev_nodes(int fds[NNODES], struct caper_failure *f)
{
    char path[64];
    for (int i = 0; i < NNODES; i++) {
        snprintf(path, sizeof path, "/dev/%s", dev_nodes[i]);
        fds[i] = open(path, O_PATH | O_CLOEXEC);
        if (fds[i] < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "open(%s, O_PATH)", path);
            return -1;
        }
    }
    return 0;
}

static int setup_dev(const char *root, const int fds[NNODES], uint64_t shm_size,
                     struct caper_failure *f)
{
    const char *const *nodes = dev_nodes;
    char src[64], dst[CAPER_PATH_MAX], p[CAPER_PATH_MAX], shm[96];
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "tmpfs", at(p, root, "/dev"), "tmpfs",
                 MS_NOSUID | MS_NOEXEC, "mode=755,size=64k") < 0)
        return -1;
    for (int i = 0; i < NNODES; i++) {
        snprintf(dst, sizeof dst, "%s/dev/%s", root, nodes[i]);
        int t = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (t < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "open(%s, O_CREAT)", dst);
            return -1;
        }
        close(t);
        snprintf(src, sizeof src, "/proc/self/fd/%d", fds[i]);
        /* Read-only binds: a device node is the host's own inode, so a chmod,
         * chown or utimes of it would change the host's /dev; reads and writes
         * of a device are the driver's and need no writable mount. */
        if (do_mount(f, CAPER_STEP_MOUNT_DEV, src, dst, NULL, MS_BIND, NULL) < 0 ||
            do_mount(f, CAPER_STEP_MOUNT_DEV, NULL, dst, NULL,
                     MS_BIND | MS_REMOUNT | MS_REC | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL) < 0)
            return -1;
        close(fds[i]);
    }
    if (mkdir(at(p, root, "/dev/pts"), 0755) < 0 || mkdir(at(p, root, "/dev/shm"), 01777) < 0) {
        fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "mkdir(%s)", p);
        return -1;
    }
    /* max=: the ptys of every devpts instance count against the one global
     * kernel.pty.max (4096, 1024 of them kept for the host's own instance);
     * unbounded, one run could take all the rest from containers, other
     * sandboxes and terminals. A few dozen cover terminals, expect and tests. */
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "devpts", at(p, root, "/dev/pts"), "devpts",
                 MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,max=" PTY_MAX) < 0)
        return -1;
    /* A tmpfs is memory, half of RAM by default: bounded in bytes and inodes
     * (its pages also count against the run's memory cgroup). */
    snprintf(shm, sizeof shm, "mode=1777,size=%llu,nr_inodes=%llu",
             (unsigned long long)(shm_size ? shm_size : 65536),
             (unsigned long long)(shm_size ? shm_size / 4096 + 16 : 16));
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "tmpfs", at(p, root, "/dev/shm"), "tmpfs", MNT_SAFE,
                 shm) < 0)
        return -1;
    static const char *const links[][2] = {
        { "pts/ptmx", "/dev/ptmx" }, { "/proc/self/fd", "/dev/fd" },
        { "/proc/self/fd/0", "/dev/stdin" }, { "/proc/self/fd/1", "/dev/stdout" },
        { "/proc/self/fd/2", "/dev/stderr" },
    };
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
        if (symlink(links[i][0], at(p, root, links[i][1])) < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "symlink(%s, %s)", links[i][0], p);
            return -1;
        }
    /* No new nodes, no writes: the minimal /dev is fixed from here on. */
    return do_mount(f, CAPER_STEP_MOUNT_DEV, NULL, at(p, root, "/dev"), NULL,
                    MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "mode=755,size=64k");
}

static int setup_sys(const char *root, struct caper_failure *f)
{
    char p[CAPER_PATH_MAX];
    /* A fresh sysfs shows only the new net namespace's devices and has no
     * cgroup or other mounts below it. */
    if (mount("sysfs", at(p, root, "/sys"), "sysfs", MS_RDONLY | MNT_SAFE, NULL) == 0)
        return 0;
    return make_readonly(f, CAPER_STEP_MOUNT_SYS, p);
}

/* pivot_root(".", ".") stacks the old root on the new one; detaching it
 * leaves only the new root (the pivot_root(2) idiom: no put_old directory,
 * so nothing is created in the snapshot). */
static int enter_root(const char *new_root, struct caper_failure *f)
{
    if (chdir(new_root) < 0) {
        fail_set(f, CAPER_STEP_PIVOT_ROOT, errno, "chdir(%s)", new_root);
        return -1;
    }
    if (syscall(SYS_pivot_root, ".", ".") < 0) {
        fail_set(f, CAPER_STEP_PIVOT_ROOT, errno, "pivot_root(%s)", new_root);
        return -1;
    }
    if (umount2(".", MNT_DETACH) < 0) {
        fail_set(f, CAPER_STEP_PIVOT_ROOT, errno, "umount2(old root of %s)", new_root);
        return -1;
    }
    if (chdir("/") < 0) {
        fail_set(f, CAPER_STEP_PIVOT_ROOT, errno, "chdir(/)");
        return -1;
    }
    return 0;
}

/* The host path a planned mount stood for went away between the plan and the
 * set-up (a busy host's /tmp: another program removed its directory). There
 * is then nothing at that path to overlay, bind or hold read-only, and the
 * mount is skipped instead of failing the run: what the command finds there
 * is what the host has, nothing, and a write there lands in the parent's
 * layer like any other. */
static int gone_since_plan(const struct caper_mount *m, int err)
{
    struct stat st;
    if (err != ENOENT)
        return 0;
    if (lstat(m->target, &st) < 0 && errno == ENOENT)
        return 1;
    return m->source && m->source[0] == '/' && (m->flags & MS_BIND) &&
           lstat(m->source, &st) < 0 && errno == ENOENT;
}

int mount_setup(const struct caper_config *c, struct caper_failure *f)
{
    int dev_fds[NNODES];
    if (do_mount(f, CAPER_STEP_MOUNT_PRIVATE, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return -1;
    if (hold_dev_nodes(dev_fds, f) < 0)
        return -1;
    for (uint32_t i = 0; i < c->n_mounts; i++) {
        const struct caper_mount *m = &c->mounts[i];
        struct caper_failure tried = { 0 };
        if (do_mount(&tried, CAPER_STEP_MOUNT_ROOT, m->source, m->target,
                     m->fstype, (unsigned long)m->flags, m->data) < 0) {
            if (!m->or_else && gone_since_plan(m, tried.err))
                continue;           /* with a fallback, that stands in (or is gone too) */
            if (!m->or_else) {
                *f = tried;
                return -1;
            }
            continue;               /* the fallback follows */
        }
        i += m->or_else;            /* done: skip the fallback */
    }
    const char *root = c->new_root ? c->new_root : "";
    if (setup_proc(root, f) < 0 || setup_dev(root, dev_fds, c->shm_size, f) < 0 ||
        setup_sys(root, f) < 0)
        return -1;
    if (c->new_root && enter_root(c->new_root, f) < 0)
        return -1;
    return 0;
}
