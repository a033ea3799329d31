/* unixsock.c: acting for the tracee on sockets. connect() and the sends the
 * kernel would otherwise do from the tracee's memory are done here, by the
 * tracer, on the socket file it pinned (pidfd_getfd) and with its own copy of
 * the address: after any check the kernel would read the descriptor table
 * and the address again, and another thread (or a process sharing the
 * memory) can change both in between. A unix path is reached only if a
 * sandbox process bound that socket: no name, symlink, chroot or race can
 * reach a host socket. The decoder (trace.c) calls in and reports the result. */
#include "internal.h"
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

/* The identity of the unix socket file a tracee names, resolved inside its
 * root (tracee_open). follow: follow a final symlink (connect, sendto) or
 * not (the name bind just made). 0, or -errno. */
int unix_identity(pid_t tid, const char *raw, int follow, struct sock_id *id)
{
    int refused;
    int fd = tracee_open(tid, AT_FDCWD, raw, follow, &refused);
    if (fd < 0)
        return fd;
    struct stat st;
    int r = 0;
    if (fstat(fd, &st) < 0)
        r = -errno;
    else if (!S_ISSOCK(st.st_mode) || !in_mount_ns_of(tid, fd))
        r = -ECONNREFUSED;
    close(fd);
    if (r == 0) {
        id->dev = st.st_dev;
        id->ino = st.st_ino;
        id->ctime_sec = st.st_ctim.tv_sec;
    }
    return r;
}

static int is_bound(const struct bound_socks *b, const struct sock_id *id)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->v[i].dev == id->dev && b->v[i].ino == id->ino)
            return 1;
    return 0;
}

void unix_add_bound(struct bound_socks *b, const struct sock_id *id)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        struct sock_id *v = realloc(b->v, cap * sizeof *v);
        if (!v)
            return;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = *id;
}

/* A tracee's file descriptor, duplicated into the tracer (pidfd_getfd needs
 * the same access as ptrace). The same open file description: what the
 * tracer does with it, the tracee's socket does. */
int tracee_fd(pid_t tid, uint64_t fd)
{
    int pidfd = (int)syscall(SYS_pidfd_open, tid, 0);
    /* Not a thread-group leader: Linux >= 6.9 takes it with PIDFD_THREAD (and
     * says ENOENT, not EINVAL, without it since the flag exists). */
    if (pidfd < 0 && (errno == EINVAL || errno == ENOENT))
        pidfd = (int)syscall(SYS_pidfd_open, tid, O_EXCL /* PIDFD_THREAD */);
    if (pidfd < 0)
        return -1;
    int dup = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fd, 0);
    int saved = errno;
    close(pidfd);
    errno = saved;
    return dup;
}

/* The unix socket file a tracee names, opened once (O_PATH, following
 * symlinks as connect and sendto do, resolved inside the process's own root,
 * see tracee_open) and checked on that descriptor: usable only if it is on a
 * mount of the sandbox and a sandbox process bound that inode, so no name,
 * symlink or chroot can dress a host socket up as a sandbox one. A host
 * socket, or a name that cannot be resolved safely, is refused (EACCES,
 * *refused set); a name that is no socket gets the kernel's error.
 * Returns the descriptor, or -errno for the tracee. */
static int open_checked_socket(const struct bound_socks *b, pid_t tid, const char *raw,
                               int *refused)
{
    *refused = 0;
    int target = tracee_open(tid, AT_FDCWD, raw, 1, refused);
    if (target < 0)
        return target;
    struct stat st;
    int r = target;
    if (fstat(target, &st) < 0) {
        r = -errno;
    } else if (!S_ISSOCK(st.st_mode)) {
        r = -ECONNREFUSED;
    } else if (!in_mount_ns_of(tid, target) ||
               !is_bound(b, &(struct sock_id){ st.st_dev, st.st_ino })) {
        *refused = 1;
        r = -EACCES;
    }
    if (r < 0)
        close(target);
    return r;
}

/* The address of exactly that inode, whatever its path becomes. */
static struct sockaddr_un fd_address(int target)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d", target);
    return a;
}

/* A call on a tracee's socket that would wait (a full backlog or buffer)
 * must not stall the tracer: a 2 s send timeout while the tracer acts, the
 * socket's own put back after. */
struct send_timeout { struct timeval keep; int set; };

