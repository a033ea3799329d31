/* trace.c: the ptrace loop. Every stop is one of: a seccomp stop (a listed
 * syscall is entering: decode it, then let it run to its exit stop or refuse
 * it), a syscall-exit stop (fill in the result and emit), a fork/clone/exec
 * event, a group-stop, a signal to pass on, or a death. */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/openat2.h>
#include <linux/ptrace.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

/* sys/ptrace.h and linux/ptrace.h clash; take what we need by hand. */
long ptrace(int request, ...);
#define PT_CONT 7
#define PT_GETREGS 12
#define PT_SETREGS 13
#define PT_SYSCALL 24
#define PT_GETEVENTMSG 0x4201
#define PT_LISTEN 0x4208

#define X32_SYSCALL_BIT 0x40000000u
#define REPEAT_SLOTS 256
#define BUCKETS 1024
#define ERESTART_FIRST 512   /* -ERESTARTSYS .. -ERESTART_RESTARTBLOCK: retried, not done */
#define ERESTART_LAST 516

struct repeat {
    uint64_t hash, seq;
    uint32_t count;
};

/* The event a process is in the middle of, kept until its exit stop. */
struct pending {
    struct ev ev;
    char s[3][CAPER_PATH_MAX + 1];
    int unix_bind;   /* a bind of a unix path: remember it if it succeeds */
    int64_t bind_sec; /* CLOCK_REALTIME_COARSE seconds when that bind entered */
    int dirfd[2];    /* the path arguments as the process wrote them, and their dirfds */
    char raw[2][CAPER_PATH_MAX + 1];
    char unix_raw[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];  /* as the process wrote it */
    /* connect and the sends: the socket file pinned at the stop (-1: none;
     * sock_errno: why), its domain and type, and the destination as copied
     * (dest_bad: unreadable; quiet: no destination, nothing to report). */
    int sock, sock_errno, sock_domain, sock_type;
    struct sock_dest dest;
    uint8_t dest_bad, quiet;
    uint8_t noise;   /* an open judged noise at its stop: confirmed at its exit, or reported */
    /* exec: the program checked (src_known 0: none; src_script: it starts
     * with "#!"). */
    uint8_t src_known, src_script;
    uint64_t resolve; /* openat2: its RESOLVE_* flags as read at the stop */
    /* stop_at: what an open's name led to at its stop, asked there and let
     * through (checked[0] == 0: nothing, or not asked) */
    char checked[CAPER_PATH_MAX];
    dev_t src_dev;
    ino_t src_ino;
};

/* Hashes of the code-loading entries of the environment a process's image
 * was given (exec_env); h NULL when it is not known (unreadable, or no
 * memory): every exec from it then counts as given new ones. */
struct env_set {
    uint64_t *h;
    size_t n;
};

struct proc {
    struct proc *next;
    pid_t tid, ppid;
    uint8_t attached, announced, held, is_init, is_command, in_call;
    uint8_t shares_files;  /* its descriptor table is another task's too (CLONE_FILES) */
    uint8_t frozen;        /* it stopped the run in a call: never resumed, it dies there */
    uint64_t falloc;     /* bytes granted to the fallocate() it is in, until its exit */
    char *cwd;
    struct pending *pend;
    struct repeat *rep;
    uint32_t n_rep;
    uint64_t noise;
    struct env_set env;  /* its image's code-loading variables, as exec gave them */
};

struct tracer {
    const struct caper_config *c;
    struct emitter *e;
    struct caper_result *r;
    struct proc *buckets[BUCKETS];
    uint32_t live;
    pid_t init_pid;
    int killed;          /* the sandbox was killed on purpose: end says why */
    int noise_off;       /* a directory on the way to noise was changed: trace every open */
    struct bound_socks bound;  /* unix sockets bound inside the sandbox */
    struct pending *scratch; /* sendmmsg's other destinations, decoded one by one */
    uint64_t falloc_inflight; /* granted to fallocate() calls not returned yet */
    int pinned;              /* the sandbox runs on the CPUs of pin (CAPER_F_SHARE_CPU) */
    cpu_set_t pin;
    uint32_t user_objects;   /* inotify and fanotify instances made (DEC_USER_OBJECT) */
};

/* The run's share of its user's inotify instances and fanotify groups (128
 * each by default, for every process of that user on the host). */
#define USER_OBJECTS_MAX 32

/* ---- process table -------------------------------------------------------- */

static struct proc *find(struct tracer *t, pid_t tid)
{
    for (struct proc *p = t->buckets[tid % BUCKETS]; p; p = p->next)
        if (p->tid == tid)
            return p;
    return NULL;
}

static struct proc *create(struct tracer *t, pid_t tid)
{
    struct proc *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->tid = tid;
    p->next = t->buckets[tid % BUCKETS];
    t->buckets[tid % BUCKETS] = p;
    t->live++;
    if (t->live > t->r->peak_pids)
        t->r->peak_pids = t->live;
    return p;
}

static void destroy(struct tracer *t, struct proc *p)
{
    struct proc **pp = &t->buckets[p->tid % BUCKETS];
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    t->falloc_inflight -= p->falloc;
    free(p->cwd);
    free(p->pend);
    free(p->rep);
    free(p->env.h);
    free(p);
    t->live--;
}

static void kill_sandbox(struct tracer *t, uint32_t end)
{
    if (!t->killed) {
        t->killed = 1;
        t->r->end = end;
    }
    kill(t->init_pid, SIGKILL);
}

static void resume(struct proc *p, int sig)
{
    if (p->frozen)
        return;
    ptrace(p->in_call || p->falloc ? PT_SYSCALL : PT_CONT, p->tid, 0, sig);
}

/* ---- paths ------------------------------------------------------------------ */

static const char *cwd_of(struct proc *p)
{
    if (!p->cwd) {
        char buf[CAPER_PATH_MAX];
        if (proc_link(p->tid, "cwd", buf, sizeof buf) >= 0)
            p->cwd = strdup(buf);
    }
    return p->cwd;
}

static void forget_cwds(struct tracer *t)
{
    for (int i = 0; i < BUCKETS; i++)
        for (struct proc *p = t->buckets[i]; p; p = p->next) {
            free(p->cwd);
            p->cwd = NULL;
        }
}

/* The absolute path the process means by (dirfd, rel). */
static size_t resolve(struct proc *p, int dirfd, const char *rel, char *out, uint32_t *info)
{
    char base[CAPER_PATH_MAX];
    const char *b = NULL;
    if (rel[0] != '/') {
        if (dirfd == AT_FDCWD) {
            b = cwd_of(p);
        } else {
            char what[32];
            snprintf(what, sizeof what, "fd/%d", dirfd);
            if (proc_link(p->tid, what, base, sizeof base) >= 0)
                b = base;
        }
        if (!b) {
            *info |= CAPER_INFO_UNREADABLE;
            size_t n = strlen(rel);
            memcpy(out, rel, n + 1);
            return n;
        }
        if (rel[0] == '\0')
            rel = ".";  /* AT_EMPTY_PATH: the object is the fd itself */
    }
    return path_join_normalize(b, rel, out, CAPER_PATH_MAX);
}

/* Read and resolve a path argument into slot i of the pending event. */
static void take_path(struct proc *p, struct pending *pd, int i, int dirfd, uint64_t addr)
{
    char raw[CAPER_PATH_MAX + 1];
    int trunc = 0;
    if (tracee_read_str(p->tid, addr, raw, sizeof raw, &trunc) < 0) {
        pd->ev.h.info |= CAPER_INFO_UNREADABLE;
        return;
    }
    if (trunc)
        pd->ev.h.info |= CAPER_INFO_TRUNCATED;
    memcpy(pd->raw[i], raw, sizeof raw);
    pd->dirfd[i] = dirfd;
    pd->ev.n[i] = resolve(p, dirfd, raw, pd->s[i], &pd->ev.h.info);
    pd->ev.s[i] = pd->s[i];
}

/* The program an exec names, as checked: its identity, and whether it is a
 * script (the kernel then runs its interpreter). */
static void take_program(struct proc *p, struct pending *pd)
{
    struct stat st;
    char head[2];
    int refused, fd = tracee_open(p->tid, pd->dirfd[0], pd->raw[0], 1, &refused);
    if (fd >= 0 && fstat(fd, &st) < 0) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0) {
        pd->src_known = 1;
        pd->src_dev = st.st_dev;
        pd->src_ino = st.st_ino;
        char at[64];
        snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
        /* Reopens the O_PATH descriptor itself; a regular file only (a FIFO's
         * open would wait), never waiting, and one with an execute bit: no
         * exec runs any other, and a read is not always harmless (the
         * tracer's read of /proc/kmsg, as root, drained the host's log). */
        int rd = S_ISREG(st.st_mode) && (st.st_mode & 0111)
                     ? open(at, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY) : -1;
        pd->src_script = rd >= 0 && pread(rd, head, 2, 0) == 2 && head[0] == '#' && head[1] == '!';
        if (rd >= 0)
            close(rd);
        close(fd);
    }
}

static void take_fd_path(struct proc *p, struct pending *pd, int i, int fd)
{
    char what[32];
    snprintf(what, sizeof what, "fd/%d", fd);
    ssize_t n = proc_link(p->tid, what, pd->s[i], CAPER_PATH_MAX);
    pd->ev.h.info |= CAPER_INFO_FD_PATH;
    if (n < 0) {
        pd->ev.h.info |= CAPER_INFO_UNREADABLE;
        return;
    }
    pd->ev.n[i] = (size_t)n;
    pd->ev.s[i] = pd->s[i];
}

