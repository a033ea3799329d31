/* caper-client: `caper` for the calls an agent makes on every shell command
 * (`caper hook AGENT`, `caper run ...`), at the cost of an exec.
 *
 * It hands its argv, its stdin (hook only) and its context (cwd, environment,
 * umask, limits, priority, ids: what caper.sandbox.inherit.Caller carries) to the
 * resident gate as one "argv" request, and prints what the gate answers: the
 * gate parses the arguments, takes the task from the hook's call record, runs,
 * judges and commits, with its state warm. Everything else, and every case
 * the gate does not take (no gate yet, a gate of an older build, a declined
 * request, any other subcommand), is handed whole to the Python CLI by exec:
 * the same argv, the same environment, the same process. So this file holds
 * no policy: it is a transport, and the gate authenticates it as it does
 * any client (caper.front.gate: uid, namespaces, token).
 *
 * Once the request is sent the gate may have run the command: a failure
 * then is reported (exit 125, or 2 for a hook: every agent blocks on 2),
 * never retried.
 *
 * Built by caper_native/build.py, with the Python that builds it baked in
 * (CAPER_PYTHON) for the fallback.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef CAPER_PYTHON
#error "build with -DCAPER_PYTHON=\"/path/to/python\" (caper_native/build.py does)"
#endif

#define PROTOCOL 1               /* caper.front.gate.PROTOCOL */
#define MAX_HOOK_INPUT (1 << 20) /* caper.front.hooks.MAX_INPUT */
#define HOOK_TIMEOUT_S 30.0      /* every agent's default hook timeout (caper.front.hooks.AGENTS) */
#define EXIT_CAPER_FAILED 125
#define EXIT_HOOK_BLOCKS 2

extern char **environ;

static char **g_argv;
static int g_hook;               /* `caper-client hook ...`: a failure exits 2 */
static char g_root[PATH_MAX];    /* the directory holding caper/ and caper_native/ */

struct buf { char *p; size_t n, cap; };

static void put(struct buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            fputs("caper-client: out of memory\n", stderr);
            _exit(g_hook ? EXIT_HOOK_BLOCKS : EXIT_CAPER_FAILED);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

static void putf(struct buf *b, const char *fmt, long long v)
{
    char tmp[64];
    int n = snprintf(tmp, sizeof tmp, fmt, v);
    put(b, tmp, (size_t)n);
}

/* A JSON string of arbitrary bytes: base64 (the gate decodes it), so no
 * escaping and no encoding question. */
static void put_b64(struct buf *b, const unsigned char *s, size_t n)
{
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0)
                     | (i + 2 < n ? s[i + 2] : 0);
        char q[4] = {T[v >> 18 & 63], T[v >> 12 & 63],
                     i + 1 < n ? T[v >> 6 & 63] : '=', i + 2 < n ? T[v & 63] : '='};
        put(b, q, 4);
    }
    put(b, "\"", 1);
}

static void put_b64s(struct buf *b, const char *s) { put_b64(b, (const unsigned char *)s, strlen(s)); }

static void fail(const char *what, int e);
static void write_all(int fd, const char *p, size_t n);

static struct buf g_stdin;     /* what a hook read of its stdin (the fallback gets it back) */
static char g_self[PATH_MAX];

/* The Python CLI, in this process: the same argv and environment, and the
 * stdin a hook already read, from a memfd. */
static void fallback(void)
{
    /* -E -P: never a caper/ from PYTHONPATH or the cwd; the root is put first,
     * as caper.launch does. */
    static char code[] = "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                         "sys.argv[0] = sys.argv.pop(1); "
                         "from caper.front.cli import main; raise SystemExit(main())";
    char *argv[1024];
    int n = 0;
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, NULL);   /* Python's hook sets its own deadline */
    if (g_stdin.n) {
        int fd = memfd_create("caper-hook-stdin", MFD_CLOEXEC);
        if (fd < 0)
            fail("memfd_create(hook stdin)", errno);
        write_all(fd, g_stdin.p, g_stdin.n);
        if (lseek(fd, 0, SEEK_SET) || dup2(fd, 0) < 0)
            fail("dup2(hook stdin)", errno);
    }
    argv[n++] = CAPER_PYTHON;
    argv[n++] = "-E";
    argv[n++] = "-P";
    argv[n++] = "-c";
    argv[n++] = code;
    argv[n++] = g_root;
    argv[n++] = g_self;
    for (char **a = g_argv + 1; *a && n < 1023; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    execv(CAPER_PYTHON, argv);
    int e = errno;
    fprintf(stderr, "caper-client: execv(%s): %s; the command was not run\n", CAPER_PYTHON,
            strerror(e));
    _exit(g_hook ? EXIT_HOOK_BLOCKS : EXIT_CAPER_FAILED);
}

static void fail(const char *what, int e)
{
    fprintf(stderr, "caper: blocked: caper-client: %s%s%s\n", what, e ? ": " : "",
            e ? strerror(e) : "");
    _exit(g_hook ? EXIT_HOOK_BLOCKS : EXIT_CAPER_FAILED);
}

