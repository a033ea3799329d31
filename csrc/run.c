/* run.c: caper_run, the one entry point. The stages in order:
 * spawn the sandbox (ns.c, mount.c) -> start the watcher (output.c) ->
 * trace until every sandbox process is gone (trace.c) -> collect the result. */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_HEAD (64 * 1024)
#define DEFAULT_TAIL (64 * 1024)

static void copy_failure(struct caper_result *r, const struct caper_failure *f)
{
    r->step = f->step;
    r->err = f->err;
    memcpy(r->detail, f->detail, sizeof r->detail);
}

static int alloc_stream(struct output_stream *s, int fd, uint32_t head, uint32_t tail)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->head_cap = head;
    s->tail_cap = tail;
    s->head = malloc(head ? head : 1);
    s->tail = malloc(tail ? tail : 1);
    return s->head && s->tail ? 0 : -1;
}

/* What init or the command wrote on the status pipe before dying, if anything. */
static int read_status(int fd, struct status_msg *m)
{
    ssize_t n;
    do
        n = read(fd, m, sizeof *m);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *m;
}

int caper_run(const struct caper_config *c, struct caper_result *r)
{
    struct caper_failure f = { 0 };
    struct emitter e;
    struct spawn s;
    struct watcher w;
    void *thread = NULL;
    uint64_t t0 = now_ns();

    memset(r, 0, sizeof *r);
    memset(&w, 0, sizeof w);
    if (!c->argv || !c->argv[0] || !c->envp) {
        fail_set(&f, CAPER_STEP_CONFIG, EINVAL, "caper_run(argv/envp missing)");
        close(c->event_fd);
        copy_failure(r, &f);
        r->end = CAPER_END_SETUP_FAILED;
        return -1;
    }
    /* The tracer resolves the command's paths only with openat2 (trace.c):
     * without it, no run, rather than one that resolves them in the host. */
    if (!have_openat2()) {
        fail_set(&f, CAPER_STEP_CONFIG, ENOSYS,
                 "openat2(RESOLVE_IN_ROOT): this kernel lacks it (Linux 5.6+ needed)");
        close(c->event_fd);
        copy_failure(r, &f);
        r->end = CAPER_END_SETUP_FAILED;
        return -1;
    }
    if (emitter_init(&e, c->event_fd) < 0) {
        fail_set(&f, CAPER_STEP_EMIT, ENOMEM, "malloc(event buffer)");
        close(c->event_fd);
        copy_failure(r, &f);
        r->end = CAPER_END_SETUP_FAILED;
        return -1;
    }
    e.published = &r->emitted_seq;
    /* Measured on a 2-CPU VM: each ptrace stop that crosses CPUs costs ~3x
     * more than one that stays (wake-up IPIs). The sandbox inherits the mask. */
    cpu_set_t saved_cpus;
    int pinned = (c->flags & CAPER_F_SHARE_CPU) &&
                 sched_getaffinity(0, sizeof saved_cpus, &saved_cpus) == 0;
    if (pinned) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        pinned = sched_setaffinity(0, sizeof one, &one) == 0;
    }
    if (spawn_sandbox(c, &s, &f) < 0) {
        if (pinned)
            sched_setaffinity(0, sizeof saved_cpus, &saved_cpus);
        emitter_free(&e);
        close(c->event_fd);
        copy_failure(r, &f);
        r->end = CAPER_END_SETUP_FAILED;
        return -1;
    }
    uint32_t head = c->output_head ? c->output_head : DEFAULT_HEAD;
    uint32_t tail = c->output_tail ? c->output_tail : DEFAULT_TAIL;
    int watching = alloc_stream(&w.out, s.out_fd, head, tail) == 0 &&
                   alloc_stream(&w.err, s.err_fd, head, tail) == 0 &&
                   pipe2(w.wake_fd, O_CLOEXEC) == 0;
    w.kill_pid = s.init_pid;
    w.deadline_ns = c->timeout_ms ? t0 + c->timeout_ms * 1000000ull : 0;
    w.disk_path = c->disk_path;
    w.disk_min_free = c->disk_min_free;
    w.disk_min_inodes = c->disk_min_inodes;
    if (!watching || watcher_start(&w, &thread) < 0) {
        /* Without the watcher nobody drains output or enforces the deadline. */
        fail_set(&f, CAPER_STEP_OUTPUT, errno ? errno : ENOMEM, "pthread_create(watcher)");
        kill(s.init_pid, SIGKILL);
        thread = NULL;
    }

    trace_loop(c, &s, &e, &w, r, &f);
    if (pinned)
        sched_setaffinity(0, sizeof saved_cpus, &saved_cpus);

    if (thread)
        watcher_join(&w, thread);
    emit_flush(&e);
    emitter_free(&e);
    close(c->event_fd);
    if (w.wake_fd[0] > 0) {
        close(w.wake_fd[0]);
        close(w.wake_fd[1]);
    }
    output_export(&w.out, &r->out);
    output_export(&w.err, &r->err_out);
    r->events = e.events;
    r->wall_ns = now_ns() - t0;

    struct status_msg m;
    int failed_inside = read_status(s.status_fd, &m);
    close(s.status_fd);
    if (w.timed_out) {
        r->end = CAPER_END_TIMEOUT;
    } else if (w.disk_full) {
        r->end = CAPER_END_DISK_LIMIT;
    } else if (failed_inside) {
        fail_set(&f, m.step, m.err, "%.*s", (int)sizeof m.detail, m.detail);
        r->end = m.step == CAPER_STEP_EXEC || m.step == CAPER_STEP_CHDIR ? CAPER_END_EXEC_FAILED
                                                                        : CAPER_END_SETUP_FAILED;
    } else if (f.step && r->end != CAPER_END_PIDS_LIMIT) {
        r->end = CAPER_END_TRACE_FAILED;
    } else if (!r->end) {
        /* The command never reported its own end: the sandbox died under it. */
        fail_set(&f, CAPER_STEP_WAIT, ECHILD, "waitpid(command): no exit seen");
        r->end = CAPER_END_TRACE_FAILED;
    }
    copy_failure(r, &f);
    return r->end == CAPER_END_SETUP_FAILED ? -1 : 0;
}

int caper_reap(int32_t pid)
{
    for (;;) {
        int st;
        if (waitpid(pid, &st, __WALL) < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (WIFEXITED(st) || WIFSIGNALED(st))
            return 0;
        /* Stopped on its way out (a SIGCHLD, say): let it go untraced, with
         * its signal unless this was a ptrace event. */
        int sig = WSTOPSIG(st), event = (unsigned)st >> 16;
        ptrace(PTRACE_DETACH, pid, 0, event || sig == (SIGTRAP | 0x80) ? 0 : sig);
    }
}