static void bound_send_timeout(int sock, struct send_timeout *st)
{
    struct timeval bound = { 2, 0 };
    socklen_t n = sizeof st->keep;
    st->set = getsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &st->keep, &n) == 0 &&
              setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound) == 0;
}

static void restore_send_timeout(int sock, const struct send_timeout *st)
{
    if (st->set)
        setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &st->keep, sizeof st->keep);
}

/* The destination of a call the tracer makes: a unix path it checks and
 * opens (raw), else the address as copied (addr, len; len 0: none). */
static int dest_name(const struct bound_socks *b, pid_t tid, const struct sock_dest *d,
                     struct sockaddr_un *path, const struct sockaddr **name, socklen_t *len,
                     int *target, int *refused)
{
    *refused = 0;
    *target = -1;
    *name = NULL;
    *len = 0;
    if (d->raw) {
        if ((*target = open_checked_socket(b, tid, d->raw, refused)) < 0)
            return *target;
        *path = fd_address(*target);
        *name = (const struct sockaddr *)path;
        *len = sizeof *path;
    } else if (d->len) {
        *name = (const struct sockaddr *)&d->addr;
        *len = d->len;
    }
    return 0;
}

/* Whether the tracer may act for the tracee on this socket at all. What the
 * tracer does, the kernel checks against the tracer's credentials, not the
 * command's (all capabilities in the host's namespaces, as root): a netlink
 * message to an explicit address is judged by the sender task alone, and
 * its pids are the tracer's pid namespace's (RTM_NEWLINK with
 * IFLA_NET_NS_PID 1 made a link in the host's network namespace; audit
 * requests reached the host's audit). Only unix sockets and the internet
 * families are acted for; netlink only for route dumps (read-only, as
 * glibc's getaddrinfo and getifaddrs send them, checked in the copy the
 * tracer sends), and connects only to the kernel. */
static int acts_on(int sock, const void *data, size_t len, const struct sock_dest *d)
{
    int domain = 0, proto = 0;
    socklen_t n = sizeof domain;
    if (getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &n) < 0)
        return -errno;
    if (domain == AF_UNIX || domain == AF_INET || domain == AF_INET6)
        return 0;
    n = sizeof proto;
    if (domain != AF_NETLINK || getsockopt(sock, SOL_SOCKET, SO_PROTOCOL, &proto, &n) < 0 ||
        proto != NETLINK_ROUTE)
        return -EPERM;
    if (d->len >= sizeof(struct sockaddr_nl)) {
        const struct sockaddr_nl *nl = (const struct sockaddr_nl *)&d->addr;
        if (nl->nl_pid || nl->nl_groups)
            return -EPERM;                  /* only the kernel, no other socket or group */
    }
    if (!data)
        return 0;                           /* a connect: the kernel as the peer */
    /* int, as NLMSG_OK and NLMSG_NEXT expect: an unaligned last message
     * takes left below zero, where a size_t would wrap and read past data. */
    int left = (int)len;
    if (len > 0x7fffffff || left < (int)NLMSG_HDRLEN)
        return -EPERM;
    for (const struct nlmsghdr *h = (const struct nlmsghdr *)data; NLMSG_OK(h, left);
         h = NLMSG_NEXT(h, left)) {
        switch (h->nlmsg_type) {
        case RTM_GETLINK: case RTM_GETADDR: case RTM_GETROUTE: case RTM_GETNEIGH:
        case RTM_GETRULE: case RTM_GETNETCONF:
            break;
        default:
            return -EPERM;
        }
    }
    return left <= 0 ? 0 : -EPERM;          /* a trailing part no header covers */
}

/* The control messages of a send the tracer makes: SCM_RIGHTS (duplicated
 * by take_rights) and those of the IP levels. SCM_CREDENTIALS is dropped:
 * the kernel would check its pid, uid and gid against the tracer (root may
 * name any host pid, and a receiver with SO_PASSPIDFD then held a pidfd of
 * it), so the receiver gets the tracer's own, as for every send the tracer
 * makes. Other SOL_SOCKET messages (SO_MARK, SO_PRIORITY, SCM_TXTIME) are
 * capability checks on the sender: refused. Compacts m's control in place. */