static void take_raw_string(struct proc *p, struct pending *pd, int i, uint64_t addr)
{
    int trunc = 0;
    ssize_t n = tracee_read_str(p->tid, addr, pd->s[i], CAPER_PATH_MAX + 1, &trunc);
    if (n < 0) {
        pd->ev.h.info |= CAPER_INFO_UNREADABLE;
        return;
    }
    if (trunc)
        pd->ev.h.info |= CAPER_INFO_TRUNCATED;
    pd->ev.n[i] = (size_t)n;
    pd->ev.s[i] = pd->s[i];
}

/* argv as NUL-separated strings, at most argv_max bytes. */
static void take_argv(struct tracer *t, struct proc *p, struct pending *pd, uint64_t addr)
{
    size_t cap = t->c->argv_max ? t->c->argv_max : 1024;
    if (cap > CAPER_PATH_MAX)
        cap = CAPER_PATH_MAX;
    size_t used = 0;
    for (int i = 0; addr && used < cap; i++) {
        uint64_t sp;
        if (tracee_read(p->tid, addr + 8u * (uint64_t)i, &sp, sizeof sp) < 0) {
            pd->ev.h.info |= CAPER_INFO_UNREADABLE;
            break;
        }
        if (!sp)
            break;
        int trunc = 0;
        ssize_t n = tracee_read_str(p->tid, sp, pd->s[1] + used, cap - used, &trunc);
        if (n < 0) {
            pd->ev.h.info |= CAPER_INFO_UNREADABLE;
            break;
        }
        used += (size_t)n + 1;
        if (trunc || used >= cap) {
            pd->ev.h.info |= CAPER_INFO_TRUNCATED;
            break;
        }
    }
    if (used > cap)
        used = cap;
    pd->ev.n[1] = used;
    pd->ev.s[1] = pd->s[1];
}

/* ---- sockets ---------------------------------------------------------------- */

/* Decode a sockaddr into family (flags), text (slot 0) and port (arg0). */
static void take_sockaddr(struct proc *p, struct pending *pd, uint64_t addr, uint64_t len)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (len > sizeof ss)
        len = sizeof ss;
    if (!addr || len < sizeof(sa_family_t) || tracee_read(p->tid, addr, &ss, len) < 0) {
        pd->ev.h.info |= CAPER_INFO_UNREADABLE;
        pd->dest_bad = 1;
        return;
    }
    pd->dest.addr = ss;
    pd->dest.len = (socklen_t)len;
    char *out = pd->s[0];
    switch (ss.ss_family) {
    case AF_INET: {
        struct sockaddr_in *in = (void *)&ss;
        inet_ntop(AF_INET, &in->sin_addr, out, CAPER_PATH_MAX);
        pd->ev.h.flags = CAPER_AF_INET;
        pd->ev.h.arg0 = ntohs(in->sin_port);
        break;
    }
    case AF_INET6: {
        struct sockaddr_in6 *in6 = (void *)&ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, out, CAPER_PATH_MAX);
        pd->ev.h.flags = CAPER_AF_INET6;
        pd->ev.h.arg0 = ntohs(in6->sin6_port);
        break;
    }
    case AF_UNIX: {
        struct sockaddr_un *un = (void *)&ss;
        size_t n = len - offsetof(struct sockaddr_un, sun_path);
        if (n > sizeof un->sun_path)   /* the tracee's length: never past sun_path */
            n = sizeof un->sun_path;
        if (n > 0 && un->sun_path[0] == '\0') {
            pd->ev.h.flags = CAPER_AF_ABSTRACT;
            out[0] = '@';
            memcpy(out + 1, un->sun_path + 1, n - 1);
            pd->ev.n[0] = n;
            pd->ev.s[0] = out;
            return;
        }
        char *raw = pd->unix_raw;
        memcpy(raw, un->sun_path, n);
        raw[n] = '\0';
        pd->dest.raw = raw;
        pd->ev.h.flags = CAPER_AF_UNIX;
        pd->ev.n[0] = resolve(p, AT_FDCWD, raw, out, &pd->ev.h.info);
        pd->ev.s[0] = out;
        return;
    }
    case AF_NETLINK:
        pd->ev.h.flags = CAPER_AF_NETLINK;
        snprintf(out, CAPER_PATH_MAX, "netlink");
        break;
    default:
        pd->ev.h.flags = CAPER_AF_OTHER;
        snprintf(out, CAPER_PATH_MAX, "family %u", ss.ss_family);
    }
    pd->ev.n[0] = strlen(out);
    pd->ev.s[0] = out;
}

/* ---- stops ------------------------------------------------------------------ */

static void deny(pid_t tid, int err)
{
    struct user_regs_struct regs;
    if (ptrace(PT_GETREGS, tid, 0, &regs) < 0)
        return;
    regs.orig_rax = (uint64_t)-1;  /* skip the call ... */
    regs.rax = (uint64_t)(int64_t)-err;  /* ... and make it return -err */
    ptrace(PT_SETREGS, tid, 0, &regs);
}

static void emit_folded(struct tracer *t, struct proc *p, struct ev *ev)
{
    if (t->c->flags & CAPER_F_NO_COLLAPSE) {
        emit(t->e, ev);
        return;
    }
    uint64_t h = ev_hash(ev);
    if (!p->rep) {
        p->rep = calloc(REPEAT_SLOTS, sizeof *p->rep);
        if (!p->rep) {
            emit(t->e, ev);
            return;
        }
    }
    for (uint32_t i = 0; i < REPEAT_SLOTS; i++) {
        struct repeat *r = &p->rep[(h + i) % REPEAT_SLOTS];
        if (r->seq && r->hash == h) {
            r->count++;
            t->r->collapsed++;
            return;
        }
        if (!r->seq) {
            r->hash = h;
            r->seq = emit(t->e, ev);
            return;
        }
    }
    emit(t->e, ev);  /* table full: no more folding for this process */
}

static void init_ev(struct ev *ev, struct proc *p, uint32_t kind)
{
    memset(ev, 0, sizeof *ev);
    ev->h.kind = kind;
    ev->h.pid = (uint32_t)p->tid;
    ev->h.ppid = (uint32_t)p->ppid;
}

static int noise_match(const struct caper_config *c, const char *path, size_t n)
{
    for (uint32_t i = 0; i < c->n_noise; i++) {
        const char *q = c->noise[i].path;
        size_t m = strlen(q);
        if (c->noise[i].kind == CAPER_NOISE_EXACT) {
            if (m == n && memcmp(q, path, n) == 0)
                return 1;
        } else if (m < n && memcmp(q, path, m) == 0 && (path[m] == '/' || q[m - 1] == '/')) {
            return 1;
        }
    }
    return 0;
}

/* Whether dir is above a noise path, is a noise directory or below one: a
 * change there can put another file behind a noise name. */
static int on_noise_way(const struct caper_config *c, const char *dir)
{
    size_t n = strlen(dir);
    for (uint32_t i = 0; i < c->n_noise; i++) {
        const char *q = c->noise[i].path;
        size_t m = strlen(q);
        if (m >= n && memcmp(q, dir, n) == 0 && (q[n] == '/' || q[n] == '\0' || n == 1))
            return 1;
        if (c->noise[i].kind == CAPER_NOISE_PREFIX && n > m && memcmp(dir, q, m) == 0 &&
            dir[m] == '/')
            return 1;
    }
    return 0;
}

/* A read-only open is dropped as noise only if what it names is noise by
 * its text and by what it really is, every symlink resolved inside the
 * sandbox: a symlink planted under a noise name (ln -s ~/.ssh/id_rsa
 * /usr/lib/x86_64-linux-gnu/x.so) must not hide a credential read. */
static int is_noise(struct tracer *t, struct proc *p, struct pending *pd)
{
    if (t->noise_off || !noise_match(t->c, pd->s[0], pd->ev.n[0]))
        return 0;
    char real[CAPER_PATH_MAX];
    int follow = !(pd->ev.h.flags & O_NOFOLLOW);
    ssize_t n = tracee_real_path(p->tid, pd->dirfd[0], pd->raw[0], follow, real, sizeof real);
    if (n < 0)
        return errno == ENOENT;  /* the lookup fails: nothing is read */
    return noise_match(t->c, real, (size_t)n);
}

/* A call that makes, moves or removes a name (the new name, and a rename's
 * or a link's source) in a directory on the way to noise turns noise
 * dropping off for the rest of the run: an open already let through
 * unstopped could race it. The directory is found as it really is. */
static void watch_noise_ways(struct tracer *t, struct proc *p, struct pending *pd)
{
    for (int i = 0; i < 2 && !t->noise_off; i++) {
        if (!pd->ev.s[i] || (pd->ev.h.kind == CAPER_EV_SYMLINK && i == 0))
            continue;
        char dir[CAPER_PATH_MAX + 1], real[CAPER_PATH_MAX];
        memcpy(dir, pd->raw[i], sizeof dir);
        char *slash = strrchr(dir, '/');
        while (slash && slash > dir && slash[1] == '\0') {  /* "a/b/": the name is b */
            *slash = '\0';
            slash = strrchr(dir, '/');
        }
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else
            slash[slash == dir] = '\0';   /* "/x" -> "/" */
        ssize_t n = tracee_real_path(p->tid, pd->dirfd[i], dir, 1, real, sizeof real);
        /* Unresolvable (a race, a magic link): assume the worst. */
        if (n < 0 ? errno != ENOENT : on_noise_way(t->c, real))
            t->noise_off = 1;
    }
}

/* Pin the socket a connect or send names (pidfd_getfd: the same open file,
 * whatever the descriptor table holds by the time the kernel would look)
 * into pd, with its domain and type. Returns its type and protocol
 * (SOCK_STREAM | IPPROTO_TCP << 8) for the report, 0 when unknown. */
