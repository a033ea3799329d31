/* paths.c: reading tracee memory and turning what it names into absolute paths. */
#include "internal.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096u

ssize_t tracee_read(pid_t tid, uint64_t addr, void *buf, size_t n)
{
    struct iovec local = { buf, n }, remote = { (void *)(uintptr_t)addr, n };
    ssize_t r = process_vm_readv(tid, &local, 1, &remote, 1, 0);
    if (r >= 0 && (size_t)r < n) {
        errno = EFAULT;
        return -1;
    }
    return r;
}

/* A read that crosses into an unmapped page fails whole, so read up to each
 * page boundary separately. */
ssize_t tracee_read_str(pid_t tid, uint64_t addr, char *buf, size_t cap, int *truncated)
{
    size_t got = 0;
    *truncated = 0;
    if (addr == 0) {
        errno = EFAULT;
        return -1;
    }
    while (got + 1 < cap) {
        size_t chunk = PAGE - ((addr + got) % PAGE);
        if (chunk > cap - 1 - got)
            chunk = cap - 1 - got;
        if (tracee_read(tid, addr + got, buf + got, chunk) < 0)
            return -1;
        char *nul = memchr(buf + got, '\0', chunk);
        if (nul)
            return nul - buf;
        got += chunk;
    }
    buf[got] = '\0';
    *truncated = 1;
    return (ssize_t)got;
}

ssize_t proc_link(pid_t tid, const char *what, char *buf, size_t cap)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/%s", (int)tid, what);
    ssize_t n = readlink(p, buf, cap - 1);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

/* Lexical normalisation, like Python's os.path.normpath on an absolute path:
 * symlinks are not followed (the tracee's view may change under us anyway). */
size_t path_join_normalize(const char *base, const char *rel, char *out, size_t cap)
{
    char tmp[2 * CAPER_PATH_MAX + 2];
    if (rel[0] == '/' || !base)
        snprintf(tmp, sizeof tmp, "%s", rel);
    else
        snprintf(tmp, sizeof tmp, "%s/%s", base, rel);
    size_t o = 0;
    out[o++] = '/';
    char *save = NULL;
    for (char *seg = strtok_r(tmp, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
        if (strcmp(seg, ".") == 0)
            continue;
        if (strcmp(seg, "..") == 0) {
            while (o > 1 && out[o - 1] != '/')
                o--;
            if (o > 1)
                o--;  /* drop the slash too */
            continue;
        }
        size_t n = strlen(seg);
        if (o > 1) {
            if (o + 1 >= cap)
                break;
            out[o++] = '/';
        }
        if (o + n >= cap)
            n = cap - 1 - o;
        memcpy(out + o, seg, n);
        o += n;
    }
    /* "/.." leaves o == 1 with out "/" */
    out[o] = '\0';
    return o;
}