static int keep_control(struct msghdr *m)
{
    char *base = m->msg_control;
    size_t at = 0, kept = 0, len = m->msg_controllen;
    while (len - at >= sizeof(struct cmsghdr)) {
        struct cmsghdr h;
        memcpy(&h, base + at, sizeof h);    /* before anything moves over it */
        if (h.cmsg_len < sizeof h || h.cmsg_len > len - at)
            return -EINVAL;                 /* the kernel's own check (CMSG_OK) */
        size_t size = CMSG_ALIGN(h.cmsg_len) <= len - at ? CMSG_ALIGN(h.cmsg_len) : h.cmsg_len;
        int creds = h.cmsg_level == SOL_SOCKET && h.cmsg_type == SCM_CREDENTIALS;
        if (h.cmsg_level == SOL_SOCKET && !creds && h.cmsg_type != SCM_RIGHTS)
            return -EPERM;
        if (!creds) {
            memmove(base + kept, base + at, size);
            kept += size;
        }
        at += size;
    }
    m->msg_controllen = kept;
    if (!kept)
        m->msg_control = NULL;
    return 0;
}

/* connect() done by the tracer for the tracee, on its pinned socket sock.
 * A unix path: the socket file is opened once, its identity checked on that
 * descriptor, and the socket connected to exactly that inode through
 * /proc/self/fd. Any other address: as copied (an abstract name is looked
 * up in the socket's own network namespace, the sandbox's). Returns 0 or
 * -errno, the result the tracee gets. */
int sock_connect_for(const struct bound_socks *b, pid_t tid, int sock, const struct sock_dest *d,
                     int *refused)
{
    struct sockaddr_un path;
    const struct sockaddr *name;
    socklen_t len;
    int target;
    int r = acts_on(sock, NULL, 0, d);
    if (r < 0) {
        *refused = 1;
        return r;
    }
    r = dest_name(b, tid, d, &path, &name, &len, &target, refused);
    if (r < 0)
        return r;
    struct send_timeout keep;
    bound_send_timeout(sock, &keep);
    r = connect(sock, name, len) < 0 ? -errno : 0;
    restore_send_timeout(sock, &keep);
    if (target >= 0)
        close(target);
    return r;
}

#define SEND_MAX (4u << 20)     /* bytes of one datagram the tracer copies */
#define CONTROL_MAX 65536u      /* above the kernel's optmem_max default */
#define IOV_MAX_ 1024u          /* UIO_MAXIOV */
#define SCM_MAX_FD_ 253         /* descriptors one SCM_RIGHTS message may carry */

/* The descriptors an SCM_RIGHTS message names, duplicated from the tracee
 * into the tracer in place; -EBADF when one is not the tracee's. */
static int take_rights(pid_t tid, struct msghdr *m, int *taken, size_t cap, size_t *n_taken)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        /* The tracee wrote these lengths: the kernel's own check (CMSG_OK). */
        if (c->cmsg_len < sizeof *c ||
            c->cmsg_len > (size_t)((char *)m->msg_control + m->msg_controllen - (char *)c))
            return -EINVAL;
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int *fds = (int *)CMSG_DATA(c);
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            if (*n_taken == cap)
                return -EINVAL;             /* as the kernel says for too many */
            int mine = tracee_fd(tid, (uint64_t)fds[i]);
            if (mine < 0)
                return -EBADF;
            taken[(*n_taken)++] = mine;
            fds[i] = mine;
        }
    }
    return 0;
}

/* sendto()/sendmsg() done by the tracer for the tracee, on its pinned
 * socket sock, to d (sock_connect_for's names; none: where the socket is
 * connected), for sock_connect_for's reason. The message is copied out of
 * the tracee (its data, and its descriptors under SCM_RIGHTS duplicated
 * into the tracer). stream: a stream socket, whose send may be short (at
 * most SEND_MAX bytes are copied); a longer datagram is EMSGSIZE. A
 * receiver's SCM_CREDENTIALS check sees the tracer as the sender
 * (keep_control); acts_on says on which sockets the tracer sends at all.
 * Returns the bytes sent or -errno. */
