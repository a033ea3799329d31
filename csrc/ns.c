/* ns.c: start the sandbox.
 *
 * Process layout:  tracer thread (in the caller)
 *                    └─ init: pid 1 of new pid/mount/net/ipc/uts(/user) namespaces,
 *                       │     traced with the fork options but not filtered
 *                       └─ command: caps dropped, no_new_privs, seccomp, exec
 *
 * The tracer seizes init before init forks, so the command is traced from
 * its first instruction and its seccomp filter never runs without a tracer
 * (SECCOMP_RET_TRACE with no tracer fails the call with ENOSYS). When the
 * command exits, init exits, and the kernel kills everything left in the pid
 * namespace, daemons included. PTRACE_O_EXITKILL and PR_SET_PDEATHSIG kill
 * the sandbox when caper dies.
 */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char **environ;

#define TRACE_OPTIONS (PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | \
                       PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXEC | PTRACE_O_TRACESECCOMP | \
                       PTRACE_O_EXITKILL)

/* Capabilities that reach past the namespaces to the host. */
static const int dropped_caps[] = {
    CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_PTRACE, CAP_SYS_RAWIO, CAP_MKNOD,
    CAP_DAC_READ_SEARCH, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_BPF, CAP_PERFMON, CAP_SYSLOG,
    CAP_SYS_RESOURCE, CAP_MAC_ADMIN, CAP_MAC_OVERRIDE, CAP_SYS_PACCT, CAP_SYS_TTY_CONFIG,
    CAP_WAKE_ALARM, CAP_BLOCK_SUSPEND, CAP_AUDIT_CONTROL, CAP_AUDIT_WRITE, CAP_AUDIT_READ,
    CAP_LINUX_IMMUTABLE, CAP_IPC_LOCK, CAP_NET_ADMIN, CAP_CHECKPOINT_RESTORE,
    /* chroot would let a path mean one thing to the tracer, another to the kernel */
    CAP_SYS_CHROOT,
    CAP_SETPCAP, /* last: dropping the others needs it */
};

/* Send a failure from inside the sandbox to the tracer, then die. */
static _Noreturn void die_inside(int status_fd, const struct caper_failure *f, int code)
{
    struct status_msg m = { f->step, f->err, { 0 } };
    snprintf(m.detail, sizeof m.detail, "%.199s", f->detail);
    if (write(status_fd, &m, sizeof m) < 0) { /* the tracer sees the exit code */ }
    _exit(code);
}

static int drop_caps(struct caper_failure *f)
{
    for (size_t i = 0; i < sizeof dropped_caps / sizeof dropped_caps[0]; i++)
        if (prctl(PR_CAPBSET_DROP, dropped_caps[i], 0, 0, 0) < 0 && errno != EINVAL) {
            fail_set(f, CAPER_STEP_CAPS, errno, "prctl(PR_CAPBSET_DROP, %d)", dropped_caps[i]);
            return -1;
        }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) < 0) {
        fail_set(f, CAPER_STEP_CAPS, errno, "capget(self)");
        return -1;
    }
    for (size_t i = 0; i < sizeof dropped_caps / sizeof dropped_caps[0]; i++) {
        int c = dropped_caps[i];
        uint32_t bit = 1u << (c % 32);
        data[c / 32].effective &= ~bit;
        data[c / 32].permitted &= ~bit;
        data[c / 32].inheritable &= ~bit;
    }
    if (syscall(SYS_capset, &hdr, data) < 0) {
        fail_set(f, CAPER_STEP_CAPS, errno, "capset(self)");
        return -1;
    }
    return 0;
}

static int loopback_up(struct caper_failure *f)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        fail_set(f, CAPER_STEP_LOOPBACK, errno, "ioctl(SIOCGIFFLAGS, lo)");
        return -1;
    }
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) {
        fail_set(f, CAPER_STEP_LOOPBACK, errno, "ioctl(SIOCSIFFLAGS, lo, UP)");
        return -1;
    }
    close(s);
    return 0;
}

/* The caller's umask, nice value, limits and groups (caper_caller). Raw
 * syscalls for the ids: this is a vfork child, and glibc's setgroups would
 * signal the threads of the process whose memory it shares. */
