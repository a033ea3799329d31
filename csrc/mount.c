/* mount.c: the sandbox's own view of the filesystem, set up by its init.
 *
 * Order: (1) make every mount private, so nothing propagates to the host;
 * (2) the caller's mounts (the snapshot layers); (3) a fresh /proc for the
 * new pid namespace, with its kernel knobs read-only; (4) a minimal /dev of
 * bind-mounted harmless nodes; (5) a fresh read-only /sys for the new net
 * namespace. Runs in a fork()ed child of a threaded process: no malloc.
 */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MNT_SAFE (MS_NOSUID | MS_NODEV | MS_NOEXEC)

static int do_mount(struct caper_failure *f, uint32_t step, const char *src, const char *dst,
                    const char *type, unsigned long flags, const char *data)
{
    if (mount(src, dst, type, flags, data) == 0)
        return 0;
    int e = errno;
    fail_set(f, step, e, "mount(%s, %s, %s, 0x%lx)%s", src ? src : "none", dst,
             type ? type : "none", flags,
             e == EPERM ? " (hint: needs root or a user namespace)" : "");
    return -1;
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

static int setup_proc(struct caper_failure *f)
{
    if (do_mount(f, CAPER_STEP_MOUNT_PROC, "proc", "/proc", "proc", MNT_SAFE, NULL) < 0)
        return -1;
    static const char *const knobs[] = {
        "/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/acpi",
    };
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        if (make_readonly(f, CAPER_STEP_MOUNT_PROC, knobs[i]) < 0)
            return -1;
    return 0;
}

/* The host's nodes are reached through O_PATH descriptors opened before the
 * tmpfs covers /dev, then bind-mounted by their /proc/self/fd names. */
static int setup_dev(struct caper_failure *f)
{
    static const char *const nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
    enum { NNODES = sizeof nodes / sizeof nodes[0] };
    int fds[NNODES];
    char src[64], dst[64];
    for (int i = 0; i < NNODES; i++) {
        snprintf(dst, sizeof dst, "/dev/%s", nodes[i]);
        fds[i] = open(dst, O_PATH | O_CLOEXEC);
        if (fds[i] < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "open(%s, O_PATH)", dst);
            return -1;
        }
    }
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC,
                 "mode=755,size=64k") < 0)
        return -1;
    for (int i = 0; i < NNODES; i++) {
        snprintf(dst, sizeof dst, "/dev/%s", nodes[i]);
        int t = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (t < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "open(%s, O_CREAT)", dst);
            return -1;
        }
        close(t);
        snprintf(src, sizeof src, "/proc/self/fd/%d", fds[i]);
        if (do_mount(f, CAPER_STEP_MOUNT_DEV, src, dst, NULL, MS_BIND, NULL) < 0)
            return -1;
        close(fds[i]);
    }
    if (mkdir("/dev/pts", 0755) < 0 || mkdir("/dev/shm", 01777) < 0) {
        fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "mkdir(/dev/pts, /dev/shm)");
        return -1;
    }
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                 "newinstance,ptmxmode=0666,mode=0620") < 0)
        return -1;
    if (do_mount(f, CAPER_STEP_MOUNT_DEV, "tmpfs", "/dev/shm", "tmpfs", MNT_SAFE,
                 "mode=1777") < 0)
        return -1;
    static const char *const links[][2] = {
        { "pts/ptmx", "/dev/ptmx" }, { "/proc/self/fd", "/dev/fd" },
        { "/proc/self/fd/0", "/dev/stdin" }, { "/proc/self/fd/1", "/dev/stdout" },
        { "/proc/self/fd/2", "/dev/stderr" },
    };
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
        if (symlink(links[i][0], links[i][1]) < 0) {
            fail_set(f, CAPER_STEP_MOUNT_DEV, errno, "symlink(%s, %s)", links[i][0], links[i][1]);
            return -1;
        }
    /* No new nodes, no writes: the minimal /dev is fixed from here on. */
    return do_mount(f, CAPER_STEP_MOUNT_DEV, NULL, "/dev", NULL,
                    MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "mode=755,size=64k");
}

static int setup_sys(struct caper_failure *f)
{
    /* A fresh sysfs shows only the new net namespace's devices and has no
     * cgroup or other mounts below it. */
    if (mount("sysfs", "/sys", "sysfs", MS_RDONLY | MNT_SAFE, NULL) == 0)
        return 0;
    return make_readonly(f, CAPER_STEP_MOUNT_SYS, "/sys");
}

int mount_setup(const struct caper_config *c, struct caper_failure *f)
{
    if (do_mount(f, CAPER_STEP_MOUNT_PRIVATE, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return -1;
    for (uint32_t i = 0; i < c->n_mounts; i++) {
        const struct caper_mount *m = &c->mounts[i];
        if (do_mount(f, CAPER_STEP_MOUNT_ROOT, m->source, m->target, m->fstype,
                     (unsigned long)m->flags, m->data) < 0)
            return -1;
    }
    if (setup_proc(f) < 0 || setup_dev(f) < 0 || setup_sys(f) < 0)
        return -1;
    return 0;
}
