/* credstop.c: which names a run is stopped at (caper_config.stop_at). The
 * globs come from Python (caper/report/secrets.py: Protected.stop_globs), in
 * caper.h's syntax; this only matches them. A match is a candidate: the set's
 * check (Python, the report's own rules) decides, so these may match more
 * than the rules do, never less. */
#include "internal.h"
#include <stdio.h>
#include <string.h>

/* Whether glob g matches all of s up to e; below: or s is a directory on
 * g's way (s is used up where g goes on with a '/' or a '**'). */
static int glob_match(const char *g, const char *s, const char *e, int below)
{
    for (;;) {
        if (*g == '\0')
            return s == e;
        if (s == e && below && (*g == '/' || (g[0] == '*' && g[1] == '*')))
            return 1;
        if (g[0] == '*' && g[1] == '*') {
            if (g[2] == '/') {          /* no directory, or any run ending in '/' */
                if (glob_match(g + 3, s, e, below))
                    return 1;
                for (const char *q = s; q < e; q++)
                    if (*q == '/' && glob_match(g + 3, q + 1, e, below))
                        return 1;
                return 0;
            }
            for (const char *q = s;; q++) {
                if (glob_match(g + 2, q, e, below))
                    return 1;
                if (q == e)
                    return 0;
            }
        }
        if (*g == '*') {
            for (const char *q = s;; q++) {
                if (glob_match(g + 1, q, e, below))
                    return 1;
                if (q == e || *q == '/')
                    return 0;
            }
        }
        if (s == e)
            return 0;
        if (*g == '?') {
            if (*s == '/')
                return 0;
        } else {
            if (*g == '\\' && g[1])
                g++;
            if (*g != *s)
                return 0;
        }
        g++;
        s++;
    }
}

/* One glob per home and home pattern would be homes x patterns matches an
 * open (~1,700 with every account's home): a home first, at each '/' of the
 * path, then the patterns below it on the rest. */
static int below_a_home(const struct caper_credentials *set, const char *path, const char *e,
                        int below)
{
    if (!set->n_home_globs)
        return 0;
    for (uint32_t h = 0; h < set->n_homes; h++) {
        if (below && glob_match(set->homes[h], path, e, 1))
            return 1;                   /* a directory above a home, or the home */
        for (const char *q = path + 1; q <= e; q++) {
            if (q != e && *q != '/')
                continue;
            if (!glob_match(set->homes[h], path, q, 0))
                continue;
            for (uint32_t i = 0; i < set->n_home_globs; i++)
                if (glob_match(set->home_globs[i], q, e, below))
                    return 1;
        }
    }
    return 0;
}

static int any_glob(const struct caper_credentials *set, const char *path, int below)
{
    const char *e = path + strlen(path);
    for (uint32_t i = 0; i < set->n_globs; i++)
        if (glob_match(set->globs[i], path, e, 0) ||
            (below && set->rooted[i] && glob_match(set->globs[i], path, e, 1)))
            return 1;
    return below_a_home(set, path, e, below);
}

int caper_credential_candidate(const struct caper_credentials *set, const char *path,
                               uint32_t below)
{
    char dir[CAPER_PATH_MAX];
    size_t n = strlen(path);
    /* A directory by its name without a trailing '/' ("/" itself: ""), as
     * glob_match's below reads it. */
    while (below && n > 0 && path[n - 1] == '/')
        n--;
    if (n >= sizeof dir)
        return 1;                   /* longer than any path the tracer reads: fail closed */
    memcpy(dir, path, n);
    dir[n] = '\0';
    if (any_glob(set, dir, (int)below))
        return 1;
    /* A mount that shows another directory: asked as that directory's too. */
    for (uint32_t i = 0; i < set->n_translations; i++) {
        const char *alias = set->translations[2 * i], *shows = set->translations[2 * i + 1];
        size_t a = strlen(alias);
        while (a > 0 && alias[a - 1] == '/')
            a--;
        if (strncmp(dir, alias, a) != 0 || (dir[a] != '\0' && dir[a] != '/'))
            continue;
        char other[CAPER_PATH_MAX];
        if (snprintf(other, sizeof other, "%s%s", shows, dir + a) >= (int)sizeof other)
            return 1;
        return any_glob(set, other, (int)below);
    }
    return 0;
}

int credential_stop(const struct caper_credentials *set, const char *name, int below)
{
    return name && name[0] && caper_credential_candidate(set, name, (uint32_t)below) &&
           set->check(name, (uint32_t)below) != 0;
}