int64_t sock_send_for(const struct bound_socks *b, pid_t tid, int sock, const uint64_t *a,
                      int is_sendto, int stream, const struct sock_dest *d, int *refused)
{
    *refused = 0;
    struct msghdr tm;                       /* the tracee's, pointers into its memory */
    memset(&tm, 0, sizeof tm);
    int flags;
    struct iovec one;
    if (is_sendto) {
        one = (struct iovec){ (void *)(uintptr_t)a[1], (size_t)a[2] };
        tm.msg_iov = &one;
        tm.msg_iovlen = 1;
        flags = (int)a[3];
    } else {
        if (tracee_read(tid, a[1], &tm, sizeof tm) < 0)
            return -EFAULT;
        flags = (int)a[2];
    }
    if (tm.msg_iovlen > IOV_MAX_ || tm.msg_controllen > CONTROL_MAX)
        return tm.msg_iovlen > IOV_MAX_ ? -EMSGSIZE : -ENOBUFS;
    /* MSG_ZEROCOPY would send from the tracer's own buffer after the call,
     * which it frees and reuses: the command read caper's heap (adv10a 03).
     * ENOBUFS is the kernel's answer when it cannot pin pages; callers then
     * send a copy. Flags beyond the plain send's are not passed on. */
    if (flags & MSG_ZEROCOPY)
        return -ENOBUFS;
    flags &= MSG_OOB | MSG_DONTROUTE | MSG_DONTWAIT | MSG_EOR | MSG_MORE | MSG_NOSIGNAL |
             MSG_CONFIRM;
    struct sockaddr_un path;
    const struct sockaddr *name;
    socklen_t namelen;
    int target;
    int64_t r = dest_name(b, tid, d, &path, &name, &namelen, &target, refused);
    if (r < 0)
        return r;
    struct iovec *iov = is_sendto ? &one : calloc(tm.msg_iovlen ? tm.msg_iovlen : 1, sizeof *iov);
    char *data = NULL, *control = NULL;
    int taken[SCM_MAX_FD_];
    size_t n_taken = 0;
    if (!iov) {
        r = -ENOMEM;
        goto out;
    }
    if (!is_sendto && tm.msg_iovlen &&
        tracee_read(tid, (uint64_t)(uintptr_t)tm.msg_iov, iov, tm.msg_iovlen * sizeof *iov) < 0) {
        r = -EFAULT;
        goto out;
    }
    size_t total = 0, n_iov = tm.msg_iovlen;
    for (size_t i = 0; i < n_iov; i++) {
        if (iov[i].iov_len > SEND_MAX - total) {
            if (!stream) {
                r = -EMSGSIZE;
                goto out;
            }
            iov[i].iov_len = SEND_MAX - total;  /* a short send, as a full buffer makes */
            n_iov = i + 1;
        }
        total += iov[i].iov_len;
    }
    data = malloc(total ? total : 1);
    control = malloc(tm.msg_controllen ? tm.msg_controllen : 1);
    if (!data || !control) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0, at = 0; i < n_iov; at += iov[i].iov_len, i++) {
        if (iov[i].iov_len &&
            tracee_read(tid, (uint64_t)(uintptr_t)iov[i].iov_base, data + at, iov[i].iov_len) < 0) {
            r = -EFAULT;
            goto out;
        }
    }
    struct iovec whole = { data, total };
    struct msghdr m = { .msg_name = (void *)name, .msg_namelen = namelen, .msg_iov = &whole,
                        .msg_iovlen = 1, .msg_control = tm.msg_controllen ? control : NULL,
                        .msg_controllen = tm.msg_controllen };
    if (tm.msg_controllen &&
        tracee_read(tid, (uint64_t)(uintptr_t)tm.msg_control, control, tm.msg_controllen) < 0) {
        r = -EFAULT;
        goto out;
    }
    if ((r = acts_on(sock, data, total, d)) < 0) {
        *refused = 1;
        goto out;
    }
    if ((r = keep_control(&m)) < 0 ||
        (r = take_rights(tid, &m, taken, sizeof taken / sizeof *taken, &n_taken)) < 0)
        goto out;
    struct send_timeout keep;
    bound_send_timeout(sock, &keep);
    ssize_t sent = sendmsg(sock, &m, flags | MSG_NOSIGNAL);
    r = sent < 0 ? -errno : sent;
    restore_send_timeout(sock, &keep);
    if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
        syscall(SYS_tkill, tid, SIGPIPE);   /* what the kernel's own send would raise */
out:
    for (size_t i = 0; i < n_taken; i++)
        close(taken[i]);
    if (iov != &one)
        free(iov);
    free(data);
    free(control);
    if (target >= 0)
        close(target);
    return r;
}

/* A unix path a sandbox process bound? (For reports only: what is sent is
 * checked on an open descriptor, see open_checked_socket.) */
int unix_bound_here(const struct bound_socks *b, pid_t tid, const char *raw)
{
    struct sock_id id;
    return unix_identity(tid, raw, 1, &id) == 0 && is_bound(b, &id);
}