static uint32_t pin_socket(struct proc *p, struct pending *pd, uint64_t fd)
{
    pd->sock_domain = pd->sock_type = -1;
    pd->sock_errno = 0;
    if ((pd->sock = tracee_fd(p->tid, fd)) < 0) {
        pd->sock_errno = errno == EBADF ? EBADF : EPERM;
        return 0;
    }
    int proto = 0;
    socklen_t n = sizeof pd->sock_domain;
    if (getsockopt(pd->sock, SOL_SOCKET, SO_DOMAIN, &pd->sock_domain, &n) < 0) {
        pd->sock_errno = errno;             /* ENOTSOCK: the kernel's answer too */
        pd->sock_domain = -1;
        return 0;
    }
    n = sizeof pd->sock_type;
    if (getsockopt(pd->sock, SOL_SOCKET, SO_TYPE, &pd->sock_type, &n) < 0)
        pd->sock_type = -1;
    n = sizeof proto;
    if (getsockopt(pd->sock, SOL_SOCKET, SO_PROTOCOL, &proto, &n) < 0)
        proto = 0;
    return pd->sock_type < 0 ? 0 : (uint32_t)(pd->sock_type & 0xff) | (uint32_t)(proto & 0xff) << 8;
}

static void unpin_socket(struct pending *pd)
{
    if (pd->sock >= 0)
        close(pd->sock);
    pd->sock = -1;
}

/* Whether the tracer does this connect or send itself. The kernel would read
 * the descriptor and the address from the tracee again after any check, so
 * it may run the call only where no rereading can reach a host socket: a
 * connect never (it is cheap to do here); a send on a unix datagram socket
 * never (its name, or a NULL one, can be rewritten); any send by a task
 * whose descriptor table another task shares (the descriptor can be
 * swapped for such a socket). Unix stream and seqpacket sockets take no
 * name on a send, other domains no unix name. */
static int tracer_acts(const struct proc *p, const struct pending *pd, const struct sysent *s)
{
    if (s->nr == SYS_connect || p->shares_files || pd->sock < 0)
        return 1;
    return pd->sock_domain == AF_UNIX && pd->sock_type != SOCK_STREAM &&
           pd->sock_type != SOCK_SEQPACKET;
}

/* The inode of the pinned socket: caper's proxy learns from it which process
 * a connection it accepted came from (the peer's port names the inode in the
 * sandbox's /proc/net/tcp). 0 when unknown, and the proxy then refuses. */
static int64_t socket_inode(const struct pending *pd)
{
    struct stat st;
    return pd->sock >= 0 && fstat(pd->sock, &st) == 0 && S_ISSOCK(st.st_mode)
        ? (int64_t)st.st_ino : 0;
}

/* sendmmsg: decode the messages' destinations into pd. Returns 2 when one
 * names a unix path (the call is refused, see on_seccomp; pd reports a host
 * socket if one is named, else the first path), else 1 when one names any
 * destination (pd reports the first), else 0. */
static int take_mmsg_dests(struct tracer *t, struct proc *p, struct pending *pd,
                           uint64_t vec, uint64_t vlen)
{
    /* One per tracer: several caper runs may trace at once in one process. */
    if (!t->scratch && !(t->scratch = malloc(sizeof *t->scratch)))
        return 0;
    struct pending *scratch = t->scratch;
    int found = 0;
    if (vlen > 1024)
        vlen = 1024;  /* UIO_MAXIOV: the kernel sends no more */
    for (uint64_t i = 0; i < vlen; i++) {
        struct mmsghdr m;
        if (tracee_read(p->tid, vec + i * sizeof m, &m, sizeof m) < 0)
            break;
        if (!m.msg_hdr.msg_name)
            continue;
        struct pending *into = found ? scratch : pd;
        if (found)
            memset(&scratch->ev, 0, sizeof scratch->ev);
        take_sockaddr(p, into, (uint64_t)(uintptr_t)m.msg_hdr.msg_name, m.msg_hdr.msg_namelen);
        if (into->ev.h.flags == CAPER_AF_UNIX) {
            int host = !unix_bound_here(&t->bound, p->tid, into->unix_raw);
            if (into != pd && (found < 2 || host)) {  /* report this one */
                memcpy(pd->s[0], into->s[0], into->ev.n[0]);
                pd->ev.n[0] = into->ev.n[0];
                pd->ev.s[0] = pd->s[0];
                pd->ev.h.flags = into->ev.h.flags;
                pd->ev.h.arg0 = into->ev.h.arg0;
            }
            if (host)
                return 2;
            found = 2;
        } else if (!found) {
            found = 1;
        }
    }
    return found;
}

static void refuse(struct tracer *t, struct proc *p, const struct ptrace_syscall_info *si,
                   uint32_t why, int err)
{
    struct ev ev;
    init_ev(&ev, p, CAPER_EV_REFUSED);
    ev.h.sysno = si->seccomp.nr;
    ev.h.arch = si->arch;
    ev.h.flags = why;
    ev.h.result = -err;
    ev.h.info = CAPER_INFO_REFUSED;
    ev.h.arg0 = (int64_t)si->seccomp.args[0];
    emit_folded(t, p, &ev);
    deny(p->tid, err);
}

/* fallocate() takes any amount of space in one call, between two of the
 * disk guard's polls. A call is granted only if it fits above the guard's
 * floor with every other granted call still in progress counted as taken
 * (racing threads cannot add up past it); it stops again at its exit, which
 * hands its share back: the filesystem's free space shows it from then on.
 * Writes are not counted here: they are as slow as the page cache, and the
 * guard's poll stops them. */
static int falloc_ok(struct tracer *t, struct proc *p, int mode, uint64_t len)
{
    const int frees = 0x02 | 0x08;  /* FALLOC_FL_PUNCH_HOLE, FALLOC_FL_COLLAPSE_RANGE */
    const struct caper_config *c = t->c;
    if (!c->disk_path || (mode & frees) || (int64_t)len <= 0)  /* the kernel's EINVAL */
        return 1;
    struct statvfs v;
    if (statvfs(c->disk_path, &v) < 0)
        return 0;  /* cannot tell what is left: refuse */
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, floor = c->disk_min_free;
    uint64_t left = avail > floor + t->falloc_inflight ? avail - floor - t->falloc_inflight : 0;
    if (len > left)
        return 0;
    p->falloc = len;
    t->falloc_inflight += len;
    return 1;
}

static void falloc_done(struct tracer *t, struct proc *p)
{
    t->falloc_inflight -= p->falloc;
    p->falloc = 0;
}

/* sched_setaffinity under the pin, answered as the kernel answers inside a
 * cpuset of the pinned CPUs: the mask in effect is the request's overlap
 * with the pin (which is the pin itself: it is the mask every sandbox process
 * already has), and no overlap is EINVAL. The call itself never runs. */
static void hold_affinity(struct tracer *t, struct proc *p, const __u64 *a)
{
    cpu_set_t want;
    CPU_ZERO(&want);
    size_t n = a[1] < sizeof want ? (size_t)a[1] : sizeof want;
    if (tracee_read(p->tid, a[2], &want, n) < 0) {
        deny(p->tid, EFAULT);
        return;
    }
    CPU_AND(&want, &want, &t->pin);
    deny(p->tid, CPU_COUNT(&want) ? 0 : EINVAL);
}

/* Whether a lock on the tracee's descriptor fd would be taken on a host
 * inode: locks belong to the inode (flock's and OFD locks to the open file,
 * of that inode), so a sandboxed command holding one would hold off host
 * processes and other runs that lock the same file. A file seen through a
 * read-only bind of a host mount (a read-only or held mount, a top-level
 * file rootless) is the host's inode; so is a device node bound from the
 * host's /dev (devpts is the sandbox's own instance). Overlay files are the
 * overlay's own inodes, whatever layer holds them. A descriptor that cannot
 * be looked at is answered by the kernel (EBADF). Not covered: another
 * thread sharing the descriptor table may replace fd between this look and
 * the call. */
static int host_lock(pid_t tid, int fd)
{
    char at[64];
    snprintf(at, sizeof at, "/proc/%d/fd/%d", (int)tid, fd);
    int o = open(at, O_PATH | O_CLOEXEC);
    if (o < 0)
        return 0;
    struct statfs sfs;
    struct stat st;
    int host = fstatfs(o, &sfs) < 0 || fstat(o, &st) < 0 ||   /* cannot tell: refuse */
               ((sfs.f_flags & ST_RDONLY) && sfs.f_type != OVERLAYFS_SUPER_MAGIC) ||
               ((S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) &&
                sfs.f_type != DEVPTS_SUPER_MAGIC);
    close(o);
    return host;
}

/* Whether the tracer's descriptor fd is a FIFO on a read-only mount. The
 * sandbox's writable places are its own overlays and tmpfs, where a FIFO is
 * a pipe of the sandbox's; a read-only mount in it is a bind of a host
 * mount (a read-only or held one, a top-level file rootless), where the
 * pipe is the host's: its reader or writer a host process (adv12a 01). The
 * sandbox's own read-only mounts (the stage, stand-ins) hold no FIFOs. A
 * FIFO that cannot be looked at counts as one. */
static int host_fifo(int fd)
{
    struct stat st;
    struct statfs sfs;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode))
        return 0;
    return fstatfs(fd, &sfs) < 0 || (sfs.f_flags & ST_RDONLY);
}

