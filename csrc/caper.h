/* caper.h: the whole C/Python boundary.
 *
 * This file is read twice: by the C compiler (through caper_native/build.py's
 * set_source) and by cffi's cdef parser. So it holds no #include and no #if,
 * only fixed-width integers, explicit enum values and plain structs; C files
 * include <stdint.h> before it.
 *
 * Data flows one way: Python fills a caper_config, calls caper_run() (the GIL
 * is released for the whole call), reads caper_event records from the event
 * pipe while the command runs, and gets a caper_result when it returns.
 */

/* Event kinds. Python reads these names from lib and never types the numbers. */
enum caper_event_kind {
    CAPER_EV_PROC_START = 1,  /* a new process or thread: pid, ppid, arg0 = clone flags */
    CAPER_EV_EXEC       = 2,  /* execve: path, argv (NUL separated, bounded) */
    CAPER_EV_PROC_EXIT  = 3,  /* arg0 = exit code (>= 0) or -signal */
    CAPER_EV_OPEN       = 4,  /* path, flags, mode; string 3: what a read open opened (the
                                 fd's path, symlinks resolved); arg1 = st_rdev with
                                 CAPER_INFO_DEVICE */
    CAPER_EV_UNLINK     = 5,  /* path */
    CAPER_EV_RMDIR      = 6,  /* path */
    CAPER_EV_RENAME     = 7,  /* path -> path2, flags; string 3: what path really is (symlinks
                                 resolved inside the sandbox) */
    CAPER_EV_LINK       = 8,  /* hard link: path (existing) -> path2 (new); string 3 as rename */
    CAPER_EV_SYMLINK    = 9,  /* path2 (new link) holds text path (not resolved) */
    CAPER_EV_TRUNCATE   = 10, /* path, arg0 = length */
    CAPER_EV_CHMOD      = 11, /* path, mode */
    CAPER_EV_CHOWN      = 12, /* path, arg0 = uid, arg1 = gid (-1: unchanged) */
    CAPER_EV_MKDIR      = 13, /* path, mode */
    CAPER_EV_MKNOD      = 14, /* path, mode, arg0 = dev */
    CAPER_EV_CONNECT    = 15, /* address: family, path = address text, arg0 = port,
                                 mode = socket type | protocol << 8 (0: unknown); inet:
                                 arg1 = the socket's inode (who a proxy's peer is) */
    CAPER_EV_SENDTO     = 16, /* same as connect; sendto and sendmsg with a destination */
    CAPER_EV_BIND       = 17, /* same as connect */
    CAPER_EV_SIGNAL     = 18, /* arg0 = target pid as the sandbox names it, arg1 = signal */
    CAPER_EV_REFUSED    = 19, /* a syscall caper refused: sysno, arch, flags = caper_refusal */
    CAPER_EV_REPEAT     = 20, /* arg0 = seq of an earlier event of this pid, count = extra repeats */
    CAPER_EV_NOISE      = 21, /* per-process totals of dropped noise: count */
    CAPER_EV_LOST       = 22  /* arg0 = events the C side could not describe (path unreadable ...) */
};

/* Why a syscall was refused (CAPER_EV_REFUSED.flags). */
enum caper_refusal {
    CAPER_REFUSE_DENYLIST    = 1, /* mount, pivot_root, bpf, io_uring_setup ... */
    CAPER_REFUSE_ABI         = 2, /* 32-bit (int 0x80) or x32 syscall */
    CAPER_REFUSE_HOST_SOCKET = 3, /* connect() to a unix socket no sandbox process bound */
    CAPER_REFUSE_NAMESPACE   = 4, /* clone/unshare asking for new namespaces, or
                                     clone(CLONE_UNTRACED), which would leave the tracer */
    CAPER_REFUSE_DISK_BUDGET = 5, /* fallocate() past what the upper layers may still take
                                     (failed with ENOSPC, as a full filesystem would) */
    CAPER_REFUSE_HOST_LOCK   = 6, /* flock()/fcntl() lock or lease on a file the sandbox
                                     shares with the host: a read-only bind of a host
                                     mount, a device node bound from the host's /dev
                                     (failed with ENOLCK) */
    CAPER_REFUSE_USER_LIMIT  = 7, /* an inotify or fanotify instance past the run's share
                                     of its user's (fs.inotify.max_user_instances ...,
                                     counted per user, host-wide): failed with EMFILE */
    CAPER_REFUSE_HOST_FIFO   = 8  /* an open of a FIFO on a read-only mount: a bind of a
                                     host mount, where the pipe is a host process's
                                     (failed with EACCES; one reached by a rename race
                                     after the check ends the run) */
};

