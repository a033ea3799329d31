/* internal.h: what the C files share with each other, not with Python. */
#ifndef CAPER_INTERNAL_H
#define CAPER_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/socket.h>
#include "caper.h"

#define CAPER_PATH_MAX 4096

/* ---- failure reporting: every failure names the call, its object, errno --- */

/* Filled in by the failing step; copied into caper_result. */
struct caper_failure {
    uint32_t step;
    int32_t err;
    char detail[256];
};

/* Record a failure: saves errno first, then formats "call(object)". */
void fail_set(struct caper_failure *f, uint32_t step, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- syscall table (sysent.c) ------------------------------------------- */

/* How the tracer decodes a trapped call. */
enum decode {
    DEC_PATHS = 1,    /* up to two (dirfd, path) pairs, flags, mode, two plain args */
    DEC_FD,           /* the object is an fd: its path comes from /proc */
    DEC_OPENAT2,      /* openat2: flags and mode from struct open_how */
    DEC_EXEC,         /* execve/execveat: path and bounded argv */
    DEC_SOCKADDR,     /* connect/bind/sendto: decode the sockaddr */
    DEC_MSGHDR,       /* sendmsg: the sockaddr inside struct msghdr */
    DEC_MMSGHDR,      /* sendmmsg: the first message's sockaddr */
    DEC_SIGNAL,       /* kill family: target and signal */
    DEC_CWD,          /* chdir/fchdir: forget the cached cwd, report nothing */
    DEC_REFUSE,       /* refuse with EPERM and report */
    DEC_REFUSE_NS,    /* clone/unshare with namespace flags: refuse and report */
    DEC_FALLOCATE,    /* fallocate: refused (ENOSPC) past the run's disk budget */
    DEC_AFFINITY,     /* sched_setaffinity: held inside caper's CPU pin, as a cpuset would */
    DEC_LOCK,         /* flock, fcntl's lock commands: refused (ENOLCK) on a host inode */
    DEC_USER_OBJECT   /* inotify_init, fanotify_init: a kernel object its user has few of,
                         host-wide: refused (EMFILE) past the run's share */
};

/* What the seccomp filter does before the tracer sees anything. */
enum filter {
    FL_TRACE = 1,        /* always stop */
    FL_SKIP_IF_FLAG,     /* allow when (arg & filter_value) != 0 and (arg & filter_unless)
                            == 0, else stop */
    FL_SKIP_IF_NULL,     /* allow when arg == 0, else stop */
    FL_TRACE_IF_FLAG,    /* stop when (arg & filter_value) != 0, else allow */
    FL_ENOSYS,           /* fail with ENOSYS without stopping (clone3: libc falls back) */
    FL_FAMILY,           /* allow when arg is a family a network namespace holds, else
                            EAFNOSUPPORT without stopping */
    FL_IOCTL,            /* an ioctl request refused (preallocating, inode flags, verity,
                            fscrypt, btrfs's but clones): EOPNOTSUPP without stopping,
                            else allow */
    FL_LOCK_CMD          /* an fcntl command that takes a lock or a lease: stop, else allow */
};

struct sysent {
    uint32_t nr;
    const char *name;
    uint8_t kind;        /* enum caper_event_kind; 0 for internal bookkeeping */
    uint8_t decode;      /* enum decode */
    uint8_t filter;      /* enum filter */
    int8_t filter_arg;
    uint32_t filter_value;
    uint32_t filter_unless;
    int8_t dirfd, path;  /* argument indexes, -1 for none (dirfd -1 = cwd) */
    int8_t dirfd2, path2;
    int8_t flags, mode;
    int8_t a0, a1;       /* plain integer arguments copied to arg0/arg1 */
    uint32_t fixed_flags; /* flags implied by the call (creat: O_CREAT|O_WRONLY|O_TRUNC) */
};

extern const struct sysent caper_sysent[];
extern const size_t caper_n_sysent;

/* ---- seccomp (seccomp.c) ------------------------------------------------ */

/* Build the filter program into prog (capacity cap); returns its length or -1. */
int seccomp_build(void *prog, size_t cap);
/* Install it in the calling process (needs no_new_privs). */
int seccomp_install(struct caper_failure *f);

/* ---- event emission (emit.c) -------------------------------------------- */

struct emitter {
    int fd;
    char *buf;
    size_t len, cap;
    uint64_t seq;
    uint64_t t0_ns;
    uint64_t events;
    uint64_t bytes;    /* of the records sent */
    int failed_errno;  /* write to the pipe failed: the reader is gone */
    uint64_t *published; /* where each new seq is stored for other threads, or NULL */
};

/* An event under construction: the fixed header plus up to three strings. */
struct ev {
    struct caper_event h;
    const char *s[3];
    size_t n[3];
};

int emitter_init(struct emitter *e, int fd);
void emitter_free(struct emitter *e);
/* Append the event; returns its seq, 0 if the reader is gone. */
uint64_t emit(struct emitter *e, struct ev *ev);
int emit_flush(struct emitter *e);
uint64_t now_ns(void);
/* A 64-bit hash of the event's identity (everything but pid, seq, time). */
uint64_t ev_hash(const struct ev *ev);

/* ---- output capture (output.c) ------------------------------------------ */

struct output_stream {
    int fd;             /* read end, -1 once at EOF */
    char *head, *tail;
    uint32_t head_cap, tail_cap;
    uint32_t head_len;
    uint64_t total;
};

struct watcher {
    struct output_stream out, err;
    uint64_t deadline_ns;   /* 0: none */
    const char *disk_path;  /* NULL: no disk guard */
    uint64_t disk_min_free, disk_min_inodes;
    pid_t kill_pid;         /* the sandbox's init (host pid) */
    volatile int timed_out;
    volatile int disk_full;
    volatile int stop;      /* set by the tracer when the run is over */
    int wake_fd[2];         /* the tracer writes here to stop the watcher early */
    int poll_errno;
};

int watcher_start(struct watcher *w, void **thread);
void watcher_join(struct watcher *w, void *thread);
void output_export(struct output_stream *s, struct caper_output *o);

/* ---- sandbox spawn (ns.c, mount.c) -------------------------------------- */

struct spawn {
    pid_t init_pid;        /* host pid of the sandbox's pid 1 */
    int status_fd;         /* read end: setup/exec failures from inside */
    int out_fd, err_fd;    /* read ends of the held output */
};

/* Start the sandbox: its init is seized by the calling thread with the trace
 * options and released; the command follows as its child. */
int spawn_sandbox(const struct caper_config *c, struct spawn *s, struct caper_failure *f);

/* Inside the sandbox, as its init: mounts, /proc, /dev, /sys. */
int mount_setup(const struct caper_config *c, struct caper_failure *f);

/* Messages from inside the sandbox on the status pipe. */
struct status_msg {
    uint32_t step;
    int32_t err;
    char detail[200];
};

/* ---- the trace loop (trace.c) ------------------------------------------- */

int trace_loop(const struct caper_config *c, struct spawn *s, struct emitter *e,
               struct watcher *w, struct caper_result *r, struct caper_failure *f);

/* ---- acting for the tracee on unix sockets (unixsock.c) ---------------- */

/* A unix socket file, by identity: a path can be swapped for a symlink. */
struct sock_id {
    dev_t dev;
    ino_t ino;
    int64_t ctime_sec;   /* when the file was made (for bind, see trace.c) */
};

/* The unix sockets bound inside the sandbox: the only ones it may reach. */
struct bound_socks {
    struct sock_id *v;
    size_t n, cap;
};

/* A tracee's descriptor duplicated into the tracer (pidfd_getfd), or -1. */
int tracee_fd(pid_t tid, uint64_t fd);
/* The identity of the unix socket file the tracee names (follow: a final
 * symlink). 0, or -errno (-ECONNREFUSED: no socket of the sandbox's). */
int unix_identity(pid_t tid, const char *raw, int follow, struct sock_id *id);
void unix_add_bound(struct bound_socks *b, const struct sock_id *id);
/* 1 if raw names a socket a sandbox process bound (for reports only). */
int unix_bound_here(const struct bound_socks *b, pid_t tid, const char *raw);
/* Where a call the tracer makes for the tracee goes: a unix path (raw, as
 * the tracee wrote it), else the address as copied (len 0: none). */
struct sock_dest {
    const char *raw;
    struct sockaddr_storage addr;
    socklen_t len;
};
/* connect() and sendto/sendmsg(a), done by the tracer for tid on its pinned
 * socket sock: the result the tracee gets (0 / bytes, or -errno). *refused
 * is set when a unix path is refused (a host socket, or unsafe to resolve). */
int sock_connect_for(const struct bound_socks *b, pid_t tid, int sock, const struct sock_dest *d,
                     int *refused);
int64_t sock_send_for(const struct bound_socks *b, pid_t tid, int sock, const uint64_t *a,
                      int is_sendto, int stream, const struct sock_dest *d, int *refused);

/* ---- acting for the tracee on names (names.c) --------------------------- */

/* A link or rename (any form) the tracer does for a tracee. */
struct name_call {
    int is_link;
    int dirfd[2];          /* the tracee's dirfds (AT_FDCWD: its cwd) */
    const char *raw[2];    /* the names, as the tracer copied them */
    uint32_t flags;        /* linkat's AT_*, renameat2's RENAME_* */
};
/* Does it for tid: 0 or -errno, the result the tracee gets. paths gets the
 * source name (0), the new name (1) and what the source really is (2) as
 * acted on ("" when unknown). *refused: a name could not be found safely. */
int64_t name_call_for(pid_t tid, const struct name_call *nc, char paths[3][CAPER_PATH_MAX],
                      int *refused);

/* ---- paths (paths.c) ---------------------------------------------------- */

/* Read a NUL-terminated string from the tracee, page by page. Returns its
 * length, or -1 (errno set). Sets *truncated when it did not fit. */
ssize_t tracee_read_str(pid_t tid, uint64_t addr, char *buf, size_t cap, int *truncated);
ssize_t tracee_read(pid_t tid, uint64_t addr, void *buf, size_t n);
/* Join base and rel, then fold ".", ".." and "//" lexically into out. */
size_t path_join_normalize(const char *base, const char *rel, char *out, size_t cap);
/* readlink of /proc/<tid>/<what>; returns length or -1. */
ssize_t proc_link(pid_t tid, const char *what, char *buf, size_t cap);
/* Open (O_PATH) what the tracee tid means by (dirfd, raw), resolved strictly
 * inside its root: a descriptor, or -errno for the tracee; *refused is set
 * when the name cannot be resolved safely (the call is then refused,
 * -EACCES). follow: follow a final symlink, as connect does. */
int tracee_open(pid_t tid, int dirfd, const char *raw, int follow, int *refused);
/* The directory tid's relative names start from (its cwd for AT_FDCWD, else
 * the directory its dirfd is), opened O_PATH; -1 with errno set. */
int tracee_start(pid_t tid, int dirfd);
/* The path of the object tracee_open finds, with every symlink resolved, as
 * the host prints it (for a pivoted sandbox: its own view). Length, or -1
 * with errno set (ENOENT: the name does not exist; EACCES: unsafe to find). */
/* credstop.c: 1 if the set's check says a call reaching name stops the run. */
int credential_stop(const struct caper_credentials *set, const char *name, int below);
ssize_t tracee_real_path(pid_t tid, int dirfd, const char *raw, int follow, char *out, size_t cap);
/* 1 if the object fd is on a mount of tid's mount namespace. */
int in_mount_ns_of(pid_t tid, int fd);
/* 1 if openat2 with RESOLVE_IN_ROOT works here (Linux 5.6+). */
int have_openat2(void);

#endif