/* What an open's name leads to at its stop, looked up in the sandbox's view
 * as the kernel will (O_PATH: no FIFO opened, no driver run). A name the
 * safe look refuses (a magic link: /proc/self/fd/N/x, /dev/fd/N, adv13a 02;
 * a cwd outside the root) is looked up through the tracee's own /proc
 * entries, which the tracer may follow: they land on the tracee's objects,
 * in its mounts ("self" would name the tracer). One neither look can tell
 * is refused: the kernel might reach a host FIFO. */
static int opens_host_fifo(struct proc *p, struct pending *pd)
{
    if (pd->ev.h.info & (CAPER_INFO_UNREADABLE | CAPER_INFO_TRUNCATED))
        return 0;       /* the kernel answers EFAULT or ENAMETOOLONG */
    static const char *const selves[][2] = {
        { "/proc/self/", "" }, { "/proc/thread-self/", "" }, { "/dev/fd/", "fd/" },
        { "/dev/stdin", "fd/0" }, { "/dev/stdout", "fd/1" }, { "/dev/stderr", "fd/2" } };
    const char *raw = pd->raw[0], *rest = NULL, *as = "";
    int follow = !(pd->ev.h.flags & O_NOFOLLOW), refused = 0, fd = -1;
    char via[CAPER_PATH_MAX + 64], flat[CAPER_PATH_MAX];
    if (raw[0] == '/' && path_join_normalize("/", raw, flat, sizeof flat))
        for (size_t k = 0; !rest && k < sizeof selves / sizeof *selves; k++) {
            size_t n = strlen(selves[k][0]);
            if (strncmp(flat, selves[k][0], n) == 0 && (selves[k][0][n - 1] == '/' ||
                                                        flat[n] == '/' || flat[n] == '\0')) {
                rest = flat + n;
                as = selves[k][1];
            }
        }
    if (rest) {
        snprintf(via, sizeof via, "/proc/%d/%s%s", (int)p->tid, as, rest);
    } else if ((fd = tracee_open(p->tid, pd->dirfd[0], raw, follow, &refused)) >= 0 || !refused) {
        via[0] = '\0';
    } else if (raw[0] == '/') {
        snprintf(via, sizeof via, "/proc/%d/root%s", (int)p->tid, raw);
    } else if (pd->dirfd[0] == AT_FDCWD) {
        snprintf(via, sizeof via, "/proc/%d/cwd/%s", (int)p->tid, raw);
    } else {
        snprintf(via, sizeof via, "/proc/%d/fd/%d/%s", (int)p->tid, pd->dirfd[0], raw);
    }
    if (fd < 0 && via[0] && (fd = open(via, O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW))) < 0)
        return refused;       /* the safe look refused and this one cannot tell: refuse */
    if (fd < 0)
        return 0;
    int fifo = host_fifo(fd);
    close(fd);
    return fifo;
}

