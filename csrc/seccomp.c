/* seccomp.c: the pre-filter, generated from the syscall table.
 *
 * Generated program (classic BPF over struct seccomp_data):
 *
 *   if (arch != AUDIT_ARCH_X86_64) return TRACE(FOREIGN);   // i386 via int 0x80
 *   if (nr >= __X32_SYSCALL_BIT)   return TRACE(FOREIGN);   // x32
 *   for each table entry e:
 *     if (nr == e.nr)
 *       FL_TRACE:         return TRACE(index of e);
 *       FL_SKIP_IF_FLAG:  return (arg & v) && !(arg & u) ? ALLOW : TRACE(e);
 *       FL_SKIP_IF_NULL:  return (arg == 0) ? ALLOW : TRACE(e);
 *       FL_TRACE_IF_FLAG: return (arg & v) ? TRACE(e) : ALLOW;
 *       FL_ENOSYS:        return ERRNO(ENOSYS);
 *   return ALLOW;
 *
 * TRACE's 16-bit data is the table index. The tracer only takes it as a hint,
 * checked against nr: a filter of the command's own runs first and could
 * return any data. Every
 * foreign-ABI call stops, and the tracer refuses it: the table speaks only the
 * native ABI, so nothing may run unseen under another one.
 */
#include "internal.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define X32_SYSCALL_BIT 0x40000000u
#define TRACE_FOREIGN 0xffffu

#define OFF_NR   offsetof(struct seccomp_data, nr)
#define OFF_ARCH offsetof(struct seccomp_data, arch)
#define OFF_ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#define OFF_ARG_HI(i) (OFF_ARG_LO(i) + 4)

struct prog {
    struct sock_filter *insn;
    size_t len, cap;
};

static int put(struct prog *p, uint16_t code, uint8_t jt, uint8_t jf, uint32_t k)
{
    if (p->len >= p->cap)
        return -1;
    p->insn[p->len++] = (struct sock_filter)BPF_JUMP(code, k, jt, jf);
    return 0;
}

#define LD(off)       put(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, (off))
#define RET(v)        put(p, BPF_RET | BPF_K, 0, 0, (v))
#define JEQ(k, t, f)  put(p, BPF_JMP | BPF_JEQ | BPF_K, (t), (f), (k))
#define JGE(k, t, f)  put(p, BPF_JMP | BPF_JGE | BPF_K, (t), (f), (k))
#define JSET(k, t, f) put(p, BPF_JMP | BPF_JSET | BPF_K, (t), (f), (k))

/* Instructions one entry takes after its "nr ==" test (see emit_entry). */
/* The socket families the sandbox's own network namespace holds. Others
 * (AF_VSOCK, which no namespace isolates, and whatever a kernel adds) would
 * reach past it. */
static const uint32_t FAMILIES[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };
#define N_FAMILIES ((int)(sizeof FAMILIES / sizeof *FAMILIES))
/* ioctl requests refused, without a stop. Those that reach vfs_fallocate()
 * (ioctl_preallocate, XFS's ALLOCSP): one call would take any amount of
 * space past the disk budget the tracer holds fallocate() to. Those that
 * change an inode or a filesystem beyond its files' content and modes, which
 * the report cannot show and a discard may not undo: inode flags (chattr +i
 * made a btrfs snapshot's file immutable), fs-verity, fscrypt policies and
 * keys (through a read-only bind they reach the host's filesystem). */
static const uint32_t REFUSED_IOCTLS[] = {
    0x4030580a, 0x4030580b,   /* XFS_IOC_ALLOCSP, XFS_IOC_FREESP */
    0x40305824, 0x40305825,   /* XFS_IOC_ALLOCSP64, XFS_IOC_FREESP64 */
    0x40305828, 0x4030582a,   /* FS_IOC_RESVSP, FS_IOC_RESVSP64 */
    0x40305839,               /* FS_IOC_ZERO_RANGE */
    0x40086602, 0x40046602,   /* FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS */
    0x401c5820,               /* FS_IOC_FSSETXATTR */
    0x40806685,               /* FS_IOC_ENABLE_VERITY */
    0x800c6613,               /* FS_IOC_SET_ENCRYPTION_POLICY */
    0xc0506617, 0xc0406618,   /* FS_IOC_ADD_ENCRYPTION_KEY, FS_IOC_REMOVE_ENCRYPTION_KEY */
    0xc0406619,               /* FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS */
};
#define N_REFUSED ((int)(sizeof REFUSED_IOCTLS / sizeof *REFUSED_IOCTLS))
/* btrfs's ioctls (type 0x94) are refused but for the file clones that
 * share extents (cp --reflink): the others make, snapshot, delete or flag
 * subvolumes, which a run's snapshot must not hold when it is discarded
 * (a read-only one stayed on the host with all the run wrote, adv10a 01). */
