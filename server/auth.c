/* auth.c - API keys (auth.h says what it owns). */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "web.h"

static int add_key(auth_keys *k, const char *s, size_t n, const char *where, char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    if (n > AUTH_MAX_KEY_BYTES) {
        snprintf(err, errlen, "%s: an API key is longer than %d bytes", where, AUTH_MAX_KEY_BYTES);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!isgraph((unsigned char)s[i])) {
            snprintf(err, errlen, "%s: an API key holds a space or a control character", where);
            return -1;
        }
    if (k->n == AUTH_MAX_KEYS) {
        snprintf(err, errlen, "%s: more than %d API keys", where, AUTH_MAX_KEYS);
        return -1;
    }
    memcpy(k->key[k->n], s, n);
    k->key[k->n][n] = '\0';
    k->len[k->n] = n;
    k->n++;
    return 0;
}

/* each line of text, trimmed, '#' comments and blank lines skipped */
static int add_lines(auth_keys *k, const char *text, const char *where, char *err, size_t errlen)
{
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *a = p, *b = p + n;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (a < b && *a != '#' && add_key(k, a, (size_t)(b - a), where, err, errlen))
            return -1;
        p += n + (e ? 1 : 0);
    }
    return 0;
}

int auth_load(const server_config *c, auth_keys *k, char *err, size_t errlen)
{
    memset(k, 0, sizeof *k);
    if (add_lines(k, c->api_keys, "--api-key", err, errlen))
        return -1;
    if (!c->api_key_file[0])
        return 0;
    FILE *f = fopen(c->api_key_file, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read --api-key-file %s: %s", c->api_key_file, strerror(errno));
        return -1;
    }
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    if (more) {
        snprintf(err, errlen, "--api-key-file %s is larger than %zu bytes", c->api_key_file, sizeof text - 1);
        return -1;
    }
    text[n] = '\0';
    if (memchr(text, '\0', n)) {
        snprintf(err, errlen, "--api-key-file %s is not a text file", c->api_key_file);
        return -1;
    }
    if (add_lines(k, text, c->api_key_file, err, errlen))
        return -1;
    if (k->n == 0) {
        snprintf(err, errlen, "--api-key-file %s holds no key", c->api_key_file);
        return -1;
    }
    return 0;
}

/* a == b over b's length, in time that depends on nb only */
static bool same_key(const char *a, size_t na, const char *b, size_t nb)
{
    volatile unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < nb; i++) {
        unsigned char x = i < na ? (unsigned char)a[i] : 0;
        d |= (unsigned char)(x ^ (unsigned char)b[i]);
    }
    return d == 0;
}

int auth_check(const auth_keys *k, const char *authorization)
{
    if (!authorization)
        return 0;
    const char *p = authorization;
    while (*p == ' ')
        p++;
    if (strncasecmp(p, "Bearer ", 7) != 0)
        return 0;
    return auth_check_key(k, p + 7);
}

int auth_check_key(const auth_keys *k, const char *key)
{
    if (!key)
        return 0;
    const char *p = key;
    while (*p == ' ')
        p++;
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == ' ')
        n--;
    int found = 0;
    for (int i = 0; i < k->n; i++)      /* no early exit: every key is compared */
        if (same_key(p, n, k->key[i], k->len[i]) && !found)
            found = i + 1;
    return found;
}

bool auth_open_path(const char *method, const char *path, bool metrics_public)
{
    if (!strcmp(path, "/health") || !strcmp(path, "/live") || !strcmp(path, "/ready"))
        return true;
    /* the dashboard's files: static, no data in them (the page asks for the
     * key when the API answers 401); POST / is TGI's generate and stays shut */
    if ((!strcmp(method, "GET") || !strcmp(method, "HEAD")) && web_find(path))
        return true;
    return metrics_public && (!strcmp(path, "/metrics") || !strcmp(path, "/stats"));
}