/* The descriptor an open returned (the tracee's, looked at through /proc). */
static int opened_host_fifo(pid_t tid, int64_t rv)
{
    char at[64];
    snprintf(at, sizeof at, "/proc/%d/fd/%d", (int)tid, (int)rv);
    int fd = open(at, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int fifo = host_fifo(fd);
    close(fd);
    return fifo;
}

/* A link or rename, done here, by the tracer, from its copy of the names
 * (names.c): the kernel never reads them again, so the event's names are
 * the ones used. The call itself is skipped and returns what this did. */
static void act_on_names(struct tracer *t, struct proc *p, struct pending *pd)
{
    struct caper_event *h = &pd->ev.h;
    int refused = 0;
    int64_t r;
    if (!pd->ev.s[0] || !pd->ev.s[1]) {
        r = -EFAULT;
    } else if (h->info & CAPER_INFO_TRUNCATED) {
        r = -ENAMETOOLONG;
    } else {
        struct name_call nc = { h->kind == CAPER_EV_LINK, { pd->dirfd[0], pd->dirfd[1] },
                                { pd->raw[0], pd->raw[1] }, h->flags };
        char acted[3][CAPER_PATH_MAX];
        r = name_call_for(p->tid, &nc, acted, &refused);
        for (int i = 0; i < 3; i++)
            if (acted[i][0]) {       /* what was acted on; else the names as resolved */
                pd->ev.n[i] = strlen(acted[i]);
                memcpy(pd->s[i], acted[i], pd->ev.n[i] + 1);
                pd->ev.s[i] = pd->s[i];
            }
    }
    if (refused)
        h->info |= CAPER_INFO_REFUSED;
    h->result = r;
    emit_folded(t, p, &pd->ev);
    deny(p->tid, (int)-r);
}

/* ---- stopping at a credential (caper_config.stop_at) ------------------------ */

/* Whether an open (for reading: O_PATH too, whose descriptor reopens through
 * /proc), a link or a rename about to run would reach a credential: by the
 * name as written and resolved, and by the object the name leads to inside
 * the sandbox (symlinks, /proc/self/root, a bind). openat2's RESOLVE_IN_ROOT
 * and RESOLVE_BENEATH read an absolute name below dirfd: asked that way too.
 * The kernel reads the name again after this stop; the exit stop asks what was
 * opened (stopped_at_exit), for a name another thread rewrote meanwhile. */
static int reaches_credential(struct tracer *t, struct proc *p, struct pending *pd)
{
    const struct caper_credentials *set = t->c->stop_at;
    struct caper_event *h = &pd->ev.h;
    int below = h->kind == CAPER_EV_LINK || h->kind == CAPER_EV_RENAME;
    if (h->kind == CAPER_EV_OPEN) {
        if ((h->flags & O_ACCMODE) == O_WRONLY && !(h->flags & O_PATH))
            return 0;
    } else if (!below) {
        return 0;
    }
    int follow = h->kind == CAPER_EV_OPEN ? !(h->flags & O_NOFOLLOW) && !(h->flags & O_EXCL)
                                          : h->kind == CAPER_EV_LINK &&
                                            (h->flags & AT_SYMLINK_FOLLOW);
    int exchange = h->kind == CAPER_EV_RENAME && (h->flags & RENAME_EXCHANGE);
    char real[CAPER_PATH_MAX];
    for (int i = 0; i < (exchange ? 2 : 1); i++) {
        if (!pd->ev.s[i])
            continue;               /* unreadable: the kernel cannot read it either */
        const char *raw = pd->raw[i];
        if (h->kind == CAPER_EV_OPEN && (pd->resolve & (RESOLVE_IN_ROOT | RESOLVE_BENEATH)))
            while (*raw == '/')
                raw++;
        /* Only a name that leads to something: a call on a missing one fails
         * (ENOENT from ~/.npmrc at every npm start), and reaches nothing. */
        ssize_t n = tracee_real_path(p->tid, pd->dirfd[i], raw, follow, real, sizeof real);
        if (n <= 0)
            continue;
        if (credential_stop(set, pd->ev.s[i], below))
            return 1;
        if (credential_stop(set, real, below)) {
            /* the event names what the call would have reached (string 3) */
            memcpy(pd->s[2], real, (size_t)n + 1);
            pd->ev.s[2] = pd->s[2];
            pd->ev.n[2] = (size_t)n;
            return 1;
        }
        if (h->kind == CAPER_EV_OPEN)
            memcpy(pd->checked, real, (size_t)n + 1);
    }
    return 0;
}

/* At an open's exit: whether what it opened (string 3) stops the run. What
 * its stop let through already is let through (the name led there then
 * too); anything else was reached by a name rewritten or a file made after
 * that stop. The descriptor is in the process's table now: where another
 * task shares that table (CLONE_FILES), which could read from it while
 * Python is asked, a candidate stops the run without asking. */
static int opened_credential(struct tracer *t, struct proc *p, struct pending *pd)
{
    const char *what = pd->ev.s[2];
    if (!what || (pd->checked[0] && strcmp(pd->checked, what) == 0))
        return 0;
    if (p->shares_files)
        return caper_credential_candidate(t->c->stop_at, what, 0);
    return credential_stop(t->c->stop_at, what, 0);
}

/* The run ends here: this call's event says where (refused, with err), and
 * every process of the sandbox is killed now, each by itself, before this one
 * (its parent, woken by its death, must not go on to act on it); this one
 * stays in its stop until it dies (the kernel skips a call whose caller is
 * killed at its seccomp stop, and an exit stop never returns to the process).
 * A child too new to be in the table dies at its first stop (trace_loop). */
static void stop_run(struct tracer *t, struct proc *p, struct pending *pd, int64_t err,
                     uint32_t end)
{
    pd->ev.h.info |= CAPER_INFO_REFUSED;
    pd->ev.h.result = err;
    emit_folded(t, p, &pd->ev);
    p->frozen = 1;
    for (int i = 0; i < BUCKETS; i++)
        for (struct proc *q = t->buckets[i]; q; q = q->next)
            if (q != p)
                kill(q->tid, SIGKILL);
    kill(p->tid, SIGKILL);
    kill_sandbox(t, end);
}

static void on_seccomp(struct tracer *t, struct proc *p)
{
    struct ptrace_syscall_info si;
    if (ptrace(PTRACE_GET_SYSCALL_INFO, p->tid, sizeof si, &si) < 0 ||
        si.op != PTRACE_SYSCALL_INFO_SECCOMP)
        return;
    if (si.arch != AUDIT_ARCH_X86_64 || (si.seccomp.nr & X32_SYSCALL_BIT)) {
        refuse(t, p, &si, CAPER_REFUSE_ABI, EPERM);
        return;
    }
    /* The data is only a hint: a filter of the command's own may have set it. */
    uint32_t idx = si.seccomp.ret_data;
    if (idx >= caper_n_sysent || caper_sysent[idx].nr != si.seccomp.nr) {
        for (idx = 0; idx < caper_n_sysent && caper_sysent[idx].nr != si.seccomp.nr; idx++)
            ;
        if (idx == caper_n_sysent)
            return;  /* not a call caper decodes: the command's filter asked for this stop */
    }
    const struct sysent *s = &caper_sysent[idx];
    const __u64 *a = si.seccomp.args;
    switch (s->decode) {
    case DEC_REFUSE:
        refuse(t, p, &si, CAPER_REFUSE_DENYLIST, EPERM);
        return;
    case DEC_REFUSE_NS:
        refuse(t, p, &si, CAPER_REFUSE_NAMESPACE, EPERM);
        return;
    case DEC_AFFINITY:
        if (t->pinned)
            hold_affinity(t, p, a);
        return;
    case DEC_FALLOCATE:
        if (!falloc_ok(t, p, (int)a[1], a[3]))
            refuse(t, p, &si, CAPER_REFUSE_DISK_BUDGET, ENOSPC);
        return;
    case DEC_LOCK:
        /* flock(fd, LOCK_UN) releases what it holds: let it through */
        if (!(s->nr == SYS_flock && (a[1] & LOCK_UN)) && host_lock(p->tid, (int)a[0]))
            refuse(t, p, &si, CAPER_REFUSE_HOST_LOCK, ENOLCK);
        return;
    case DEC_CWD:
        forget_cwds(t);
        return;
    case DEC_USER_OBJECT:
        /* made, not held: one closed is not counted back (the tracer sees no close) */
        if (++t->user_objects > USER_OBJECTS_MAX)
            refuse(t, p, &si, CAPER_REFUSE_USER_LIMIT, EMFILE);
        return;
    default:
        break;
    }
    if (!p->pend && !(p->pend = malloc(sizeof *p->pend)))
        return;
    struct pending *pd = p->pend;
    init_ev(&pd->ev, p, s->kind);
    pd->unix_bind = 0;
    pd->sock = -1;
    pd->dest.raw = NULL;
    pd->dest.len = 0;
    pd->dest_bad = pd->quiet = pd->noise = pd->src_known = 0;
    pd->resolve = 0;
    pd->checked[0] = '\0';
    struct caper_event *h = &pd->ev.h;
    h->sysno = s->nr;
    h->arch = si.arch;
    if (s->flags >= 0)
        h->flags = (uint32_t)a[s->flags];
    h->flags |= s->fixed_flags;
    if (s->mode >= 0)
        h->mode = (uint32_t)a[s->mode];
    if (s->a0 >= 0)
        h->arg0 = (int64_t)a[s->a0];
    if (s->a1 >= 0)
        h->arg1 = (int64_t)a[s->a1];

    switch (s->decode) {
    case DEC_PATHS:
        if (s->kind == CAPER_EV_SYMLINK)
            take_raw_string(p, pd, 0, a[0]);
        else if (s->path >= 0)
            take_path(p, pd, 0, s->dirfd >= 0 ? (int)a[s->dirfd] : AT_FDCWD, a[s->path]);
        if (s->path2 >= 0)
            take_path(p, pd, 1, s->dirfd2 >= 0 ? (int)a[s->dirfd2] : AT_FDCWD, a[s->path2]);
        if (s->nr == SYS_unlinkat && (h->flags & AT_REMOVEDIR))
            h->kind = CAPER_EV_RMDIR;
        break;
    case DEC_FD:
        take_fd_path(p, pd, 0, (int)a[s->dirfd]);
        break;
    case DEC_OPENAT2: {
        struct open_how how;
        memset(&how, 0, sizeof how);
        if (tracee_read(p->tid, a[2], &how, sizeof how) >= 0) {
            h->flags = (uint32_t)how.flags;
            h->mode = (uint32_t)how.mode;
            pd->resolve = how.resolve;
        } else {
            h->info |= CAPER_INFO_UNREADABLE;
        }
        take_path(p, pd, 0, (int)a[0], a[1]);
        break;
    }
    case DEC_EXEC:
        take_path(p, pd, 0, s->dirfd >= 0 ? (int)a[s->dirfd] : AT_FDCWD, a[s->path]);
        take_program(p, pd);
        take_argv(t, p, pd, a[s->a0]);
        h->arg0 = 0;
        break;
    case DEC_SOCKADDR:
        if (s->nr == SYS_bind) {
            take_sockaddr(p, pd, a[1], a[2]);
            break;
        }
        h->mode = pin_socket(p, pd, a[0]);
        if (s->nr == SYS_sendto)
            take_sockaddr(p, pd, a[4], a[5]);
        else
            take_sockaddr(p, pd, a[1], a[2]);
        if (s->nr == SYS_connect && (pd->sock_domain == AF_INET || pd->sock_domain == AF_INET6))
            h->arg1 = socket_inode(pd);
        break;
    case DEC_MSGHDR: {
        struct msghdr m;
        h->mode = pin_socket(p, pd, a[0]);
        if (tracee_read(p->tid, a[1], &m, sizeof m) < 0)
            pd->dest_bad = pd->quiet = 1;
        else if (!m.msg_name)
            pd->quiet = 1;  /* no destination: the socket's connect was already seen */
        else
            take_sockaddr(p, pd, (uint64_t)(uintptr_t)m.msg_name, m.msg_namelen);
        break;
    }
    case DEC_MMSGHDR: {
        /* The tracer does not send for sendmmsg. Where it would have to
         * (tracer_acts), ENOSYS, for the caller to fall back to sendmsg,
         * which the tracer does. glibc's resolver (2.36) does not fall back:
         * with a DNS in the sandbox caper asks it for single-request. */
        h->mode = pin_socket(p, pd, a[0]);
        int acts = tracer_acts(p, pd, s);
        unpin_socket(pd);
        /* Every message may name its own destination. One to a unix path
         * refuses the call: the kernel would read it again after the check. */
        int dests = take_mmsg_dests(t, p, pd, a[1], a[2]);
        if (acts) {
            if (dests) {            /* reported as named, as far as the copy shows */
                if (dests == 2)
                    h->info |= CAPER_INFO_REFUSED;
                h->result = -ENOSYS;
                emit_folded(t, p, &pd->ev);
            }
            deny(p->tid, ENOSYS);
            return;
        }
        if (!dests)
            return;
        if (dests == 2) {
            h->info |= CAPER_INFO_REFUSED;
            h->result = -EACCES;
            emit_folded(t, p, &pd->ev);
            deny(p->tid, EACCES);
            return;
        }
        break;
    }
    case DEC_SIGNAL:
        /* pid_t is an int: kill(-1) and process groups stay negative. */
        h->arg0 = s->a0 < 0 ? -1 : (int64_t)(int32_t)a[s->a0];  /* pidfd: no number */
        break;
    }

    if (h->kind == CAPER_EV_OPEN && opens_host_fifo(p, pd)) {
        refuse(t, p, &si, CAPER_REFUSE_HOST_FIFO, EACCES);
        return;
    }
    if (t->c->stop_at && reaches_credential(t, p, pd)) {
        stop_run(t, p, pd, -EACCES, CAPER_END_CREDENTIAL);
        return;
    }
    if (t->c->n_noise && !t->noise_off && !(t->c->flags & CAPER_F_KEEP_NOISE) &&
        (s->kind == CAPER_EV_RENAME || s->kind == CAPER_EV_LINK || s->kind == CAPER_EV_SYMLINK ||
         s->kind == CAPER_EV_UNLINK || s->kind == CAPER_EV_RMDIR || s->kind == CAPER_EV_MKDIR ||
         s->kind == CAPER_EV_MKNOD || (s->kind == CAPER_EV_OPEN && (h->flags & O_CREAT))))
        watch_noise_ways(t, p, pd);
    if (s->kind == CAPER_EV_OPEN && !(t->c->flags & CAPER_F_KEEP_NOISE) &&
        (h->flags & O_ACCMODE) == O_RDONLY && !(h->flags & (O_CREAT | O_TRUNC)) &&
        is_noise(t, p, pd)) {
        /* Judged by its name, which the kernel reads again after this stop
         * (another thread can rewrite it): what was opened decides, at the exit. */
        pd->noise = 1;
        p->in_call = 1;
        return;
    }
    if (s->nr == SYS_connect || s->kind == CAPER_EV_SENDTO) {
        if (!tracer_acts(p, pd, s)) {
            unpin_socket(pd);
            if (pd->quiet)
                return;     /* the kernel sends where the socket is connected */
            p->in_call = 1;
            return;
        }
        /* Done here, by the tracer, on the socket and the address it
         * checked: the call itself is skipped and returns what this did. */
        int refused = 0;
        int64_t r;
        if (pd->sock < 0)
            r = -pd->sock_errno;
        else if (pd->dest_bad)
            r = -EFAULT;
        else if (s->nr == SYS_connect)
            r = sock_connect_for(&t->bound, p->tid, pd->sock, &pd->dest, &refused);
        else
            r = sock_send_for(&t->bound, p->tid, pd->sock, (const uint64_t *)a,
                              s->nr == SYS_sendto, pd->sock_type == SOCK_STREAM, &pd->dest,
                              &refused);
        unpin_socket(pd);
        if (refused)
            h->info |= CAPER_INFO_REFUSED;
        h->result = r;
        if (!pd->quiet)
            emit_folded(t, p, &pd->ev);
        deny(p->tid, (int)-r);
        return;
    }
    if (s->kind == CAPER_EV_LINK || s->kind == CAPER_EV_RENAME) {
        act_on_names(t, p, pd);
        return;
    }
    if (s->kind == CAPER_EV_BIND && h->flags == CAPER_AF_UNIX) {
        pd->unix_bind = 1;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        pd->bind_sec = now.tv_sec;
    }
    p->in_call = 1;
}

/* Whether an open reached a device node, and which: the opened file by its
 * fd, or, for a failed open (nodev answers EACCES), the path looked up in
 * the tracee's root. Both only look (stat, O_PATH): no driver runs. */
static int device_of(pid_t tid, int64_t rv, const char *path, dev_t *rdev)
{
    char at[64];
    struct stat st;
    if (rv >= 0) {
        snprintf(at, sizeof at, "/proc/%d/fd/%d", (int)tid, (int)rv);
        if (stat(at, &st) < 0)
            return 0;
    } else {
        if (rv == -ENOENT || rv == -ENOTDIR || path[0] != '/')
            return 0;  /* the common failures: nothing there to be a device */
        snprintf(at, sizeof at, "/proc/%d/root", (int)tid);
        int root = open(at, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
            return 0;
        struct open_how how = { .flags = O_PATH | O_CLOEXEC,
                                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
        int fd = (int)syscall(SYS_openat2, root, path, &how, sizeof how);
        close(root);
        if (fd < 0)
            return 0;
        int ok = fstat(fd, &st) == 0;
        close(fd);
        if (!ok)
            return 0;
    }
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
        return 0;
    *rdev = st.st_rdev;
    return 1;
}

/* The access mode (O_ACCMODE | O_PATH) of the tracee's descriptor fd, from
 * /proc/<tid>/fdinfo; unknown: O_RDWR, which counts as a read and a write. */
static uint32_t fd_access(pid_t tid, int64_t fd)
{
    char at[64], buf[256];
    snprintf(at, sizeof at, "/proc/%d/fdinfo/%d", (int)tid, (int)fd);
    int f = open(at, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return O_RDWR;
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    if (n <= 0)
        return O_RDWR;
    buf[n] = '\0';
    const char *line = strstr(buf, "flags:");
    if (!line)
        return O_RDWR;
    unsigned long flags = strtoul(line + 6, NULL, 8);
    return (uint32_t)(flags & (O_ACCMODE | O_PATH));
}

static void on_syscall_exit(struct tracer *t, struct proc *p)
{
    struct ptrace_syscall_info si;
    if (p->falloc) {
        falloc_done(t, p);
        return;
    }
    if (!p->in_call)
        return;
    p->in_call = 0;
    if (ptrace(PTRACE_GET_SYSCALL_INFO, p->tid, sizeof si, &si) < 0 ||
        si.op != PTRACE_SYSCALL_INFO_EXIT)
        return;
    int64_t rv = si.exit.rval;
    if (si.exit.is_error && -rv >= ERESTART_FIRST && -rv <= ERESTART_LAST)
        return;  /* the kernel runs it again, and it stops again */
    struct pending *pd = p->pend;
    pd->ev.h.result = rv;
    if (pd->ev.h.kind == CAPER_EV_OPEN && rv >= 0 && pd->ev.h.sysno == SYS_openat2)
        /* openat2's flags were read from memory the kernel read again: the
         * file's own access mode is what it was opened for. */
        pd->ev.h.flags = (pd->ev.h.flags & ~(uint32_t)(O_ACCMODE | O_PATH)) |
                         fd_access(p->tid, rv);
    if (pd->ev.h.kind == CAPER_EV_OPEN && rv >= 0 && (pd->ev.h.flags & O_ACCMODE) != O_WRONLY) {
        /* What was opened (slot 2), whatever name led there: symlinks,
         * /proc/self/root or cwd, a renamed directory. */
        char what[32];
        snprintf(what, sizeof what, "fd/%d", (int)rv);
        ssize_t n = proc_link(p->tid, what, pd->s[2], CAPER_PATH_MAX);
        if (n > 0) {
            pd->ev.n[2] = (size_t)n;
            pd->ev.s[2] = pd->s[2];
        }
    }
    if (pd->ev.h.kind == CAPER_EV_OPEN && rv >= 0 && opened_host_fifo(p->tid, rv)) {
        /* A name changed after the stop's look (a rename race): the host's
         * pipe is open, not yet returned; the descriptor dies with the run. */
        pd->ev.h.kind = CAPER_EV_REFUSED;
        pd->ev.h.flags = CAPER_REFUSE_HOST_FIFO;
        stop_run(t, p, pd, -EACCES, CAPER_END_TRACE_FAILED);
        return;
    }
    if (t->c->stop_at && pd->ev.h.kind == CAPER_EV_OPEN && rv >= 0 &&
        ((pd->ev.h.flags & O_ACCMODE) != O_WRONLY || (pd->ev.h.flags & O_PATH)) &&
        opened_credential(t, p, pd)) {
        /* Opened, not yet returned: the descriptor dies with the process. */
        stop_run(t, p, pd, rv, CAPER_END_CREDENTIAL);
        return;
    }
    if (pd->noise) {
        /* Noise only if nothing was opened, or what was is noise too. */
        if (rv < 0 || (pd->ev.s[2] && noise_match(t->c, pd->ev.s[2], pd->ev.n[2]) &&
                       (pd->ev.h.flags & O_ACCMODE) == O_RDONLY)) {
            p->noise++;
            t->r->noise++;
            return;
        }
    }
    dev_t rdev;
    if (pd->ev.h.kind == CAPER_EV_OPEN && pd->ev.n[0] &&
        device_of(p->tid, rv, pd->s[0], &rdev)) {
        pd->ev.h.info |= CAPER_INFO_DEVICE;
        pd->ev.h.arg1 = (int64_t)rdev;
    }
    struct sock_id id;
    if (pd->unix_bind && rv == 0 && unix_identity(p->tid, pd->unix_raw, 0, &id) == 0 &&
        id.ctime_sec >= pd->bind_sec)
        /* Looked up by name after the call: another thread may have swapped
         * a directory on the way meanwhile, for one holding an older socket
         * (a host socket seen through a read-only bind). The socket this bind
         * made is no older than the call (a whole-second clock at worst). */
        unix_add_bound(&t->bound, &id);
    emit_folded(t, p, &pd->ev);
}

/* Variables that make a program load or run other code than its own: the
 * dynamic loader's, the interpreters' module paths and startup options,
 * the programs git runs for a remote or a diff, a shell's startup file and
 * exported functions, the package managers' own settings (an index, a
 * find-links directory) and where they look for them. A command that sets one for a package manager
 * makes its install the command's code (adv9 03/06, adv8b 19). */
static const char *const code_names[] = {
    "LD_PRELOAD=", "LD_LIBRARY_PATH=", "LD_AUDIT=", "GCONV_PATH=", "BASH_ENV=", "ENV=",
    "BASH_FUNC_", "PYTHONPATH=", "PYTHONHOME=", "PYTHONUSERBASE=", "PYTHONSTARTUP=",
    "PERL5LIB=", "PERLLIB=", "PERL5OPT=", "RUBYLIB=", "RUBYOPT=", "NODE_OPTIONS=",
    "NODE_PATH=", "JAVA_TOOL_OPTIONS=", "_JAVA_OPTIONS=", "JDK_JAVA_OPTIONS=", "CLASSPATH=",
    "GIT_SSH=", "GIT_SSH_COMMAND=", "GIT_EXEC_PATH=", "GIT_ASKPASS=", "SSH_ASKPASS=",
    "GIT_EXTERNAL_DIFF=", "GIT_PROXY_COMMAND=", "GIT_TEMPLATE_DIR=", "MAKEFILES=",
    "RUSTC_WRAPPER=", "RUSTC=", "PIP_", "UV_", "npm_config_", "CARGO_",
    /* where tools find their configuration (pip.conf, .npmrc, gitconfig): another
     * home is another index (adv11b 01) */
    "HOME=", "XDG_CONFIG_HOME=", "XDG_CONFIG_DIRS=", "XDG_DATA_HOME=", "POETRY_", "PIPENV_",
    "GOFLAGS=", "GOPROXY=", "GONOSUMDB=", "GONOSUMCHECK=", "GOPRIVATE=",
    "BUNDLE_", "GEM_HOME=", "GEM_PATH=", "YARN_", "COREPACK_",
    /* a module imported by name, a runtime's start-up hook or profiler, a config
     * that loads an engine or plugin, a command git or less runs */
    "PYTHONWARNINGS=", "PYTHONBREAKPOINT=", "LUA_", "DOTNET_", "CORECLR_", "COR_",
    "OPENSSL_", "PHPRC=", "PHP_INI_SCAN_DIR=", "ERL_", "TCLLIBPATH=", "R_PROFILE",
    "R_LIBS", "ZDOTDIR=", "GIT_EDITOR=", "GIT_SEQUENCE_EDITOR=", "GIT_PAGER=", "EDITOR=",
    "VISUAL=", "PAGER=", "LESSOPEN=", "LESSCLOSE=", "PERL5DB=",
    /* a CA bundle makes a fake index or registry look like the real one */
    "REQUESTS_CA_BUNDLE=", "SSL_CERT_", "CURL_CA_BUNDLE=", "NODE_EXTRA_CA_CERTS=",
    "NODE_TLS_REJECT_UNAUTHORIZED=", "GIT_SSL_",
    /* where a cache of code is found (pip's wheels, pre-commit's hook repos,
     * bytecode), and where gcc finds as, ld and cc1 (adv12b 08, 10) */
    "XDG_CACHE_HOME=", "XDG_STATE_HOME=", "PRE_COMMIT_HOME=", "PYTHONPYCACHEPREFIX=",
    "COMPILER_PATH=", "GCC_EXEC_PREFIX=", "LIBRARY_PATH=", "CPATH=", "C_INCLUDE_PATH=",
    "CPLUS_INCLUDE_PATH=", "RUSTFLAGS=", "RUSTDOCFLAGS=",
    /* the compiler, linker and flags an installer's build runs with (setuptools
     * runs $CC: adv13b 01), pytest's own options, setuptools' and sysconfig's
     * extra config. Not MAKEFLAGS: make sets it for every recipe (a compiler
     * it names is a program the run planted, judged as such). */
    "CC=", "CXX=", "CPP=", "LD=", "AR=", "AS=", "LDSHARED=", "LDCXXSHARED=", "CFLAGS=",
    "CXXFLAGS=", "CPPFLAGS=", "LDFLAGS=", "PYTEST_ADDOPTS=", "PYTEST_PLUGINS=",
    "DIST_EXTRA_CONFIG=", "SETUPTOOLS_", "_PYTHON_SYSCONFIGDATA_NAME=", "CMAKE_", "CGO_",
};

/* In any case: npm reads npm_config_* so (adv12b 02), and a name marked
 * that no program reads costs only a stricter judgment. */
static int named(const char *entry, size_t len, const char *const *names, size_t count)
{
    for (size_t k = 0; k < count; k++)
        if (len >= strlen(names[k]) && strncasecmp(entry, names[k], strlen(names[k])) == 0)
            return 1;
    return 0;
}

static uint64_t entry_hash(const char *entry, size_t len)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)entry[i]) * 1099511628211ull;
    return h;
}

static struct env_set env_copy(struct env_set from)
{
    struct env_set to = { NULL, 0 };
    if (from.h && (to.h = calloc(from.n + 1, sizeof *to.h))) {
        memcpy(to.h, from.h, from.n * sizeof *to.h);
        to.n = from.n;
    }
    return to;
}

/* The set of caper's environment for the command, which its init passes on. */
static struct env_set env_set_of(const char *const *envp)
{
    struct env_set b = { NULL, 0 };
    size_t all = 0;
    while (envp[all])
        all++;
    b.h = calloc(all + 1, sizeof *b.h);
    for (size_t i = 0; b.h && envp[i]; i++)
        if (named(envp[i], strlen(envp[i]), code_names, sizeof code_names / sizeof *code_names))
            b.h[b.n++] = entry_hash(envp[i], strlen(envp[i]));
    return b;
}

static int in_set(struct env_set b, uint64_t h)
{
    for (size_t i = 0; i < b.n; i++)
        if (b.h[i] == h)
            return 1;
    return 0;
}

static void announce(struct tracer *t, struct proc *c, int64_t clone_flags)
{
    struct ev ev;
    init_ev(&ev, c, CAPER_EV_PROC_START);
    ev.h.arg0 = clone_flags;
    emit(t->e, &ev);
    c->announced = 1;
}

static void on_new_child(struct tracer *t, struct proc *p, int event)
{
    unsigned long msg = 0;
    ptrace(PT_GETEVENTMSG, p->tid, 0, &msg);
    pid_t tid = (pid_t)msg;
    struct proc *c = find(t, tid);
    if (!c && !(c = create(t, tid)))
        return;
    c->ppid = p->is_init ? 0 : p->tid;
    c->is_command = p->is_init;
    free(c->env.h);
    c->env = env_copy(p->env);
    if (p->cwd)
        c->cwd = strdup(p->cwd);
    int64_t flags = 0;
    if (event == PTRACE_EVENT_CLONE)
        flags = ptrace(PTRACE_PEEKUSR, p->tid, offsetof(struct user_regs_struct, rdi), 0);
    else if (event == PTRACE_EVENT_VFORK)
        flags = 0x4100;  /* CLONE_VFORK | CLONE_VM */
    /* clone(CLONE_FILES | SIGCHLD) is reported as a fork: its flags are in rdi too. */
    int64_t files = event == PTRACE_EVENT_CLONE ? flags :
        ptrace(PTRACE_PEEKUSR, p->tid, offsetof(struct user_regs_struct, orig_rax), 0) == SYS_clone
            ? ptrace(PTRACE_PEEKUSR, p->tid, offsetof(struct user_regs_struct, rdi), 0) : 0;
    if (files & CLONE_FILES)
        p->shares_files = c->shares_files = 1;  /* for good: tracer_acts errs toward acting */
    announce(t, c, flags);
    if (c->held) {
        c->held = 0;
        resume(c, 0);
    }
    if (t->c->max_pids && t->live - 1 > t->c->max_pids)
        kill_sandbox(t, CAPER_END_PIDS_LIMIT);
}

/* A non-leader thread's exec makes it the leader: it reappears under the
 * leader's tid. The process keeps the leader's identity (parent, whether it
 * is the command); the execing thread's call in progress moves over. */
/* Whether the kernel's argv k differs from the one checked, c, by more than
 * an interpreter explains: for a "#!" script or a binfmt_misc program the
 * kernel puts the interpreter (and its argument, and the script's path) in
 * place of argv[0], so c without its first string must end k, and k has more
 * strings. Copies cut at the bound are not compared: the event says "cut". */
static int argv_changed(const char *k, size_t kn, const char *c, size_t cn)
{
    if (kn == cn && memcmp(k, c, kn) == 0)
        return 0;
    const char *tail = memchr(c, 0, cn);
    if (!tail)
        return 1;
    tail++;
    size_t tn = cn - (size_t)(tail - c), ks = 0, cs = 0;
    for (size_t i = 0; i < kn; i++)
        ks += k[i] == 0;
    for (size_t i = 0; i < cn; i++)
        cs += c[i] == 0;
    return !(ks > cs && kn > tn && k[kn - tn - 1] == 0 && memcmp(k + kn - tn, tail, tn) == 0);
}

/* The argv the kernel did execute, read at the exec event from the new
 * image's own stack (/proc/<pid>/cmdline): no instruction of it has run and
 * no other thread is left, so nothing can have changed it. The copy taken at
 * the seccomp stop may differ: another thread sharing the memory can rewrite
 * the strings after the tracer read them and before the kernel copies them
 * (which comes after the program's path is resolved, and a slow path widens
 * that window to milliseconds). The event carries the kernel's argv, and a
 * difference no interpreter explains is marked. */
/* The argv the kernel did execute, into slot 1. Returns 1 when it is an
 * interpreter's (a script or binfmt_misc program: more strings than the
 * checked argv, which ends it), else 0. */
static int take_executed_argv(struct tracer *t, struct proc *p, struct pending *pd)
{
    char path[64], more;
    size_t cap = t->c->argv_max ? t->c->argv_max : 1024;
    if (cap > CAPER_PATH_MAX)
        cap = CAPER_PATH_MAX;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)p->tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : pread(fd, pd->s[2], cap, 0);
    int longer = n == (ssize_t)cap && pread(fd, &more, 1, (off_t)cap) == 1;
    if (fd >= 0)
        close(fd);
    if (n < 0) {
        pd->ev.h.info |= CAPER_INFO_UNREADABLE;
        return 0;
    }
    int interpreted = (size_t)n > pd->ev.n[1] && memcmp(pd->s[2], pd->s[1], (size_t)n) != 0;
    if (!longer && !(pd->ev.h.info & CAPER_INFO_TRUNCATED) &&
        argv_changed(pd->s[2], (size_t)n, pd->s[1], pd->ev.n[1]))
        pd->ev.h.info |= CAPER_INFO_ARGV_CHANGED;
    memcpy(pd->s[1], pd->s[2], (size_t)n);
    pd->ev.n[1] = (size_t)n;
    pd->ev.h.info = (pd->ev.h.info & ~(uint32_t)CAPER_INFO_TRUNCATED) |
                    (longer ? CAPER_INFO_TRUNCATED : 0);
    return interpreted;
}