static void too_late(int sig)
{
    static const char m[] = "caper's hook did not finish within its deadline; the command "
                            "was not run\n";
    (void)sig;
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(EXIT_HOOK_BLOCKS);
}

/* caper.state.default_state_dir */
static int state_dir(char *out, size_t n)
{
    const char *d = getenv("CAPER_STATE_DIR");
    if (d && *d)
        return snprintf(out, n, "%s", d) < (int)n ? 0 : -1;
    if (geteuid() == 0)
        return snprintf(out, n, "/var/lib/caper") < (int)n ? 0 : -1;
    const char *x = getenv("XDG_STATE_HOME");
    if (x && *x)
        return snprintf(out, n, "%s/caper", x) < (int)n ? 0 : -1;
    const char *h = getenv("HOME");
    if (!h || !*h)
        return -1;                /* Python asks pwd: leave it to Python */
    return snprintf(out, n, "%s/.local/state/caper", h) < (int)n ? 0 : -1;
}

/* caper.front.gate.build_id: the newest mtime of caper's .py/.so/.toml files. */
static void newest(const char *dir, long long *best, int depth)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d))) {
        char p[PATH_MAX];
        struct stat st;
        size_t len = strlen(e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue;
        int is_dir = e->d_type == DT_DIR;
        if (e->d_type == DT_UNKNOWN && lstat(p, &st) == 0)
            is_dir = S_ISDIR(st.st_mode);
        if (is_dir) {
            if (strcmp(e->d_name, "__pycache__") && depth < 32)
                newest(p, best, depth + 1);
        } else if ((len > 3 && !strcmp(e->d_name + len - 3, ".py")) ||
                   (len > 3 && !strcmp(e->d_name + len - 3, ".so")) ||
                   (len > 5 && !strcmp(e->d_name + len - 5, ".toml"))) {
            if (stat(p, &st)) {
                break;            /* as build_id: an error ends this directory's scan */
            }
            long long ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
            if (ns > *best)
                *best = ns;
        }
    }
    closedir(d);
}

static int umask_now(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    int mask = -1;
    if (f) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "Umask:", 6)) {
                mask = (int)strtol(line + 6, NULL, 8);
                break;
            }
        fclose(f);
    }
    if (mask < 0) {
        mask = umask(022);
        umask(mask);
    }
    return mask;
}

static int cmp_gid(const void *a, const void *b)
{
    gid_t x = *(const gid_t *)a, y = *(const gid_t *)b;
    return x < y ? -1 : x > y;
}

/* Caller.to_json, with cwd and env as base64 (cwd_b64, env_b64: "K=V" each). */
static void put_caller(struct buf *b)
{
    static const int RLIMITS[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15};
    char cwd[PATH_MAX];
    gid_t groups[NGROUPS_MAX];
    if (!getcwd(cwd, sizeof cwd))
        fallback();               /* Python says why */
    puts_(b, "{\"cwd_b64\": ");
    put_b64s(b, cwd);
    puts_(b, ", \"env_b64\": [");
    for (char **e = environ; *e; e++) {
        if (e != environ)
            puts_(b, ", ");
        put_b64s(b, *e);
    }
    putf(b, "], \"umask\": %lld", umask_now());
    puts_(b, ", \"rlimits\": [");
    for (size_t i = 0; i < sizeof RLIMITS / sizeof *RLIMITS; i++) {
        struct rlimit r;
        if (getrlimit(RLIMITS[i], &r))
            fallback();
        putf(b, i ? ", [%lld" : "[%lld", RLIMITS[i]);
        char tmp[64];
        snprintf(tmp, sizeof tmp, ", %llu, %llu]", (unsigned long long)r.rlim_cur,
                 (unsigned long long)r.rlim_max);
        puts_(b, tmp);
    }
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (errno)
        fallback();
    putf(b, "], \"nice\": %lld", nice);
    putf(b, ", \"gid\": %lld", getegid());
    putf(b, ", \"uid\": %lld", geteuid());
    int ng = getgroups(NGROUPS_MAX, groups);
    if (ng < 0)
        fallback();
    qsort(groups, (size_t)ng, sizeof *groups, cmp_gid);
    puts_(b, ", \"groups\": [");
    for (int i = 0; i < ng; i++)
        putf(b, i ? ", %lld" : "%lld", groups[i]);
    puts_(b, "]}");
}

static int connect_gate(const char *state)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (snprintf(a.sun_path, sizeof a.sun_path, "%s/gate.sock", state) >= (int)sizeof a.sun_path)
        return -1;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    /* Nothing is sent to a socket another uid serves (caper.front.gate._connect). */
    if (connect(s, (struct sockaddr *)&a, sizeof a) || 
        getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) || cred.uid != geteuid()) {
        close(s);
        return -1;
    }
    return s;
}

