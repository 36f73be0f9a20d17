/* fuzz_json.c - libFuzzer target: request bodies of every JSON route.
 *
 * Input: byte 0 picks the route (TGI /generate and friends, OpenAI
 * /v1/completions, /v1/chat/completions, /tokenize), the rest is the body.
 * Properties: parsing either accepts or names the problem (err non-empty);
 * an accepted request keeps its fields inside the documented ranges
 * (docs/serving.md 2.1, 3.1): at most max_stop stop strings, none empty;
 * max_new_tokens -1 or at least 1; temperature, top_p finite and not
 * negative; token-id prompts non-empty; chat messages rendered with each
 * template put every message's content in a data span, and the markup
 * outside the spans opens exactly one turn per message plus the
 * generation prompt (content cannot forge a turn). json_text makes any
 * bytes a string that prints and parses back to itself.
 */
#include <math.h>
#include <string.h>

#include "chat.h"
#include "fuzz.h"
#include "json.h"

#define MAX_STOP 4

static void check_render(const gen_request *g)
{
    static const int kinds[] = { CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA31 };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        char *out, err[256];
        size_t *data;
        int n_data;
        if (chat_render(kinds[k], g->msgs, g->n_msgs, &out, &data, &n_data, err, sizeof err) != 0) {
            FUZZ_CHECK(err[0]);
            continue;
        }
        const size_t n = strlen(out);
        for (int d = 0; d < n_data; d++) {
            FUZZ_CHECK(data[2 * d] < data[2 * d + 1] && data[2 * d + 1] <= n);
            FUZZ_CHECK(d == 0 || data[2 * d] >= data[2 * d - 1]);
        }
        bool calls = false;     /* a tool call's name and arguments are data spans of their own */
        for (int i = 0; i < g->n_msgs; i++)
            calls |= g->msgs[i].tool_calls != NULL;
        FUZZ_CHECK(calls || n_data <= g->n_msgs + 1);
        const int turns = g->n_msgs + (kinds[k] == CHAT_LLAMA31 &&
                                       (g->n_msgs == 0 || (strcmp(g->msgs[0].role, "system") &&
                                                           strcmp(g->msgs[0].role, "developer"))));
        fuzz_check_turns(kinds[k], out, n, data, n_data, g->msgs, g->n_msgs, turns);
        free(out);
        free(data);
    }
}

static void check_text(const char *s, size_t len)
{
    cJSON *it = json_text(s, len);
    if (!it)
        return;
    char *printed = cJSON_PrintUnformatted(it);
    if (printed) {
        cJSON *back = cJSON_Parse(printed);
        FUZZ_CHECK(back && cJSON_IsString(back) && strcmp(back->valuestring, it->valuestring) == 0);
        cJSON_Delete(back);
        free(printed);
    }
    cJSON_Delete(it);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int route = data[0] & 3;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    char err[512], param[64];
    err[0] = 0;
    if (route == 3) {
        char *inputs = NULL;
        int rc = json_parse_tokenize(body, len, &inputs, err, sizeof err);
        FUZZ_CHECK(rc == JSON_OK ? inputs != NULL : err[0] && !inputs);
        free(inputs);
        check_text(body, len);
        return 0;
    }
    const int api = route == 0 ? API_TGI : route == 1 ? API_OAI_COMPLETION : API_OAI_CHAT;
    gen_request g;
    int rc = json_parse_gen(&g, api, body, len, MAX_STOP, err, sizeof err, param, sizeof param);
    if (rc != JSON_OK) {
        FUZZ_CHECK(err[0]);
    } else {
        FUZZ_CHECK(g.n_stop >= 0 && g.n_stop <= MAX_STOP);
        for (int i = 0; i < g.n_stop; i++)
            FUZZ_CHECK(g.stop[i] && g.stop[i][0]);
        FUZZ_CHECK(g.max_new_tokens == -1 || g.max_new_tokens >= 1);
        FUZZ_CHECK(g.truncate >= 0);
        FUZZ_CHECK(isfinite(g.sp.temperature) && g.sp.temperature >= 0);
        FUZZ_CHECK(isfinite(g.sp.top_p) && g.sp.top_p >= 0 && g.sp.top_p <= 1);
        if (api == API_OAI_CHAT) {
            FUZZ_CHECK(g.n_msgs >= 1 && g.msgs);
            check_render(&g);
        } else if (api == API_OAI_COMPLETION) {
            FUZZ_CHECK(g.prompt ? g.prompt[0] != 0 : g.n_prompt_ids > 0 && g.prompt_ids);
        } else {
            FUZZ_CHECK(g.prompt != NULL);
        }
    }
    json_gen_free(&g);
    return 0;
}