/* The program the kernel did execute, against the one checked (the kernel
 * read the name again after the check): for a program the new image itself
 * (/proc/<pid>/exe), for a script the interpreter of one (the checked file
 * was a script, and the kernel ran an interpreter). Otherwise the event names
 * the new image and says the program changed. */
static void take_executed_program(struct proc *p, struct pending *pd, int interpreted)
{
    char at[64];
    struct stat st;
    snprintf(at, sizeof at, "/proc/%d/exe", (int)p->tid);
    int same = pd->src_known && stat(at, &st) == 0 && st.st_dev == pd->src_dev &&
               st.st_ino == pd->src_ino;
    if (same || (pd->src_script && interpreted))
        return;
    pd->ev.h.info |= CAPER_INFO_ARGV_CHANGED;
    ssize_t n = proc_link(p->tid, "exe", pd->s[0], CAPER_PATH_MAX);
    if (n > 0) {
        pd->ev.n[0] = (size_t)n;
        pd->ev.s[0] = pd->s[0];
    }
}

/* What the environment of the image just executed says, as its command
 * line does not: CAPER_INFO_GIT_ENV when it configures git
 * (GIT_CONFIG_COUNT/KEY/VALUE, GIT_CONFIG_PARAMETERS, GIT_CONFIG_GLOBAL ...
 * set keys: commit.template = .git/config makes git read its own
 * configuration as data; GIT_DIR and GIT_COMMON_DIR another repository's;
 * GIT_TRACE* and GIT_CURL_VERBOSE make it print configuration and headers:
 * GIT_TRACE2_CONFIG_PARAMS='remote.*' prints a remote URL's token), and
 * CAPER_INFO_CODE_ENV when it holds a code-loading entry the image before
 * did not have (p->env: what it was given; one unset is no code), so that
 * the program that put it there is known: the shell of `LD_PRELOAD=x make`,
 * or git setting GIT_EXEC_PATH for its own children. p->env becomes the new
 * image's. An environment that cannot be read says both. */
