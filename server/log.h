/* log.h - the server's log lines: a timestamp and a level on every one,
 * as text or as JSON objects (--log-format json).
 *
 * Owns: the line format, the chosen format and which probe requests are
 * logged. Every server line goes through here, one write(2) per line so
 * lines from threads never interleave.
 * Does not own: what is said (the callers) and never the prompt text or API
 * keys (the request line carries the prompt only with --log-prompts).
 * ref: docs/serving.md 12.
 */
#ifndef HYSERVE_LOG_H
#define HYSERVE_LOG_H

#include <stdarg.h>
#include <stdbool.h>

#include <cjson/cJSON.h>

enum log_level { LOG_INFO = 0, LOG_WARN = 1, LOG_ERROR = 2 };

/* Set once at start, before any thread logs. json: one JSON object per
 * line; probes: also log GET /health, /live, /ready and /metrics. */
void log_setup(bool json, bool probes);
bool log_probes(void);
bool log_json(void);

/* One line: "2026-12-02T06:17:49.123Z INFO hyserve: ..." as text, or
 * {"ts": ..., "level": "info", "msg": "..."} as JSON. */
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with a va_list, after a prefix ("hyserve: http: "): for
 * libmicrohttpd's error log. */
void log_vmsg(int level, const char *prefix, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* JSON format only: one line of ts, level and then the fields of fields
 * (an object, taken over and deleted), in their order. Callers write the
 * text form of the same line with log_msg. */
void log_fields(int level, cJSON *fields);

#endif