#define BTRFS_IOCTL_TYPE 0x9400
static const uint32_t CLONE_IOCTLS[] = {
    0x40049409,               /* FICLONE */
    0x4020940d,               /* FICLONERANGE */
    0xc0189436,               /* FIDEDUPERANGE */
};
#define N_CLONE ((int)(sizeof CLONE_IOCTLS / sizeof *CLONE_IOCTLS))
/* fcntl commands that take a lock or a lease (F_GETLK and the rest pass):
 * F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE. */
static const uint32_t LOCK_CMDS[] = { 6, 7, 37, 38, 1024 };
#define N_LOCK_CMDS ((int)(sizeof LOCK_CMDS / sizeof *LOCK_CMDS))

static int entry_len(const struct sysent *e)
{
    switch (e->filter) {
    case FL_SKIP_IF_FLAG:  return 5;  /* ld arg; jset unless; jset; ret; ret */
    case FL_TRACE_IF_FLAG: return 4;  /* ld arg; jset; ret; ret */
    case FL_SKIP_IF_NULL:  return 6;  /* ld lo; jeq; ld hi; jeq; ret allow; ret trace */
    case FL_FAMILY:        return 3 + N_FAMILIES;  /* ld; jeq each; ret errno; ret allow */
    case FL_IOCTL:         return 5 + N_REFUSED + N_CLONE;  /* ld; jeq each; and; jeq;
                                                              ret allow; ret errno */
    case FL_LOCK_CMD:      return 3 + N_LOCK_CMDS; /* ld; jeq each; ret allow; ret trace */
    default:               return 1;
    }
}

static int emit_entry(struct prog *p, const struct sysent *e, uint32_t index)
{
    uint32_t trace = SECCOMP_RET_TRACE | index;
    int r = 0;
    switch (e->filter) {
    case FL_SKIP_IF_FLAG:
        r |= LD(OFF_ARG_LO(e->filter_arg));
        r |= JSET(e->filter_unless, 2, 0);  /* "jset 0" never jumps */
        r |= JSET(e->filter_value, 0, 1);
        r |= RET(SECCOMP_RET_ALLOW);
        r |= RET(trace);
        break;
    case FL_TRACE_IF_FLAG:
        r |= LD(OFF_ARG_LO(e->filter_arg));
        r |= JSET(e->filter_value, 0, 1);
        r |= RET(trace);
        r |= RET(SECCOMP_RET_ALLOW);
        break;
    case FL_SKIP_IF_NULL:
        r |= LD(OFF_ARG_LO(e->filter_arg));
        r |= JEQ(0, 0, 3);
        r |= LD(OFF_ARG_HI(e->filter_arg));
        r |= JEQ(0, 0, 1);
        r |= RET(SECCOMP_RET_ALLOW);
        r |= RET(trace);
        break;
    case FL_ENOSYS:
        r |= RET(SECCOMP_RET_ERRNO | ENOSYS);
        break;
    case FL_FAMILY:
        r |= LD(OFF_ARG_LO(e->filter_arg));
        for (int i = 0; i < N_FAMILIES; i++)
            r |= JEQ(FAMILIES[i], (uint8_t)(N_FAMILIES - i), 0);
        r |= RET(SECCOMP_RET_ERRNO | EAFNOSUPPORT);
        r |= RET(SECCOMP_RET_ALLOW);
        break;
    case FL_IOCTL:
        r |= LD(OFF_ARG_LO(e->filter_arg));   /* the request is an unsigned int */
        for (int i = 0; i < N_REFUSED; i++)
            r |= JEQ(REFUSED_IOCTLS[i], (uint8_t)(N_REFUSED - i + N_CLONE + 2), 0);
        for (int i = 0; i < N_CLONE; i++)
            r |= JEQ(CLONE_IOCTLS[i], (uint8_t)(N_CLONE - i + 1), 0);
        r |= put(p, BPF_ALU | BPF_AND | BPF_K, 0, 0, 0xff00);
        r |= JEQ(BTRFS_IOCTL_TYPE, 1, 0);
        r |= RET(SECCOMP_RET_ALLOW);
        r |= RET(SECCOMP_RET_ERRNO | EOPNOTSUPP);
        break;
    case FL_LOCK_CMD:
        r |= LD(OFF_ARG_LO(e->filter_arg));   /* the command is an unsigned int */
        for (int i = 0; i < N_LOCK_CMDS; i++)
            r |= JEQ(LOCK_CMDS[i], (uint8_t)(N_LOCK_CMDS - i), 0);
        r |= RET(SECCOMP_RET_ALLOW);
        r |= RET(trace);
        break;
    default:
        r |= RET(trace);
    }
    return r;
}

