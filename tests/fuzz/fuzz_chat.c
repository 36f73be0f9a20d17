/* fuzz_chat.c - libFuzzer target: the chat-template renderer and the
 * template detector.
 *
 * Input: byte 0 picks the template kind; the rest is split at NUL bytes
 * into messages, the first byte of each choosing its role among the ones
 * the API accepts (system, developer, user, assistant, tool) and the rest
 * its content, raw bytes of any kind. The whole input is also given to
 * chat_detect as a template text.
 * Properties: rendering succeeds for the three renderable kinds and names
 * the problem for the others; the data spans are sorted, disjoint, inside
 * the prompt, one per non-empty content, and each holds exactly that
 * message's content (ChatML verbatim; Llama 3 with Jinja's trim; a Llama
 * 3.1 tool result as the JSON string of it, as cJSON writes one); outside
 * the spans the markup opens exactly one turn per message (plus the 3.1
 * system turn) and the generation prompt, whatever the content holds.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "fuzz.h"

#define MAX_MSGS 64

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *tmpl = malloc(size + 1);
    if (!tmpl)
        return 0;
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    int det = chat_detect(tmpl);
    FUZZ_CHECK(det >= CHAT_NONE && det <= CHAT_LLAMA31);
    FUZZ_CHECK(chat_kind_name(det) != NULL);

    static const char *const roles[] = { "system", "developer", "user", "assistant", "tool" };
    static const int kinds[] = { CHAT_NONE, CHAT_UNKNOWN, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA31 };
    const int kind = kinds[data[0] % 5];
    chat_msg msgs[MAX_MSGS];
    int n_msgs = 0;
    /* tmpl[1..size] split at NULs, in place: every message borrows it */
    char *p = tmpl + 1, *end = tmpl + size;
    while (p < end && n_msgs < MAX_MSGS) {
        char *z = p + strlen(p);
        msgs[n_msgs] = (chat_msg){0};   /* no tool calls: the fields this target does not fuzz */
        msgs[n_msgs].role = (char *)roles[(uint8_t)*p % 5];
        msgs[n_msgs].content = *p ? p + 1 : p;
        n_msgs++;
        p = z + 1;
    }
    char *out = NULL, err[256];
    size_t *spans = NULL;
    int n_spans = 0;
    err[0] = 0;
    int rc = chat_render(kind, msgs, n_msgs, &out, &spans, &n_spans, err, sizeof err);
    if (kind == CHAT_NONE || kind == CHAT_UNKNOWN) {
        FUZZ_CHECK(rc == -1 && err[0] && !out && !spans);
        free(tmpl);
        return 0;
    }
    FUZZ_CHECK(rc == 0 && out);
    const size_t n = strlen(out);
    /* the messages whose content becomes a span, in order */
    const bool sys_first = n_msgs > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"));
    int d = 0, turns = 0;
    for (int i = -1; i < n_msgs; i++) {
        const char *a, *b;
        if (i == -1) {          /* Llama 3.1's own system turn */
            if (kind != CHAT_LLAMA31)
                continue;
            turns++;
            if (!sys_first)
                continue;
            a = msgs[0].content;
            i = 0;
        } else {
            turns++;
            a = msgs[i].content;
        }
        b = a + strlen(a);
        char *quoted = NULL;
        if (kind == CHAT_LLAMA31 && i >= 0 && !strcmp(msgs[i].role, "tool")) {
            cJSON *s = cJSON_CreateString(a);
            quoted = s ? cJSON_PrintUnformatted(s) : NULL;
            cJSON_Delete(s);
            FUZZ_CHECK(quoted != NULL);
            a = quoted;
            b = a + strlen(a);
        } else if (kind != CHAT_CHATML) {
            while (a < b && is_space(*a))
                a++;
            while (b > a && is_space(b[-1]))
                b--;
        }
        if (a == b)
            continue;
        FUZZ_CHECK(d < n_spans);
        const size_t s0 = spans[2 * d], s1 = spans[2 * d + 1];
        FUZZ_CHECK(s0 < s1 && s1 <= n && (d == 0 || s0 >= spans[2 * d - 1]));
        FUZZ_CHECK(s1 - s0 == (size_t)(b - a) && memcmp(out + s0, a, s1 - s0) == 0);
        cJSON_free(quoted);
        d++;
    }
    FUZZ_CHECK(d == n_spans);
    fuzz_check_turns(kind, out, n, spans, n_spans, msgs, n_msgs, turns);
    free(out);
    free(spans);
    free(tmpl);
    return 0;
}