static int apply_caller(const struct caper_caller *k, struct caper_failure *f)
{
    umask(k->umask & 07777);
    for (uint32_t i = 0; i < k->n_rlimits; i++) {
        struct rlimit rl = { k->rlimits[i].cur, k->rlimits[i].max };
        if (setrlimit(k->rlimits[i].resource, &rl) < 0) {
            fail_set(f, CAPER_STEP_CALLER, errno, "setrlimit(%u, %llu, %llu)",
                     k->rlimits[i].resource, (unsigned long long)rl.rlim_cur,
                     (unsigned long long)rl.rlim_max);
            return -1;
        }
    }
    errno = 0;
    int now = getpriority(PRIO_PROCESS, 0);
    if (!(now == -1 && errno) && now != k->nice && setpriority(PRIO_PROCESS, 0, k->nice) < 0) {
        fail_set(f, CAPER_STEP_CALLER, errno, "setpriority(%d)", k->nice);
        return -1;
    }
    if (k->set_groups) {
        if (syscall(SYS_setgroups, (size_t)k->n_groups, k->groups) < 0) {
            fail_set(f, CAPER_STEP_CALLER, errno, "setgroups(%u groups)", k->n_groups);
            return -1;
        }
        if (syscall(SYS_setresgid, k->gid, k->gid, k->gid) < 0) {
            fail_set(f, CAPER_STEP_CALLER, errno, "setresgid(%u)", k->gid);
            return -1;
        }
    }
    return 0;
}

static _Noreturn void run_command(const struct caper_config *c, int status_fd, int out_fd,
                                  int err_fd)
{
    struct caper_failure f = { 0 };
    /* The caller (Python) ignores SIGPIPE and may block signals: a command
     * must start with default dispositions, as from a shell. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    int in_fd = c->stdin_fd >= 0 ? c->stdin_fd : open("/dev/null", O_RDONLY);
    if (in_fd < 0 || dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
        fail_set(&f, CAPER_STEP_OUTPUT, errno, "dup2(stdio)");
        die_inside(status_fd, &f, 127);
    }
    /* Nothing of caper's may leak into the command (it would shift fd numbers). */
    syscall(SYS_close_range, 3, ~0u, CLOSE_RANGE_CLOEXEC);
    if (c->cwd && chdir(c->cwd) < 0) {
        fail_set(&f, CAPER_STEP_CHDIR, errno, "chdir(%s)", c->cwd);
        die_inside(status_fd, &f, 127);
    }
    if (c->caller && apply_caller(c->caller, &f) < 0)
        die_inside(status_fd, &f, 127);
    if (c->max_memory) {
        struct rlimit rl = { c->max_memory, c->max_memory };
        if (setrlimit(RLIMIT_AS, &rl) < 0) {
            fail_set(&f, CAPER_STEP_RLIMIT, errno, "setrlimit(RLIMIT_AS, %llu)",
                     (unsigned long long)c->max_memory);
            die_inside(status_fd, &f, 127);
        }
    }
    if (drop_caps(&f) < 0)
        die_inside(status_fd, &f, 127);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        fail_set(&f, CAPER_STEP_NO_NEW_PRIVS, errno, "prctl(PR_SET_NO_NEW_PRIVS)");
        die_inside(status_fd, &f, 127);
    }
    /* Last before exec, so the filter sees nothing of caper's own setup. */
    if (seccomp_install(&f) < 0)
        die_inside(status_fd, &f, 127);
    environ = (char **)c->envp;
    execvp(c->argv[0], (char *const *)c->argv);
    fail_set(&f, CAPER_STEP_EXEC, errno, "execvp(%s)", c->argv[0]);
    die_inside(status_fd, &f, 127);
}