int seccomp_build(void *buf, size_t cap)
{
    struct prog prog = { buf, 0, cap }, *p = &prog;
    int r = 0;
    r |= LD(OFF_ARCH);
    r |= JEQ(AUDIT_ARCH_X86_64, 1, 0);
    r |= RET(SECCOMP_RET_TRACE | TRACE_FOREIGN);
    r |= LD(OFF_NR);
    r |= JGE(X32_SYSCALL_BIT, 0, 1);
    r |= RET(SECCOMP_RET_TRACE | TRACE_FOREIGN);
    for (size_t i = 0; i < caper_n_sysent; i++) {
        const struct sysent *e = &caper_sysent[i];
        /* A body always returns, so the accumulator still holds nr when
         * the jump skips it. */
        r |= JEQ(e->nr, 0, (uint8_t)entry_len(e));
        r |= emit_entry(p, e, (uint32_t)i);
    }
    r |= RET(SECCOMP_RET_ALLOW);
    if (r || prog.len > BPF_MAXINSNS) {
        errno = E2BIG;
        return -1;
    }
    return (int)prog.len;
}

int seccomp_install(struct caper_failure *f)
{
    struct sock_filter insn[BPF_MAXINSNS];
    int n = seccomp_build(insn, BPF_MAXINSNS);
    if (n < 0) {
        fail_set(f, CAPER_STEP_SECCOMP, errno, "seccomp filter oversized (> %d)", BPF_MAXINSNS);
        return -1;
    }
    struct sock_fprog fprog = { .len = (unsigned short)n, .filter = insn };
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) {
        fail_set(f, CAPER_STEP_SECCOMP, errno, "seccomp(SET_MODE_FILTER, %d insns)%s", n,
                 errno == EINVAL ? " (hint: kernel built without CONFIG_SECCOMP_FILTER?)" : "");
        return -1;
    }
    return 0;
}

static const char *filter_name(const struct sysent *e)
{
    switch (e->filter) {
    case FL_SKIP_IF_FLAG:  return "allow if arg & v and not arg & u, else trace";
    case FL_SKIP_IF_NULL:  return "allow if arg == 0, else trace";
    case FL_TRACE_IF_FLAG: return "trace if arg & v, else allow";
    case FL_ENOSYS:        return "errno ENOSYS";
    case FL_FAMILY:        return "allow if arg is AF_UNIX/INET/INET6/NETLINK, else errno EAFNOSUPPORT";
    case FL_IOCTL:         return "errno EOPNOTSUPP if arg is a refused ioctl (preallocating, inode "
                                  "flags, verity, fscrypt) or a btrfs one but a clone, else allow";
    case FL_LOCK_CMD:      return "trace if arg is F_SETLK/F_SETLKW/F_OFD_SETLK/F_OFD_SETLKW/F_SETLEASE, else allow";
    default:               return "trace";
    }
}

int caper_dump_filter(int fd)
{
    struct sock_filter insn[BPF_MAXINSNS];
    int n = seccomp_build(insn, BPF_MAXINSNS);
    if (n < 0)
        return -1;
    dprintf(fd, "seccomp filter: %d instructions (max %d)\n", n, BPF_MAXINSNS);
    dprintf(fd, "if (arch != x86_64) return TRACE(foreign abi)\n");
    dprintf(fd, "if (nr >= 0x%x) return TRACE(foreign abi: x32)\n", X32_SYSCALL_BIT);
    for (size_t i = 0; i < caper_n_sysent; i++) {
        const struct sysent *e = &caper_sysent[i];
        if (e->filter_arg >= 0)
            dprintf(fd, "if (nr == %3u /* %s */) %s [arg%d, v=0x%x, u=0x%x]\n", e->nr, e->name,
                    filter_name(e), e->filter_arg, e->filter_value, e->filter_unless);
        else
            dprintf(fd, "if (nr == %3u /* %s */) %s\n", e->nr, e->name, filter_name(e));
    }
    dprintf(fd, "return ALLOW\n");
    return 0;
}