/* Address families in network events (CAPER_EV_CONNECT/SENDTO/BIND.flags). */
enum caper_family {
    CAPER_AF_OTHER    = 0,
    CAPER_AF_INET     = 2,
    CAPER_AF_INET6    = 10,
    CAPER_AF_UNIX     = 1,
    CAPER_AF_ABSTRACT = 100, /* unix, abstract name: path starts after a '@' */
    CAPER_AF_NETLINK  = 16
};

/* How a run ended (caper_result.end). */
enum caper_end {
    CAPER_END_EXITED       = 1, /* the command exited: exit_code */
    CAPER_END_SIGNALED     = 2, /* the command died of term_signal */
    CAPER_END_TIMEOUT      = 3, /* wall-clock limit hit; the sandbox was killed */
    CAPER_END_PIDS_LIMIT   = 4, /* too many processes; the sandbox was killed */
    CAPER_END_SETUP_FAILED = 5, /* failed before exec: step + err say where */
    CAPER_END_EXEC_FAILED  = 6, /* the command could not be executed: err */
    CAPER_END_TRACE_FAILED = 7, /* the tracer lost control; the sandbox was killed */
    CAPER_END_MEMORY_LIMIT = 8, /* set by Python: the memory cgroup killed a process */
    CAPER_END_DISK_LIMIT   = 9, /* the upper layers' filesystem ran low; the sandbox was killed */
    CAPER_END_EVENT_LIMIT  = 10, /* the run cost caper more events or bytes than max_events or
                                   max_event_bytes; the sandbox was killed */
    CAPER_END_CREDENTIAL   = 11 /* a call would have given the command a credential
                                   (caper_config.stop_at): the sandbox was killed with
                                   the caller stopped in that call, before it returned */
};

/* Where a failure happened (caper_result.step). Python maps each to an exception. */
enum caper_step {
    CAPER_STEP_NONE          = 0,
    CAPER_STEP_PIPE          = 1,
    CAPER_STEP_CLONE         = 2,
    CAPER_STEP_USERNS_MAP    = 3,
    CAPER_STEP_MOUNT_PRIVATE = 4,
    CAPER_STEP_MOUNT_PROC    = 5,
    CAPER_STEP_MOUNT_DEV     = 6,
    CAPER_STEP_MOUNT_SYS     = 7,
    CAPER_STEP_LOOPBACK      = 8,
    CAPER_STEP_CGROUP        = 9,
    CAPER_STEP_CAPS          = 10,
    CAPER_STEP_NO_NEW_PRIVS  = 11,
    CAPER_STEP_SECCOMP       = 12,
    CAPER_STEP_SEIZE         = 13,
    CAPER_STEP_CHDIR         = 14,
    CAPER_STEP_EXEC          = 15,
    CAPER_STEP_WAIT          = 16,
    CAPER_STEP_EMIT          = 17,
    CAPER_STEP_OUTPUT        = 18,
    CAPER_STEP_RLIMIT        = 19,
    CAPER_STEP_CONFIG        = 20,
    CAPER_STEP_MOUNT_ROOT    = 21,
    CAPER_STEP_PIVOT_ROOT    = 22,
    CAPER_STEP_ROOT_VIEW     = 23, /* caper's / is not its mount namespace's root (a chroot) */
    CAPER_STEP_CALLER        = 24, /* giving the command its caller's context (caper_caller) */
    CAPER_STEP_PROXY         = 25  /* the proxy's sockets in the sandbox's network */
};

/* Sockets init makes for caper's proxy (caper_config.endpoints): with the two
 * /proc/net files, well below SCM_MAX_FD (253) in one message. */