static uint32_t exec_env(struct proc *p)
{
    static const char *const git_names[] = { "GIT_CONFIG", "GIT_DIR=", "GIT_COMMON_DIR=",
                                             "GIT_TRACE", "GIT_CURL_VERBOSE=" };
    enum { CAP = 4 << 20 };   /* past the kernel's limit for argv and environment together */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)p->tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *buf = fd < 0 ? NULL : malloc(CAP);
    size_t len = 0;
    ssize_t n = -1;
    while (buf && len < CAP && (n = read(fd, buf + len, CAP - len)) > 0)
        len += (size_t)n;
    if (fd >= 0)
        close(fd);
    struct env_set now = { NULL, 0 };
    if (buf && n >= 0 && len < CAP && p->env.h)
        now.h = calloc(len / 2 + 1, sizeof *now.h);   /* at most one entry per two bytes */
    uint32_t info = now.h ? 0 : CAPER_INFO_GIT_ENV | CAPER_INFO_CODE_ENV;
    for (size_t start = 0, one; now.h && start < len; start += one + 1) {
        one = strnlen(buf + start, len - start);
        if (named(buf + start, one, git_names, sizeof git_names / sizeof *git_names))
            info |= CAPER_INFO_GIT_ENV;
        if (!named(buf + start, one, code_names, sizeof code_names / sizeof *code_names))
            continue;
        uint64_t h = entry_hash(buf + start, one);
        if (!in_set(p->env, h))
            info |= CAPER_INFO_CODE_ENV;
        now.h[now.n++] = h;
    }
    free(buf);
    free(p->env.h);
    p->env = now;
    return info;
}

