/* log.c - timestamped, levelled log lines, text or JSON (see log.h).
 *
 * Text lines start with an RFC 3339 UTC timestamp in milliseconds and the
 * level, so a line read alone (a container log, journald) says when and how
 * bad; JSON lines are one object each, for log shippers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "log.h"

static bool g_json;     /* set once by log_setup before threads start */
static bool g_probes;

static const char *const LEVELS[] = {"INFO", "WARN", "ERROR"};
static const char *const LEVELS_JSON[] = {"info", "warn", "error"};

void log_setup(bool json, bool probes)
{
    g_json = json;
    g_probes = probes;
}

bool log_probes(void)
{
    return g_probes;
}

bool log_json(void)
{
    return g_json;
}

/* "2026-12-02T06:17:49.123Z" */
static void now_rfc3339(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* One write of the whole line (stderr is unbuffered: one line, one write). */
static void emit(const char *line, size_t len)
{
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, line, len);
        if (w <= 0)
            return;
        line += w;
        len -= (size_t)w;
    }
}

static void emit_json(int level, cJSON *o)
{
    char ts[40];
    now_rfc3339(ts, sizeof ts);
    cJSON *line = cJSON_CreateObject();
    if (!line) {
        cJSON_Delete(o);
        return;
    }
    cJSON_AddStringToObject(line, "ts", ts);
    cJSON_AddStringToObject(line, "level", LEVELS_JSON[level]);
    while (o && o->child) {             /* move the fields over, in order */
        cJSON *f = cJSON_DetachItemViaPointer(o, o->child);
        json_put(line, f->string, f);
    }
    cJSON_Delete(o);
    char *txt = cJSON_PrintUnformatted(line);
    cJSON_Delete(line);
    if (!txt)
        return;
    size_t n = strlen(txt);
    txt[n] = '\n';                      /* replaces the NUL; cJSON_free needs no terminator */
    emit(txt, n + 1);
    cJSON_free(txt);
}

void log_msg(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, "", fmt, ap);
    va_end(ap);
}

void log_vmsg(int level, const char *prefix, const char *fmt, va_list ap)
{
    char msg[2048];
    size_t pl = (size_t)snprintf(msg, sizeof msg, "%s", prefix);
    if (pl < sizeof msg)
        vsnprintf(msg + pl, sizeof msg - pl, fmt, ap);
    size_t ml = strlen(msg);
    while (ml > 0 && msg[ml - 1] == '\n')
        msg[--ml] = '\0';
    if (g_json) {
        cJSON *o = cJSON_CreateObject();
        /* the "hyserve: " every text line starts with says nothing in a field */
        cJSON_AddStringToObject(o, "msg", !strncmp(msg, "hyserve: ", 9) ? msg + 9 : msg);
        emit_json(level, o);
        return;
    }
    /* one record, one line: a control character (a percent-encoded newline
     * in a URL, a header's tab) is written as \xNN, so text from a client
     * can never start a forged line or move the terminal's cursor */
    char safe[2048 * 4 + 1];
    size_t k = 0;
    for (size_t i = 0; i < ml && k + 5 < sizeof safe; i++) {
        const unsigned char c = (unsigned char)msg[i];
        if (c < 0x20 || c == 0x7f)
            k += (size_t)snprintf(safe + k, sizeof safe - k, "\\x%02x", c);
        else
            safe[k++] = (char)c;
    }
    safe[k] = '\0';
    char line[sizeof safe + 64], ts[40];
    now_rfc3339(ts, sizeof ts);
    int n = snprintf(line, sizeof line, "%s %-5s %s\n", ts, LEVELS[level], safe);
    if (n > 0)
        emit(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void log_fields(int level, cJSON *fields)
{
    emit_json(level, fields);
}
