/* emit.c: fixed-layout event records onto the event pipe, and failure text. */
#include "internal.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EMIT_BUF (64 * 1024)

void fail_set(struct caper_failure *f, uint32_t step, int err, const char *fmt, ...)
{
    if (f->step)  /* keep the first failure: later ones are consequences */
        return;
    f->step = step;
    f->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->detail, sizeof f->detail, fmt, ap);
    va_end(ap);
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int emitter_init(struct emitter *e, int fd)
{
    memset(e, 0, sizeof *e);
    e->fd = fd;
    e->cap = EMIT_BUF;
    e->buf = malloc(e->cap);
    e->t0_ns = now_ns();
    return e->buf ? 0 : -1;
}

void emitter_free(struct emitter *e)
{
    free(e->buf);
    e->buf = NULL;
}

int emit_flush(struct emitter *e)
{
    size_t off = 0;
    while (off < e->len && !e->failed_errno) {
        ssize_t n = write(e->fd, e->buf + off, e->len - off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            e->failed_errno = errno;
            break;
        }
        off += (size_t)n;
    }
    e->len = 0;
    return e->failed_errno ? -1 : 0;
}

uint64_t emit(struct emitter *e, struct ev *ev)
{
    if (e->failed_errno)
        return 0;
    size_t len = sizeof(struct caper_event);
    for (int i = 0; i < 3; i++)
        len += ev->n[i];
    len = (len + 7) & ~(size_t)7;
    if (e->len + len > e->cap && emit_flush(e) < 0)
        return 0;
    /* Strings are bounded by CAPER_PATH_MAX and argv_max, so a record fits. */
    char *rec = e->buf + e->len;
    struct caper_event *h = &ev->h;
    h->len = (uint32_t)len;
    h->seq = ++e->seq;
    h->time_ns = now_ns() - e->t0_ns;
    if (h->count == 0)
        h->count = 1;
    uint32_t off = sizeof(struct caper_event);
    for (int i = 0; i < 3; i++) {
        h->str_off[i] = off;
        h->str_len[i] = (uint32_t)ev->n[i];
        if (ev->n[i])
            memcpy(rec + off, ev->s[i], ev->n[i]);
        off += (uint32_t)ev->n[i];
    }
    memset(rec + off, 0, len - off);
    memcpy(rec, h, sizeof *h);
    e->len += len;
    e->events++;
    e->bytes += len;
    if (e->published)
        __atomic_store_n(e->published, h->seq, __ATOMIC_RELEASE);
    return h->seq;
}

/* FNV-1a over the identity of an event. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t ev_hash(const struct ev *ev)
{
    const struct caper_event *h = &ev->h;
    uint64_t x = 0xcbf29ce484222325ull;
    x = fnv(x, &h->kind, sizeof h->kind);
    x = fnv(x, &h->result, sizeof h->result);
    x = fnv(x, &h->arg0, sizeof h->arg0);
    x = fnv(x, &h->arg1, sizeof h->arg1);
    x = fnv(x, &h->sysno, sizeof h->sysno);
    x = fnv(x, &h->flags, sizeof h->flags);
    x = fnv(x, &h->mode, sizeof h->mode);
    x = fnv(x, &h->info, sizeof h->info);
    for (int i = 0; i < 3; i++) {
        x = fnv(x, &ev->n[i], sizeof ev->n[i]);
        x = fnv(x, ev->s[i], ev->n[i]);
    }
    return x;
}