enum caper_limits {
    CAPER_MAX_ENDPOINTS = 200
};

/* caper_event.info bits: what is uncertain or special about one event. */
enum caper_info {
    CAPER_INFO_RESULT_UNKNOWN = 1, /* the process died inside the call */
    CAPER_INFO_TRUNCATED      = 2, /* a string was cut at its bound */
    CAPER_INFO_UNREADABLE     = 4, /* a string could not be read from the tracee */
    CAPER_INFO_REFUSED        = 8, /* caper refused the call; result is the errno it returned */
    CAPER_INFO_FD_PATH        = 16, /* path was found from a file descriptor, not a string */
    CAPER_INFO_DEVICE         = 32, /* an open reached a device node (or was refused at
                                       one); arg1 is its st_rdev */
    CAPER_INFO_ARGV_CHANGED   = 64, /* exec: the argv the kernel ran (the event's) is not
                                       the one read when the call was checked */
    CAPER_INFO_GIT_ENV        = 256, /* exec: the new image's environment configures git
                                       (GIT_CONFIG*, GIT_DIR, GIT_COMMON_DIR), which its
                                       argv does not show; or it could not be read */
    CAPER_INFO_CODE_ENV       = 512 /* exec: the new image's environment holds a variable
                                       that loads other code (LD_PRELOAD, PYTHONPATH,
                                       GIT_SSH_COMMAND, PIP_*, ...) with a value caper did
                                       not give the command; or it could not be read */
};

/* caper_config.flags */
enum caper_flags {
    CAPER_F_USERNS       = 1, /* make a user namespace (needed when not root) */
    CAPER_F_NO_COLLAPSE  = 2, /* emit repeated identical events one by one */
    CAPER_F_KEEP_NOISE   = 4, /* do not drop baseline noise (the probe itself) */
    CAPER_F_SHARE_CPU    = 16 /* run the tracer and the sandbox on one CPU: a stop then
                                 costs a context switch, not a cross-CPU wake-up */
};

/* caper_noise.kind */
enum caper_noise_kind {
    CAPER_NOISE_EXACT  = 1, /* a read-only open of exactly this path */
    CAPER_NOISE_PREFIX = 2  /* a read-only open of anything below this directory */
};

struct caper_noise {
    uint32_t kind;
    const char *path;
};

/* Mounts the sandbox makes in its own mount namespace, in order, before it
 * moves into new_root (the snapshot layers of caper run; none for caper trace).
 * A mount with a NULL fstype and MS_BIND in flags is a bind mount; with
 * MS_BIND | MS_REMOUNT | MS_REC, the flags (read-only, nosuid, nodev, noexec)
 * are set on the whole tree below target (mount_setattr, AT_RECURSIVE). */
struct caper_mount {
    const char *source;
    const char *target;
    const char *fstype;
    const char *data;
    uint64_t flags;
    uint32_t or_else;   /* 0: a failure fails the set-up. N: the N mounts after this one
                           are its fallback, made only if this one fails (an overlay the
                           kernel refuses becomes a read-only bind) */
    uint32_t pad;
};

/* One resource limit of the caller's (getrlimit). */
struct caper_rlimit {
    uint32_t resource;           /* RLIMIT_* */
    uint32_t pad;
    uint64_t cur;
    uint64_t max;
};
/* The process attributes a command inherits from caper's caller, for a run
 * in another process than the caller's (the gate): set in the command's
 * process just before exec, before caper's own limits. caper/inherit.py is
 * the one definition of what a run inherits; this is the part C applies. */
struct caper_caller {
    uint32_t umask;
    int32_t nice;
    const struct caper_rlimit *rlimits;
    uint32_t n_rlimits;
    uint32_t set_groups;         /* 1: gid and groups replace this process's (root only) */
    uint32_t gid;
    uint32_t n_groups;
    const uint32_t *groups;
};
/* One socket caper serves inside the sandbox's network (caper/sandbox/netproxy.py):
 * the proxy, its DNS and the transparent route's listeners. */