static int read_token(const char *state, char *out, size_t n)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/gate.token", state);
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r = read(fd, out, n - 1);
    close(fd);
    if (r < 0)
        return -1;
    while (r > 0 && (out[r - 1] == '\n' || out[r - 1] == ' '))
        r--;
    out[r] = 0;
    for (ssize_t i = 0; i < r; i++)
        if (!((out[i] >= '0' && out[i] <= '9') || (out[i] >= 'a' && out[i] <= 'f')))
            return -1;
    return 0;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;               /* the reader went away: nothing to tell it */
        p += w;
        n -= (size_t)w;
    }
}

int main(int argc, char **argv)
{
    char self[PATH_MAX], state[PATH_MAX - 16], token[256];
    struct buf req = {0}, ans = {0}, *in = &g_stdin;
    long long build = 0;
    (void)argc;
    g_argv = argv;
    g_hook = argv[1] && !strcmp(argv[1], "hook");
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        fail("readlink(/proc/self/exe)", errno);
    self[n] = 0;
    snprintf(g_self, sizeof g_self, "%s", self);
    /* <root>/caper_native/caper-client */
    snprintf(g_root, sizeof g_root, "%s", self);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(g_root, '/');
        if (!slash || slash == g_root)
            fail("cannot find caper's root next to /proc/self/exe", 0);
        *slash = 0;
    }
    if (!argv[1] || (!g_hook && strcmp(argv[1], "run")))
        fallback();
    const char *no_gate = getenv("CAPER_NO_GATE");
    if ((no_gate && !strcmp(no_gate, "1")) || state_dir(state, sizeof state))
        fallback();

    if (g_hook) {
        /* The hook's own deadline, as caper.front.hooks.hook_main: half its timeout. */
        double timeout = HOOK_TIMEOUT_S;
        for (char **a = argv + 2; *a; a++)
            if (!strcmp(*a, "--timeout") && a[1])
                timeout = strtod(a[1], NULL);
        struct itimerval it = {.it_value = {.tv_sec = (time_t)(timeout / 2),
                                            .tv_usec = (long)((timeout / 2 - (long)(timeout / 2)) * 1e6)}};
        signal(SIGALRM, too_late);
        if (timeout > 0)
            setitimer(ITIMER_REAL, &it, NULL);
        char chunk[65536];
        ssize_t r;
        while ((r = read(0, chunk, sizeof chunk)) != 0) {
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                fail("read(stdin)", errno);
            }
            put(in, chunk, (size_t)r);
            if (in->n > MAX_HOOK_INPUT)
                break;            /* the gate refuses it, with the reason */
        }
    }

    int s = connect_gate(state);
    if (s < 0 || read_token(state, token, sizeof token))
        fallback();               /* no gate (Python starts one), or another's */
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/caper", g_root);
    newest(dir, &build, 0);
    snprintf(dir, sizeof dir, "%s/caper_native", g_root);
    newest(dir, &build, 0);

    puts_(&req, "{\"kind\": \"argv\", \"token\": \"");
    puts_(&req, token);
    putf(&req, "\", \"build\": \"%lld-", PROTOCOL);
    putf(&req, "%lld\", \"argv_b64\": [", build);
    for (char **a = argv + 1; *a; a++) {
        if (a != argv + 1)
            puts_(&req, ", ");
        put_b64s(&req, *a);
    }
    puts_(&req, "], \"stdin_b64\": ");
    put_b64(&req, (const unsigned char *)(in->p ? in->p : ""), in->n);
    puts_(&req, ", \"caller\": ");
    put_caller(&req);
    puts_(&req, "}\n");
    signal(SIGPIPE, SIG_IGN);
    for (size_t off = 0; off < req.n;) {
        ssize_t w = write(s, req.p + off, req.n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            fail("the gate dropped the request", w < 0 ? errno : 0);
        off += (size_t)w;
    }

    /* The answer: {"exit": N, "out": A, "err": B}\n then A + B raw bytes;
     * or one JSON line: decline / stale (not run: Python takes it), error. */
    char *nl = NULL;
    int code = 0;
    size_t out_n = 0, err_n = 0, head = 0;
    for (;;) {
        char chunk[65536];
        ssize_t r = read(s, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            fail("read(gate socket)", errno);
        if (r > 0)
            put(&ans, chunk, (size_t)r);
        if (!nl && (nl = memchr(ans.p ? ans.p : "", '\n', ans.n))) {
            head = (size_t)(nl - ans.p) + 1;
            if (sscanf(ans.p, "{\"exit\": %d, \"out\": %zu, \"err\": %zu}", &code, &out_n,
                       &err_n) != 3) {
                if (!strncmp(ans.p, "{\"decline\"", 10) || !strncmp(ans.p, "{\"stale\"", 8)) {
                    close(s);
                    fallback();
                }
                *nl = 0;
                fprintf(stderr, "caper: blocked: the gate refused the request: %s\n", ans.p);
                _exit(g_hook ? EXIT_HOOK_BLOCKS : EXIT_CAPER_FAILED);
            }
        }
        if (nl && ans.n >= head + out_n + err_n)
            break;
        if (r == 0)
            fail("the gate closed the connection before its whole answer "
                 "(whether the command ran is not known)", 0);
    }
    close(s);
    write_all(1, ans.p + head, out_n);
    write_all(2, ans.p + head + out_n, err_n);
    return code;
}
