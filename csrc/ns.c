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
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
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
#include <sys/uio.h>
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

/* The capabilities a command keeps: what builds, tests and package installs
 * use (ownership and modes of their own files, setuid tools like su inside
 * the sandbox, ping's raw socket, low ports in the sandbox's own network,
 * setcap of an installed binary). Everything else is dropped, including
 * capabilities this file has never heard of: CAP_SYS_NICE (SCHED_FIFO,
 * priorities of the tracer's CPU), CAP_LEASE (leases on files shared with
 * the host), CAP_IPC_OWNER, CAP_NET_BROADCAST, CAP_SYS_CHROOT (a path would
 * mean one thing to the tracer, another to the kernel), and every one that
 * reaches the host outright (SYS_ADMIN, SYS_MODULE, SYS_PTRACE, MKNOD, ...). */
static const int kept_caps[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID, CAP_SETUID,
    CAP_NET_BIND_SERVICE, CAP_NET_RAW, CAP_SETFCAP,
};

static int cap_kept(int c)
{
    for (size_t i = 0; i < sizeof kept_caps / sizeof kept_caps[0]; i++)
        if (kept_caps[i] == c)
            return 1;
    return 0;
}

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
    /* PR_CAPBSET_DROP answers EINVAL past the kernel's last capability.
     * CAP_SETPCAP goes last: dropping the others needs it. */
    for (int c = 0; c < 64; c++) {
        if (c == CAP_SETPCAP || cap_kept(c))
            continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
            if (errno == EINVAL)
                break;
            fail_set(f, CAPER_STEP_CAPS, errno, "prctl(PR_CAPBSET_DROP, %d)", c);
            return -1;
        }
    }
    if (prctl(PR_CAPBSET_DROP, CAP_SETPCAP, 0, 0, 0) < 0 && errno != EINVAL) {
        fail_set(f, CAPER_STEP_CAPS, errno, "prctl(PR_CAPBSET_DROP, CAP_SETPCAP)");
        return -1;
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) < 0) {
        fail_set(f, CAPER_STEP_CAPS, errno, "capget(self)");
        return -1;
    }
    uint32_t keep[2] = { 0, 0 };
    for (size_t i = 0; i < sizeof kept_caps / sizeof kept_caps[0]; i++)
        keep[kept_caps[i] / 32] |= 1u << (kept_caps[i] % 32);
    for (int w = 0; w < 2; w++) {
        data[w].effective &= keep[w];
        data[w].permitted &= keep[w];
        data[w].inheritable &= keep[w];
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

/* ip addr add ADDR/32 dev lo, in the sandbox's network: the address of a
 * name server outside 127/8 that the sandbox's /etc/resolv.conf names, so
 * caper's DNS answers there without the sandbox's view changing. */
static int lo_address(uint32_t addr, struct caper_failure *f)
{
    struct {
        struct nlmsghdr n;
        struct ifaddrmsg a;
        struct rtattr local;
        uint32_t local_addr;
        struct rtattr address;
        uint32_t address_addr;
    } req;
    memset(&req, 0, sizeof req);
    req.n.nlmsg_len = sizeof req;
    req.n.nlmsg_type = RTM_NEWADDR;
    req.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    req.a.ifa_family = AF_INET;
    req.a.ifa_prefixlen = 32;
    req.a.ifa_scope = RT_SCOPE_HOST;
    req.a.ifa_index = if_nametoindex("lo");
    req.local.rta_type = IFA_LOCAL;
    req.local.rta_len = RTA_LENGTH(sizeof(uint32_t));
    req.local_addr = htonl(addr);
    req.address.rta_type = IFA_ADDRESS;
    req.address.rta_len = RTA_LENGTH(sizeof(uint32_t));
    req.address_addr = htonl(addr);
    struct { struct nlmsghdr n; struct nlmsgerr e; } ack;
    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    int err = s < 0 || send(s, &req, sizeof req, 0) != (ssize_t)sizeof req ? errno
              : recv(s, &ack, sizeof ack, 0) < (ssize_t)sizeof ack ? errno
              : ack.n.nlmsg_type != NLMSG_ERROR ? EPROTO : -ack.e.error;
    if (s >= 0)
        close(s);
    if (err) {
        fail_set(f, CAPER_STEP_PROXY, err, "netlink(RTM_NEWADDR, %u.%u.%u.%u/32 dev lo)",
                 addr >> 24, (addr >> 16) & 255, (addr >> 8) & 255, addr & 255);
        return -1;
    }
    return 0;
}

/* The way out, when there is one: caper's proxy listens on the sandbox's own
 * network, so it works without privileges. Its sockets (the proxy's listener,
 * its DNS, the transparent route's listeners) and the netns's /proc/net/tcp
 * and udp (which name the inode behind a peer's port) are made here, in the
 * sandbox's network, and handed to caper, which serves them from the host
 * side; init keeps no copy, so the command cannot accept on them. */
static int proxy_listen(const struct caper_config *c, struct caper_failure *f)
{
    int fds[CAPER_MAX_ENDPOINTS + 2];
    uint32_t n = 0;
    int ok = c->n_endpoints <= CAPER_MAX_ENDPOINTS;
    if (!ok)
        fail_set(f, CAPER_STEP_PROXY, E2BIG, "%u endpoints", c->n_endpoints);
    for (uint32_t i = 0; ok && i < c->n_endpoints; i++) {
        const struct caper_endpoint *e = &c->endpoints[i];
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)e->port),
                                 .sin_addr.s_addr = htonl(e->addr) };
        if (e->on_lo && lo_address(e->addr, f) < 0) {
            ok = 0;
            break;
        }
        int s = socket(AF_INET, (e->datagram ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
        if (s >= 0)
            fds[n++] = s;
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 ||
            (!e->datagram && listen(s, 128) < 0)) {
            fail_set(f, CAPER_STEP_PROXY, errno, "bind(%u.%u.%u.%u:%u, %s)", e->addr >> 24,
                     (e->addr >> 16) & 255, (e->addr >> 8) & 255, e->addr & 255, e->port,
                     e->datagram ? "udp" : "tcp, listen");
            ok = 0;
        }
    }
    for (const char *const *net = (const char *const[]){ "/proc/self/net/tcp",
                                                         "/proc/self/net/udp", NULL };
         ok && *net; net++) {
        int fd = open(*net, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fail_set(f, CAPER_STEP_PROXY, errno, "open(%s)", *net);
            ok = 0;
        } else {
            fds[n++] = fd;
        }
    }
    if (ok) {
        char byte = 'L', control[CMSG_SPACE(sizeof fds)];
        struct iovec iov = { &byte, 1 };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                            .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
        memset(control, 0, sizeof control);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
        if (sendmsg(c->proxy_fd, &m, MSG_NOSIGNAL) != 1) {
            fail_set(f, CAPER_STEP_PROXY, errno, "sendmsg(proxy sockets to caper)");
            ok = 0;
        }
    }
    for (uint32_t i = 0; i < n; i++)
        close(fds[i]);
    close(c->proxy_fd);
    return ok ? 0 : -1;
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
    /* Without CAP_SYS_NICE these still allow real-time scheduling and a
     * raised priority up to their value: none. */
    struct rlimit zero = { 0, 0 };
    if (setrlimit(RLIMIT_RTPRIO, &zero) < 0 || setrlimit(RLIMIT_NICE, &zero) < 0) {
        fail_set(&f, CAPER_STEP_RLIMIT, errno, "setrlimit(RLIMIT_RTPRIO/RLIMIT_NICE, 0)");
        die_inside(status_fd, &f, 127);
    }
    /* No core dump, not even to a pipe: with a core_pattern of "|helper"
     * (systemd-coredump, apport) the kernel runs the helper on the host, as
     * root, for any crash, and a soft limit of 0 only reaches the helper as
     * an argument; 1 is the value for which the kernel skips pipes too
     * (core(5)). Last of the limits and just before drop_caps: it overrides
     * whatever was set before (the caller's limits, carried in), and without
     * CAP_SYS_RESOURCE nothing after can raise it. A hard limit of 0 that
     * this user may not raise (rootless) stays 0: no file dump either. */
    struct rlimit one = { 1, 1 };
    if (setrlimit(RLIMIT_CORE, &one) < 0 && setrlimit(RLIMIT_CORE, &zero) < 0) {
        fail_set(&f, CAPER_STEP_RLIMIT, errno, "setrlimit(RLIMIT_CORE, 1)");
        die_inside(status_fd, &f, 127);
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

/* Close every descriptor from 3 up but those in keep (any order; -1: none). */
static int close_all_but(const int *keep, int n)
{
    unsigned lo = 3;
    for (;;) {
        unsigned next = ~0u;  /* the lowest kept fd at or above lo */
        for (int i = 0; i < n; i++)
            if (keep[i] >= 0 && (unsigned)keep[i] >= lo && (unsigned)keep[i] < next)
                next = (unsigned)keep[i];
        if (next > lo && syscall(SYS_close_range, lo, next == ~0u ? ~0u : next - 1, 0) < 0)
            return -1;
        if (next == ~0u)
            return 0;
        lo = next + 1;
    }
}

static _Noreturn void run_init(const struct caper_config *c, int sync_fd, int status_fd,
                               int out_fd, int err_fd)
{
    struct caper_failure f = { 0 };
    char go;
    /* Init is a fork of a threaded caller (the gate serves many runs): it
     * holds every descriptor the caller had open at the clone, other runs'
     * workspace and scratch flocks among them, and would keep those
     * workspaces locked for as long as this sandbox lives. */
    const int keep[] = { sync_fd, status_fd, out_fd, err_fd, c->stdin_fd, c->proxy_fd };
    if (close_all_but(keep, sizeof keep / sizeof keep[0]) < 0) {
        fail_set(&f, CAPER_STEP_CLONE, errno, "close_range(inherited fds)");
        die_inside(status_fd, &f, 126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Two bytes from the tracer. The first: our ids are mapped (the mounts
     * below need them). The second: we are in the sandbox's cgroups and
     * seized, which must hold before the command starts. Joining a v1
     * cgroup waits for an RCU grace period (4-15 ms measured on a 2-CPU VM:
     * bench/README.md), so our own setup runs meanwhile; a setup failure is
     * said only after the second byte, once the tracer watches for it.
     * EOF: the tracer died before seizing us. */
    if (read(sync_fd, &go, 1) != 1)
        _exit(127);
    setsid();  /* no controlling terminal: /dev/tty and TIOCSTI reach nothing */
    const char *host = c->hostname ? c->hostname : "caper";
    int set_up = mount_setup(c, &f) == 0;
    if (set_up && sethostname(host, strlen(host)) < 0) { /* cosmetic */ }
    set_up = set_up && loopback_up(&f) == 0 && (c->proxy_fd < 0 || proxy_listen(c, &f) == 0);
    if (read(sync_fd, &go, 1) != 1)
        _exit(127);
    close(sync_fd);
    if (!set_up)
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

/* The tracer names paths by reading /proc/<pid>/cwd and fd links, which the
 * kernel gives from the root of the tracee's mount namespace. In a chroot,
 * caper's / is only a directory of that tree: every path would carry the
 * chroot's location (a policy would then misjudge "/chroot/work/.env").
 * pid is the init, in its new mount namespace, before any of its mounts. */
static int check_root_view(pid_t pid, struct caper_failure *f)
{
    char root[CAPER_PATH_MAX];
    if (proc_link(pid, "root", root, sizeof root) < 0) {
        fail_set(f, CAPER_STEP_ROOT_VIEW, errno, "readlink(/proc/%d/root)", (int)pid);
        return -1;
    }
    if (strcmp(root, "/") != 0) {
        fail_set(f, CAPER_STEP_ROOT_VIEW, 0, "readlink(/proc/%d/root) is %s, not /", (int)pid,
                 root);
        return -1;
    }
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
                 errno == EPERM ? " (hint: not root, and no user namespace: none are allowed "
                 "to an unprivileged user in a chroot, or where the host turned them off)" : "");
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
    if (ok && check_root_view(pid, f) < 0)
        ok = 0;
    /* init sets its mounts up while we join it to its cgroups (run_init) */
    if (ok && write(sync[1], "i", 1) != 1) {
        fail_set(f, CAPER_STEP_PIPE, errno, "write(sync pipe)");
        ok = 0;
    }
    for (const char *const *procs = c->cgroup_procs; ok && procs && *procs; procs++) {
        char text[32];
        snprintf(text, sizeof text, "%d", pid);
        int fd = open(*procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, text, strlen(text)) < 0) {
            fail_set(f, CAPER_STEP_CGROUP, errno, "write(%s, %d)", *procs, pid);
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
