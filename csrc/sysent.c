/* sysent.c: the syscalls caper stops on, how to filter and decode each.
 * The seccomp filter is generated from this table (seccomp.c); a syscall
 * not listed here never stops the tracee. */
#include "internal.h"
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <linux/seccomp.h>

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

/* Namespace flags that clone() and unshare() may not use inside the sandbox
 * (and CLONE_UNTRACED, with which a child would escape the tracer).
 * CLONE_NEWTIME (0x80) is only checked for unshare: in clone() that bit is
 * part of the exit signal. */
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | \
                  CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
#define NS_FLAGS_UNSHARE (NS_FLAGS | 0x80)
/* O_TMPFILE is __O_TMPFILE | O_DIRECTORY; the bit of its own: */
#define TMPFILE_ONLY (O_TMPFILE & ~O_DIRECTORY)

#define N -1
/* Path calls: ENT(nr, kind, dirfd, path, dirfd2, path2, flags, mode, a0, a1) */
#define P(sys, k, d, p, d2, p2, fl, md, x0, x1) \
    { SYS_##sys, #sys, CAPER_EV_##k, DEC_PATHS, FL_TRACE, N, 0, 0, d, p, d2, p2, fl, md, x0, x1, 0 }
#define FD(sys, k, fdarg, md, x0, x1) \
    { SYS_##sys, #sys, CAPER_EV_##k, DEC_FD, FL_TRACE, N, 0, 0, fdarg, N, N, N, N, md, x0, x1, 0 }
#define NET(sys, k, dec, filt, farg) \
    { SYS_##sys, #sys, CAPER_EV_##k, dec, filt, farg, 0, 0, 0, N, N, N, N, N, N, N, 0 }
#define SIG(sys, target, sig) \
    { SYS_##sys, #sys, CAPER_EV_SIGNAL, DEC_SIGNAL, FL_TRACE, N, 0, 0, N, N, N, N, N, N, target, sig, 0 }
/* Not in every libc's headers: */
#define SYS_statmount_ 457        /* Linux 6.8 */
#define SYS_listmount_ 458        /* Linux 6.8 */
#define SYS_open_tree_attr_ 467   /* Linux 6.15 */
#define SYS_file_setattr_ 469     /* Linux 6.17 */
#define REFUSE(sys) \
    { SYS_##sys, #sys, CAPER_EV_REFUSED, DEC_REFUSE, FL_TRACE, N, 0, 0, N, N, N, N, N, N, N, N, 0 }

const struct sysent caper_sysent[] = {
    /* Opens of directories only list names: let them through unstopped. But
     * O_TMPFILE carries the O_DIRECTORY bit and makes a file: stop on it. */
    { SYS_open, "open", CAPER_EV_OPEN, DEC_PATHS, FL_SKIP_IF_FLAG, 1, O_DIRECTORY, TMPFILE_ONLY,
      N, 0, N, N, 1, 2, N, N, 0 },
    { SYS_openat, "openat", CAPER_EV_OPEN, DEC_PATHS, FL_SKIP_IF_FLAG, 2, O_DIRECTORY, TMPFILE_ONLY,
      0, 1, N, N, 2, 3, N, N, 0 },
    { SYS_creat, "creat", CAPER_EV_OPEN, DEC_PATHS, FL_TRACE, N, 0, 0,
      N, 0, N, N, N, 1, N, N, O_CREAT | O_WRONLY | O_TRUNC },
    { SYS_openat2, "openat2", CAPER_EV_OPEN, DEC_OPENAT2, FL_TRACE, N, 0, 0,
      0, 1, N, N, N, N, N, N, 0 },
    P(unlink,     UNLINK,   N, 0, N, N, N, N, N, N),
    P(unlinkat,   UNLINK,   0, 1, N, N, 2, N, N, N),   /* AT_REMOVEDIR: rmdir */
    P(rmdir,      RMDIR,    N, 0, N, N, N, N, N, N),
    P(rename,     RENAME,   N, 0, N, 1, N, N, N, N),
    P(renameat,   RENAME,   0, 1, 2, 3, N, N, N, N),
    P(renameat2,  RENAME,   0, 1, 2, 3, 4, N, N, N),
    P(link,       LINK,     N, 0, N, 1, N, N, N, N),
    P(linkat,     LINK,     0, 1, 2, 3, 4, N, N, N),
    /* symlink: arg 0 is the link's text, kept as written, not resolved. */
    P(symlink,    SYMLINK,  N, N, N, 1, N, N, N, N),
    P(symlinkat,  SYMLINK,  N, N, 1, 2, N, N, N, N),
    P(truncate,   TRUNCATE, N, 0, N, N, N, N, 1, N),
    FD(ftruncate, TRUNCATE, 0, N, 1, N),
    P(chmod,      CHMOD,    N, 0, N, N, N, 1, N, N),
    FD(fchmod,    CHMOD,    0, 1, N, N),
    P(fchmodat,   CHMOD,    0, 1, N, N, N, 2, N, N),
    P(fchmodat2,  CHMOD,    0, 1, N, N, 3, 2, N, N),
    P(chown,      CHOWN,    N, 0, N, N, N, N, 1, 2),
    P(lchown,     CHOWN,    N, 0, N, N, N, N, 1, 2),
    FD(fchown,    CHOWN,    0, N, 1, 2),
    P(fchownat,   CHOWN,    0, 1, N, N, 4, N, 2, 3),
    P(mkdir,      MKDIR,    N, 0, N, N, N, 1, N, N),
    P(mkdirat,    MKDIR,    0, 1, N, N, N, 2, N, N),
    P(mknod,      MKNOD,    N, 0, N, N, N, 1, 2, N),
    P(mknodat,    MKNOD,    0, 1, N, N, N, 2, 3, N),
    { SYS_execve, "execve", CAPER_EV_EXEC, DEC_EXEC, FL_TRACE, N, 0, 0,
      N, 0, N, N, N, N, 1, N, 0 },      /* a0: the argv pointer's index */
    { SYS_execveat, "execveat", CAPER_EV_EXEC, DEC_EXEC, FL_TRACE, N, 0, 0,
      0, 1, N, N, 4, N, 2, N, 0 },
    /* Only the families the sandbox's network namespace holds. */
    { SYS_socket, "socket", 0, DEC_REFUSE, FL_FAMILY, 0, 0, 0, N, N, N, N, N, N, N, N, 0 },
    { SYS_socketpair, "socketpair", 0, DEC_REFUSE, FL_FAMILY, 0, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    NET(connect,  CONNECT, DEC_SOCKADDR, FL_TRACE, N),
    NET(bind,     BIND,    DEC_SOCKADDR, FL_TRACE, N),
    /* sendto without a destination goes where connect() already went. */
    NET(sendto,   SENDTO,  DEC_SOCKADDR, FL_SKIP_IF_NULL, 4),
    NET(sendmsg,  SENDTO,  DEC_MSGHDR,   FL_TRACE, N),
    NET(sendmmsg, SENDTO,  DEC_MMSGHDR,  FL_TRACE, N),
    SIG(kill,              0, 1),
    SIG(tkill,             0, 1),
    SIG(tgkill,            1, 2),
    SIG(rt_sigqueueinfo,   0, 1),
    SIG(rt_tgsigqueueinfo, 1, 2),
    SIG(pidfd_send_signal, N, 1),
    { SYS_chdir, "chdir", 0, DEC_CWD, FL_TRACE, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
    { SYS_fchdir, "fchdir", 0, DEC_CWD, FL_TRACE, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
    /* New namespaces would give the command capabilities over a world of its own. */
    { SYS_clone, "clone", CAPER_EV_REFUSED, DEC_REFUSE_NS, FL_TRACE_IF_FLAG, 0,
      NS_FLAGS | CLONE_UNTRACED, 0,
      N, N, N, N, 0, N, N, N, 0 },
    { SYS_unshare, "unshare", CAPER_EV_REFUSED, DEC_REFUSE_NS, FL_TRACE_IF_FLAG, 0,
      NS_FLAGS_UNSHARE, 0, N, N, N, N, 0, N, N, N, 0 },
    /* A filter of the command's own that answers with SECCOMP_RET_USER_NOTIF
     * outranks caper's RET_TRACE: its listener could let calls run unseen. */
    { SYS_seccomp, "seccomp", CAPER_EV_REFUSED, DEC_REFUSE, FL_TRACE_IF_FLAG, 1,
      SECCOMP_FILTER_FLAG_NEW_LISTENER, 0, N, N, N, N, N, N, N, N, 0 },
    /* clone3 passes its flags in memory the filter cannot read: ENOSYS makes
     * libc fall back to clone(), whose flags it can. */
    { SYS_clone3, "clone3", 0, DEC_REFUSE, FL_ENOSYS, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
    /* Native AIO contexts are reserved from one host-wide pool (fs.aio-nr up
     * to fs.aio-max-nr): a run could take it all from the host's databases.
     * ENOSYS, as on a kernel without AIO: libaio's users fall back to threads. */
    { SYS_io_setup, "io_setup", 0, DEC_REFUSE, FL_ENOSYS, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
    /* fallocate takes any amount of space in one call, faster than the disk
     * guard's poll: the tracer holds it to the run's budget. */
    { SYS_fallocate, "fallocate", CAPER_EV_REFUSED, DEC_FALLOCATE, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    /* ...and so would the ioctls that preallocate (FS_IOC_RESVSP64, ZERO_RANGE);
     * those that set inode flags, verity, fscrypt policies and keys, and
     * btrfs's subvolume ioctls change what the report cannot show: refused
     * in the filter (seccomp.c), other ioctls pass unstopped. */
    { SYS_ioctl, "ioctl", 0, DEC_REFUSE, FL_IOCTL, 1, 0, 0, N, N, N, N, N, N, N, N, 0 },
    /* Locks are per inode: one taken through a read-only bind of a host mount
     * (or on a device node bound from the host's /dev) is the host's, and
     * would hold off host processes and other runs. Overlay files are the
     * overlay's own inodes. fcntl stops only for its lock and lease commands. */
    /* inotify instances and fanotify groups are counted per user across the
     * host (128 each by default): a run takes a few, not its user's all. */
    { SYS_inotify_init, "inotify_init", CAPER_EV_REFUSED, DEC_USER_OBJECT, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    { SYS_inotify_init1, "inotify_init1", CAPER_EV_REFUSED, DEC_USER_OBJECT, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    { SYS_fanotify_init, "fanotify_init", CAPER_EV_REFUSED, DEC_USER_OBJECT, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    { SYS_flock, "flock", CAPER_EV_REFUSED, DEC_LOCK, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    { SYS_fcntl, "fcntl", CAPER_EV_REFUSED, DEC_LOCK, FL_LOCK_CMD, 1, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    /* The sandbox shares the tracer's CPU: a wider mask must not undo that. */
    { SYS_sched_setaffinity, "sched_setaffinity", 0, DEC_AFFINITY, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    /* Calls that could undo the sandbox or act outside it. */
    REFUSE(mount), REFUSE(umount2), REFUSE(pivot_root), REFUSE(setns),
    REFUSE(open_by_handle_at), REFUSE(init_module), REFUSE(finit_module),
    REFUSE(delete_module), REFUSE(kexec_load), REFUSE(kexec_file_load), REFUSE(bpf),
    /* io_uring performs file and network operations the tracer never sees. */
    REFUSE(io_uring_setup), REFUSE(io_uring_enter), REFUSE(io_uring_register),
    REFUSE(open_tree), REFUSE(move_mount), REFUSE(fsopen), REFUSE(fsconfig),
    REFUSE(fsmount), REFUSE(fspick), REFUSE(mount_setattr),
    /* Every sandbox process is already traced by caper: nothing to attach to. */
    REFUSE(ptrace),
    /* Kernel keyrings, perf and userfaultfd reach state shared with the host. */
    REFUSE(keyctl), REFUSE(add_key), REFUSE(request_key), REFUSE(perf_event_open),
    REFUSE(userfaultfd), REFUSE(swapon), REFUSE(swapoff), REFUSE(reboot), REFUSE(acct),
    REFUSE(quotactl), REFUSE(quotactl_fd),
    /* A pidfd names a process whatever its pid namespace: one of a host
     * process (a receiver's SCM_PIDFD, a peer's SO_PEERPIDFD) would hand its
     * descriptors or memory over. */
    REFUSE(pidfd_getfd), REFUSE(process_madvise), REFUSE(process_mrelease),
    { SYS_open_tree_attr_, "open_tree_attr", CAPER_EV_REFUSED, DEC_REFUSE, FL_TRACE, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    /* file_setattr sets the inode flags FS_IOC_FSSETXATTR would (refused in the
     * filter); statmount and listmount may name another mount namespace than
     * the sandbox's. ENOSYS, as on an older kernel: tools fall back to the
     * ioctl or to /proc. */
    { SYS_file_setattr_, "file_setattr", 0, DEC_REFUSE, FL_ENOSYS, N, 0, 0,
      N, N, N, N, N, N, N, N, 0 },
    { SYS_statmount_, "statmount", 0, DEC_REFUSE, FL_ENOSYS, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
    { SYS_listmount_, "listmount", 0, DEC_REFUSE, FL_ENOSYS, N, 0, 0, N, N, N, N, N, N, N, N, 0 },
};

const size_t caper_n_sysent = sizeof caper_sysent / sizeof caper_sysent[0];

const char *caper_syscall_name(uint32_t sysno)
{
    for (size_t i = 0; i < caper_n_sysent; i++)
        if (caper_sysent[i].nr == sysno)
            return caper_sysent[i].name;
    return NULL;
}