static _Noreturn void run_init(const struct caper_config *c, int sync_fd, int status_fd,
                               int out_fd, int err_fd)
{
    struct caper_failure f = { 0 };
    char go;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* EOF: the tracer died before seizing us. */
    if (read(sync_fd, &go, 1) != 1)
        _exit(127);
    close(sync_fd);
    setsid();  /* no controlling terminal: /dev/tty and TIOCSTI reach nothing */
    if (mount_setup(c, &f) < 0)
        die_inside(status_fd, &f, 126);
    const char *host = c->hostname ? c->hostname : "caper";
    if (sethostname(host, strlen(host)) < 0) { /* cosmetic */ }
    if (loopback_up(&f) < 0)
        die_inside(status_fd, &f, 126);
    /* The snapshot's conflict threshold: a host change stamped below it must
     * have happened before the command could look. Waiting here overlaps the
     * coarse clock's lag (~5 ms) with the setup above. */
    while (c->not_before_ns) {
        struct timespec now, nap = { 0, 200000 };
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if ((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec >= c->not_before_ns)
            break;
        nanosleep(&nap, NULL);
    }
    /* vfork: the command shares init's memory until it execs, so its start
     * does not copy the page tables of the (possibly large) caller again. */
    pid_t cmd = vfork();
    if (cmd < 0) {
        fail_set(&f, CAPER_STEP_CLONE, errno, "fork(command)");
        die_inside(status_fd, &f, 126);
    }
    if (cmd == 0)
        run_command(c, status_fd, out_fd, err_fd);
    close(out_fd);
    close(err_fd);
    close(status_fd);
    /* Reap orphans until the command itself is gone; then the namespace goes. */
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, __WALL);
        if (p == cmd || (p < 0 && errno == ECHILD))
            _exit(0);
    }
}

static int write_file(const char *path, const char *text, struct caper_failure *f)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        fail_set(f, CAPER_STEP_USERNS_MAP, errno, "write(%s, \"%s\")%s", path, text,
                 errno == EPERM ? " (hint: unprivileged user namespaces disabled?)" : "");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

static int map_ids(pid_t pid, struct caper_failure *f)
{
    char path[64], text[64];
    uid_t uid = geteuid();
    gid_t gid = getegid();
    snprintf(path, sizeof path, "/proc/%d/setgroups", pid);
    if (uid != 0 && write_file(path, "deny", f) < 0)
        return -1;
    /* Root keeps every id; anyone else maps just themselves. */
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    if (uid == 0)
        snprintf(text, sizeof text, "0 0 4294967295");
    else
        snprintf(text, sizeof text, "%u %u 1", uid, uid);
    if (write_file(path, text, f) < 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    if (uid == 0)
        snprintf(text, sizeof text, "0 0 4294967295");
    else
        snprintf(text, sizeof text, "%u %u 1", gid, gid);
    return write_file(path, text, f);
}

int spawn_sandbox(const struct caper_config *c, struct spawn *s, struct caper_failure *f)
{
    int sync[2], status[2], out[2], err[2];
    if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 ||
        pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
        fail_set(f, CAPER_STEP_PIPE, errno, "pipe2(sandbox)");
        return -1;
    }
    unsigned long flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                          CLONE_NEWUTS | SIGCHLD;
    if (c->flags & CAPER_F_USERNS)
        flags |= CLONE_NEWUSER;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, 0, 0, 0, 0);
    if (pid < 0) {
        fail_set(f, CAPER_STEP_CLONE, errno, "clone(0x%lx)%s", flags,
                 errno == EPERM ? " (hint: not root and no user namespace?)" : "");
        return -1;
    }
    if (pid == 0) {
        close(sync[1]);
        close(status[0]);
        close(out[0]);
        close(err[0]);
        run_init(c, sync[0], status[1], out[1], err[1]);
    }
    close(sync[0]);
    close(status[1]);
    close(out[1]);
    close(err[1]);
    s->init_pid = pid;
    s->status_fd = status[0];
    s->out_fd = out[0];
    s->err_fd = err[0];
    int ok = 1;
    if ((c->flags & CAPER_F_USERNS) && map_ids(pid, f) < 0)
        ok = 0;
    if (ok && c->cgroup_procs) {
        char text[32];
        snprintf(text, sizeof text, "%d", pid);
        int fd = open(c->cgroup_procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, text, strlen(text)) < 0) {
            fail_set(f, CAPER_STEP_CGROUP, errno, "write(%s, %d)", c->cgroup_procs, pid);
            ok = 0;
        }
        if (fd >= 0)
            close(fd);
    }
    if (ok && ptrace(PTRACE_SEIZE, pid, 0, TRACE_OPTIONS) < 0) {
        fail_set(f, CAPER_STEP_SEIZE, errno, "ptrace(PTRACE_SEIZE, %d)", pid);
        ok = 0;
    }
    if (!ok) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, __WALL);
        close(sync[1]);
        close(status[0]);
        close(out[0]);
        close(err[0]);
        return -1;
    }
    if (write(sync[1], "g", 1) != 1) {
        fail_set(f, CAPER_STEP_PIPE, errno, "write(sync pipe)");
        kill(pid, SIGKILL);
    }
    close(sync[1]);
    return 0;
}