static void on_exec(struct tracer *t, struct proc *leader)
{
    unsigned long former = 0;
    ptrace(PT_GETEVENTMSG, leader->tid, 0, &former);
    struct proc *thread = find(t, (pid_t)former);
    if (thread && thread != leader) {
        falloc_done(t, leader);  /* its call, if any, ended with its thread */
        struct pending *pend = leader->pend;
        leader->pend = thread->pend;
        thread->pend = pend;
        leader->in_call = thread->in_call;
        thread->in_call = 0;
        if (leader->in_call) {
            leader->pend->ev.h.pid = (uint32_t)leader->tid;
            leader->pend->ev.h.ppid = (uint32_t)leader->ppid;
        }
        leader->noise += thread->noise;
        destroy(t, thread);
    }
    if (leader->in_call && leader->pend->ev.h.kind == CAPER_EV_EXEC) {
        int interpreted = take_executed_argv(t, leader, leader->pend);
        take_executed_program(leader, leader->pend, interpreted);
        leader->pend->ev.h.info |= exec_env(leader);
    }
}

static void on_death(struct tracer *t, struct proc *p, int status)
{
    struct ev ev;
    if (p->is_init) {
        destroy(t, p);
        return;
    }
    if (p->in_call) {
        p->pend->ev.h.info |= CAPER_INFO_RESULT_UNKNOWN;
        emit(t->e, &p->pend->ev);
    }
    for (uint32_t i = 0; p->rep && i < REPEAT_SLOTS; i++)
        if (p->rep[i].count) {
            init_ev(&ev, p, CAPER_EV_REPEAT);
            ev.h.arg0 = (int64_t)p->rep[i].seq;
            ev.h.count = p->rep[i].count;
            emit(t->e, &ev);
        }
    if (p->noise) {
        init_ev(&ev, p, CAPER_EV_NOISE);
        ev.h.count = (uint32_t)p->noise;
        emit(t->e, &ev);
    }
    init_ev(&ev, p, CAPER_EV_PROC_EXIT);
    ev.h.arg0 = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    emit(t->e, &ev);
    if (p->is_command) {
        if (WIFEXITED(status)) {
            t->r->exit_code = WEXITSTATUS(status);
            if (!t->killed)
                t->r->end = CAPER_END_EXITED;
        } else {
            t->r->term_signal = WTERMSIG(status);
            if (!t->killed)
                t->r->end = CAPER_END_SIGNALED;
        }
    }
    destroy(t, p);
}

/* What the command left in its /dev/shm (caper's tmpfs, below caper's
 * read-only /dev: the command cannot put a link there), for the report. */
static void shm_count(struct tracer *t)
{
    char path[64];
    struct statvfs v;
    snprintf(path, sizeof path, "/proc/%d/root/dev/shm", t->init_pid);
    if (statvfs(path, &v) == 0 && v.f_blocks >= v.f_bfree)
        t->r->shm_used = (uint64_t)(v.f_blocks - v.f_bfree) * v.f_frsize;
}

int trace_loop(const struct caper_config *c, struct spawn *s, struct emitter *e,
               struct watcher *w, struct caper_result *r, struct caper_failure *f)
{
    struct tracer t;
    memset(&t, 0, sizeof t);
    t.c = c;
    t.e = e;
    t.r = r;
    t.init_pid = s->init_pid;
    /* run.c pinned this thread before the sandbox was made: its mask is the pin. */
    t.pinned = (c->flags & CAPER_F_SHARE_CPU) &&
               sched_getaffinity(0, sizeof t.pin, &t.pin) == 0 && CPU_COUNT(&t.pin) == 1;
    struct proc *init = create(&t, s->init_pid);
    if (!init) {
        fail_set(f, CAPER_STEP_WAIT, ENOMEM, "calloc(process table)");
        kill(s->init_pid, SIGKILL);
    } else {
        init->is_init = init->attached = init->announced = 1;
        init->env = env_set_of(c->envp);
    }
    for (;;) {
        int st;
        pid_t pid;
        /* Flush before blocking, so events reach Python while the command runs. */
        if (e->len && (pid = waitpid(-1, &st, __WALL | __WNOTHREAD | WNOHANG)) == 0) {
            emit_flush(e);
            pid = waitpid(-1, &st, __WALL | __WNOTHREAD);
        } else if (!e->len) {
            pid = waitpid(-1, &st, __WALL | __WNOTHREAD);
        }
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            if (errno != ECHILD)
                fail_set(f, CAPER_STEP_WAIT, errno, "waitpid(sandbox)");
            break;
        }
        if (e->failed_errno && !t.killed) {
            fail_set(f, CAPER_STEP_EMIT, e->failed_errno, "write(event pipe)");
            kill_sandbox(&t, CAPER_END_TRACE_FAILED);
        }
        /* What the run costs caper (Python keeps every event) is bounded. */
        if (!t.killed && ((c->max_events && e->events > c->max_events) ||
                          (c->max_event_bytes && e->bytes > c->max_event_bytes)))
            kill_sandbox(&t, CAPER_END_EVENT_LIMIT);
        r->stops++;
        struct proc *p = find(&t, pid);
        if (!p && !(p = create(&t, pid))) {
            kill_sandbox(&t, CAPER_END_TRACE_FAILED);
            continue;
        }
        if (WIFEXITED(st) || WIFSIGNALED(st)) {
            on_death(&t, p, st);
            /* The command has ended and every process but init is gone: nothing
             * can act or write any more. Init has nothing left to do but exit,
             * which the kernel makes slow by tearing its namespaces down first
             * (~1.5 ms): kill it (it may sit in a signal stop that only we
             * would resume, holding the output and status pipes) and let the
             * caller go on; caper_reap() reaps it. */
            if (r->end && t.live == 1 && find(&t, t.init_pid)) {
                shm_count(&t);
                kill(t.init_pid, SIGKILL);
                r->reap_pid = t.init_pid;
                break;
            }
            continue;
        }
        if (!WIFSTOPPED(st))
            continue;
        if (t.killed && (r->end == CAPER_END_CREDENTIAL || r->end == CAPER_END_EVENT_LIMIT ||
                         r->end == CAPER_END_TRACE_FAILED)) {
            /* Stopped at a credential, past the event cap or where the tracer
             * lost a race: nothing acts, or
             * costs caper an event, any more (init's death would reach the
             * others only after the kernel tore its namespace down). */
            kill(pid, SIGKILL);
            p->frozen = 1;
            continue;
        }
        int sig = WSTOPSIG(st), event = (unsigned)st >> 16;
        if (sig == (SIGTRAP | 0x80)) {
            on_syscall_exit(&t, p);
            resume(p, 0);
            continue;
        }
        switch (event) {
        case PTRACE_EVENT_SECCOMP:
            on_seccomp(&t, p);
            resume(p, 0);
            break;
        case PTRACE_EVENT_FORK:
        case PTRACE_EVENT_VFORK:
        case PTRACE_EVENT_CLONE:
            on_new_child(&t, p, event);
            resume(p, 0);
            break;
        case PTRACE_EVENT_EXEC:
            on_exec(&t, p);
            resume(p, 0);
            break;
        case PTRACE_EVENT_STOP:
            if (!p->attached) {
                /* A new child: held until its parent's fork event names its
                 * parent, so that its start is reported before its acts. */
                p->attached = 1;
                if (p->announced)
                    resume(p, 0);
                else
                    p->held = 1;
            } else if (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) {
                ptrace(PT_LISTEN, pid, 0, 0);  /* group-stop: stay stopped until SIGCONT */
            } else {
                resume(p, 0);
            }
            break;
        default:
            resume(p, sig);  /* signal-delivery stop: pass the signal on */
        }
    }
    /* Anything still in the table died without our seeing it (cannot happen
     * with __WALL, but never leak). */
    for (int i = 0; i < BUCKETS; i++)
        while (t.buckets[i])
            destroy(&t, t.buckets[i]);
    free(t.bound.v);
    free(t.scratch);
    (void)w;
    return 0;
}