struct caper_endpoint {
    uint32_t addr;               /* IPv4, host byte order */
    uint32_t port;
    uint32_t datagram;           /* 1: UDP (caper's DNS); 0: a TCP listener */
    uint32_t on_lo;              /* 1: addr/32 is first added to lo (it is not in 127/8) */
};
/* Credential locations a run is stopped at (caper_config.stop_at), compiled by
 * Python (caper/report/secrets.py: Protected.stop_globs). The tracer only finds
 * candidates: a name that matches one of globs (or does after one translation)
 * is handed to check, which decides. A glob is matched against the whole
 * absolute path: a backslash quotes the next character, '*' is any run of
 * characters but '/', '?' one such character, '**' any run at all, and '**'
 * followed by '/' is also no directory at all. rooted[i]: globs[i] names a
 * fixed place (a home's, an absolute one), so a directory on its way holds
 * what it names: moving or linking that directory is reaching it. */
struct caper_credentials {
    const char *const *globs;
    const uint8_t *rooted;
    uint32_t n_globs;
    uint32_t n_translations;
    const char *const *translations; /* pairs: a mount point, the path it shows (the
                                        longest first; the first that holds is used) */
    /* Globs below a home (each starts with '/', all rooted), matched after
     * any of homes (globs of home directories) matches a leading part. */
    const char *const *homes;
    const char *const *home_globs;
    uint32_t n_homes;
    uint32_t n_home_globs;
    /* 1: stop the run. name: the path a call would reach, as the host prints it;
     * below: 1 if it is a directory (or a file) a link or rename would give a new
     * name, so what lies below it counts too. Called in the tracer's thread while
     * the calling process waits in its stop. */
    int (*check)(const char *name, uint32_t below);
};

struct caper_config {
    const char *const *argv;     /* NULL terminated; argv[0] is looked up in PATH */
    const char *const *envp;     /* NULL terminated */
    const char *cwd;
    int event_fd;                /* write end of the event pipe; closed by caper_run */
    uint32_t flags;              /* enum caper_flags */
    uint32_t max_pids;           /* 0: no limit. Counted by the tracer: threads too */
    uint64_t max_memory;         /* bytes, RLIMIT_AS per process (when no cgroup); 0: none */
    uint64_t timeout_ms;         /* 0: none */
    const char *const *cgroup_procs; /* cgroup.procs files the sandbox joins, NULL-ended; or NULL */
    const char *hostname;        /* in the new uts namespace */
    const struct caper_noise *noise;
    uint32_t n_noise;
    const struct caper_mount *mounts;
    uint32_t n_mounts;
    const char *new_root;        /* pivot_root here after the mounts; NULL: stay */
    uint32_t argv_max;           /* bytes of argv kept per exec event */
    uint32_t output_head;        /* bytes kept from the start of stdout and of stderr */
    uint32_t output_tail;        /* bytes kept from the end of each */
    int stdin_fd;                /* -1: /dev/null */
    uint64_t not_before_ns;      /* the command starts only once CLOCK_REALTIME_COARSE,
                                    the clock of file ctimes, reaches this; 0: at once */
    const char *disk_path;       /* a path on the filesystem of the upper layers, or NULL */
    uint64_t disk_min_free;      /* bytes that must stay free there, else the sandbox is
                                    killed (CAPER_END_DISK_LIMIT) */
    uint64_t disk_min_inodes;    /* the same for inodes */
    uint64_t shm_size;           /* bytes of the sandbox's /dev/shm (a tmpfs); 0: 64 KiB */
    uint64_t max_events;         /* events sent to Python, else the sandbox is killed
                                    (CAPER_END_EVENT_LIMIT); 0: no limit */
    uint64_t max_event_bytes;    /* the same for the bytes of their records */
    const struct caper_caller *caller; /* NULL: the command inherits this process's */
    int proxy_fd;                /* -1: no proxy. Else a unix socket: init sends on it, under
                                    SCM_RIGHTS, one socket bound in the sandbox's network per
                                    endpoint, in order, then its /proc/net/tcp and udp */
    const struct caper_endpoint *endpoints;
    uint32_t n_endpoints;        /* at most CAPER_MAX_ENDPOINTS */
    const struct caper_credentials *stop_at; /* NULL: never stop at a credential; else
                                    an open for reading (O_PATH too), a link or a
                                    rename that would reach one ends the run
                                    (CAPER_END_CREDENTIAL) in that call */
};

