/* output.c: the watcher thread. It drains the command's stdout and stderr
 * into bounded head/tail buffers (so a 1 GB stream costs two small buffers)
 * and kills the sandbox when the wall-clock deadline passes, or when the
 * filesystem of the upper layers runs low. */
#include "internal.h"
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define DISK_POLL_MS 50

static void take(struct output_stream *s, const char *p, size_t n)
{
    if (s->head_len < s->head_cap) {
        size_t k = s->head_cap - s->head_len < n ? s->head_cap - s->head_len : n;
        memcpy(s->head + s->head_len, p, k);
        s->head_len += (uint32_t)k;
    }
    /* The tail is a ring indexed by the running total. */
    if (s->tail_cap) {
        if (n >= s->tail_cap) {
            p += n - s->tail_cap;
            s->total += n - s->tail_cap;
            n = s->tail_cap;
        }
        for (size_t i = 0; i < n; i++)
            s->tail[(s->total + i) % s->tail_cap] = p[i];
    }
    s->total += n;
}

/* The upper layers live on caper's state filesystem: a command writing
 * without end would fill it (and with it, often, the host's root). */
static int disk_low(const struct watcher *w)
{
    struct statvfs v;
    if (statvfs(w->disk_path, &v) < 0)
        return 0;
    return (uint64_t)v.f_bavail * v.f_frsize < w->disk_min_free ||
           (v.f_files && (uint64_t)v.f_favail < w->disk_min_inodes);
}

static void *watch(void *arg)
{
    struct watcher *w = arg;
    char buf[65536];
    while (!w->stop) {
        struct pollfd fds[3] = {
            { w->out.fd, POLLIN, 0 }, { w->err.fd, POLLIN, 0 }, { w->wake_fd[0], POLLIN, 0 },
        };
        int timeout = -1;
        if (w->disk_path && !w->disk_full && !w->timed_out) {
            if (disk_low(w)) {
                w->disk_full = 1;
                kill(w->kill_pid, SIGKILL);
                continue;
            }
            timeout = DISK_POLL_MS;
        }
        if (w->deadline_ns && !w->timed_out) {
            uint64_t now = now_ns();
            if (now >= w->deadline_ns) {
                w->timed_out = 1;
                kill(w->kill_pid, SIGKILL);  /* pid 1 of the sandbox: all of it dies */
                continue;
            }
            int left = (int)((w->deadline_ns - now) / 1000000u) + 1;
            timeout = timeout < 0 || left < timeout ? left : timeout;
        }
        int n = poll(fds, 3, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            w->poll_errno = errno;
            break;
        }
        for (int i = 0; i < 2; i++) {
            struct output_stream *s = i ? &w->err : &w->out;
            if (s->fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = read(s->fd, buf, sizeof buf);
            if (r > 0) {
                take(s, buf, (size_t)r);
            } else if (r == 0 || errno != EINTR) {
                close(s->fd);
                s->fd = -1;
            }
        }
        if (fds[2].revents)
            break;
    }
    return NULL;
}

int watcher_start(struct watcher *w, void **thread)
{
    pthread_t *t = malloc(sizeof *t);
    if (!t)
        return -1;
    int e = pthread_create(t, NULL, watch, w);
    if (e) {
        free(t);
        errno = e;
        return -1;
    }
    *thread = t;
    return 0;
}

/* Stop the watcher once the sandbox is gone, then drain what is left in the
 * pipes (every writer is dead, so the reads end). */
void watcher_join(struct watcher *w, void *thread)
{
    pthread_t *t = thread;
    w->stop = 1;
    if (write(w->wake_fd[1], "x", 1) < 0) { /* the thread also stops on its own */ }
    pthread_join(*t, NULL);
    free(t);
    /* One last look: a command can fill the filesystem between two polls and
     * then exit (dash exits when `: > f` fails), and its full upper would
     * otherwise go to the approver as a finished run. */
    if (w->disk_path && !w->disk_full && !w->timed_out && disk_low(w))
        w->disk_full = 1;
    char buf[65536];
    for (int i = 0; i < 2; i++) {
        struct output_stream *s = i ? &w->err : &w->out;
        while (s->fd >= 0) {
            ssize_t r = read(s->fd, buf, sizeof buf);
            if (r > 0)
                take(s, buf, (size_t)r);
            else if (r == 0 || errno != EINTR) {
                close(s->fd);
                s->fd = -1;
            }
        }
    }
}

void output_export(struct output_stream *s, struct caper_output *o)
{
    o->head = s->head;
    o->head_len = s->head_len;
    o->total = s->total;
    uint64_t kept = s->total < s->tail_cap ? s->total : s->tail_cap;
    o->tail_len = (uint32_t)kept;
    o->tail = malloc(kept ? kept : 1);
    if (o->tail) {
        uint64_t start = s->total - kept;
        for (uint64_t i = 0; i < kept; i++)
            o->tail[i] = s->tail[(start + i) % s->tail_cap];
    } else {
        o->tail_len = 0;
    }
    free(s->tail);
    s->head = s->tail = NULL;
}

void caper_result_free(struct caper_result *r)
{
    free(r->out.head);
    free(r->out.tail);
    free(r->err_out.head);
    free(r->err_out.tail);
    r->out.head = r->out.tail = r->err_out.head = r->err_out.tail = NULL;
}