/* Held output of one stream: the first head_len bytes, the last tail_len bytes
 * (which may overlap the head when total is small), and the total count. */
struct caper_output {
    char *head;
    char *tail;
    uint32_t head_len;
    uint32_t tail_len;
    uint64_t total;
};

struct caper_result {
    uint32_t end;          /* enum caper_end */
    int32_t exit_code;     /* CAPER_END_EXITED */
    int32_t term_signal;   /* CAPER_END_SIGNALED */
    uint32_t step;         /* enum caper_step, when something failed */
    int32_t err;           /* errno of the failed step */
    uint32_t peak_pids;
    uint64_t stops;        /* ptrace stops taken */
    uint64_t events;       /* records written to the event pipe */
    uint64_t noise;        /* opens dropped as baseline noise */
    uint64_t collapsed;    /* events folded into repeat counts */
    uint64_t wall_ns;
    struct caper_output out;
    struct caper_output err_out;
    char detail[256];      /* the failed call and its object, e.g. "mount(proc, /proc)" */
    int32_t reap_pid;      /* the sandbox's init when it was still exiting at return: every
                              other process of the sandbox is gone, the kernel is tearing
                              down its namespaces (~1.5 ms); caper_reap() waits for it.
                              0: already reaped */
    uint64_t shm_used;     /* bytes left in the sandbox's /dev/shm when the command ended:
                              memory, discarded with the sandbox, never committed */
    uint64_t emitted_seq;  /* while the run goes: the seq of the last event emitted (stored
                              atomically by the tracer). Every traced call a process
                              finished before this was read has its event at or below it */
};

/* One record on the event pipe. Strings follow the header inside the record
 * and are given by offset (from the start of the record) and length; they are
 * not NUL terminated. len is the whole record, a multiple of 8. */
struct caper_event {
    uint32_t kind;      /* enum caper_event_kind */
    uint32_t len;
    uint32_t pid;       /* host tid of the acting process */
    uint32_t ppid;
    uint64_t seq;       /* 1, 2, ... per run */
    uint64_t time_ns;   /* since the sandbox started */
    int64_t result;     /* syscall return value: >= 0 success, -errno failure */
    int64_t arg0;
    int64_t arg1;
    uint32_t sysno;
    uint32_t arch;      /* AUDIT_ARCH_* of the call */
    uint32_t flags;
    uint32_t mode;
    uint32_t count;     /* 1, or the number of identical events folded in */
    uint32_t str_off[3];
    uint32_t str_len[3];
    uint32_t info;      /* enum caper_info bits */
};

/* The syscall name for a number of the native ABI, or NULL. */
const char *caper_syscall_name(uint32_t sysno);

/* Run a command in the sandbox, tracing it, until it and every process of its
 * sandbox are gone (but for init, which may still be exiting: reap_pid). Returns 0 when the result is filled in (whatever the
 * command did), -1 with the result's step/err/detail when setup failed before
 * the command could start. Always closes config->event_fd. */
int caper_run(const struct caper_config *config, struct caper_result *result);

/* 1 if this kernel can set a bind mount's flags on its whole tree (mount_setattr,
 * Linux 5.12+): what caper_mount's MS_BIND | MS_REMOUNT | MS_REC needs. */
int caper_can_remount_tree(void);

/* Wait, in the thread that called caper_run, for the init it left exiting
 * (result.reap_pid). 0, or -errno. */
int caper_reap(int32_t pid);

/* Whether path is a candidate of set (one of its globs matches it, after the
 * first translation that holds if none does); below: or it is a directory on
 * the way of a rooted glob. 1 or 0. (The tracer's matcher, for tests.) */
int caper_credential_candidate(const struct caper_credentials *set, const char *path,
                               uint32_t below);

/* Free the output buffers of a result. */
void caper_result_free(struct caper_result *result);

/* Write the seccomp program as pseudocode to fd (for --debug). */
int caper_dump_filter(int fd);
