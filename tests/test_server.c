/* test_server.c - unit tests of the server's pure pieces.
 *
 * Config precedence and size parsing, request validation, UTF-8 repair,
 * the ChatML and Llama 3 renderers. The scheduler under them has its own
 * tests/test_scheduler.c; the HTTP surface itself is tested black-box by
 * tests/suite_http.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "chat.h"
#include "config.h"
#include "engine.h"
#include "json.h"
#include "test.h"

/* ---------------------------------------------------------------------- */
/* config                                                                 */
/* ---------------------------------------------------------------------- */

TEST(test_config_parses_byte_sizes_with_suffixes)
{
    uint64_t v;
    CHECK(config_parse_bytes("4096", &v) == 0 && v == 4096);
    CHECK(config_parse_bytes("64K", &v) == 0 && v == 65536);
    CHECK(config_parse_bytes("1.5G", &v) == 0 && v == 1610612736ULL);
    CHECK(config_parse_bytes("512MiB", &v) == 0 && v == 536870912ULL);
    CHECK(config_parse_bytes("2m", &v) == 0 && v == 2097152);
    CHECK(config_parse_bytes("-1", &v) != 0);
    CHECK(config_parse_bytes("12Q", &v) != 0);
    CHECK(config_parse_bytes("", &v) != 0);
}

TEST(test_config_precedence_is_flags_then_env_then_file_then_defaults)
{
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/test_server.conf", test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "# comment\nmodel = from-file.gguf\nport = 1111\nmax-queue = 7  # trailing\ncache-mem = 1M\n"
               "log-prompts = yes\n");
    fclose(f);
    setenv("HYSERVE_PORT", "2222", 1);
    setenv("HYSERVE_MAX_QUEUE", "8", 1);
    char *argv[] = {"serve", "--config", path, "--port=3333", "-t", "3", "--no-log-prompts", NULL};
    server_config c;
    int rc = config_load(&c, 7, argv, err, sizeof(err));
    unsetenv("HYSERVE_PORT");
    unsetenv("HYSERVE_MAX_QUEUE");
    CHECK_MSG(rc == 0, "config_load: %s", err);
    CHECK(!strcmp(c.model, "from-file.gguf"));      /* file only */
    CHECK(c.port == 3333);                          /* flag > env > file */
    CHECK(c.max_queue == 8);                        /* env > file */
    CHECK(c.cache_mem == 1048576);                  /* file */
    CHECK(c.threads == 3);
    CHECK(!c.log_prompts);                          /* flag turns off what the file set */
    CHECK(c.drain_timeout == 60.0);                 /* default */
    CHECK(!strcmp(c.config_path, path));
}

TEST(test_api_keys_repeat_and_a_higher_source_replaces_a_lower_ones_list)
{
    char path[512], kpath[512], err[256];
    snprintf(path, sizeof path, "%s/test_keys.conf", test_tmpdir());
    snprintf(kpath, sizeof kpath, "%s/test_keys.txt", test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "model = m.gguf\napi-key = file-a\napi-key = file-b\n");
    fclose(f);
    server_config c;
    char *a1[] = {"serve", "--config", path, NULL};
    CHECK(config_load(&c, 3, a1, err, sizeof err) == 0);
    CHECK(!strcmp(c.api_keys, "file-a\nfile-b\n"));               /* the file's two */
    setenv("HYSERVE_API_KEY", "env-k", 1);
    CHECK(config_load(&c, 3, a1, err, sizeof err) == 0);
    CHECK(!strcmp(c.api_keys, "env-k\n"));                          /* env over file */
    char *a2[] = {"serve", "--config", path, "--api-key", "flag-1", "--api-key=flag-2", NULL};
    CHECK(config_load(&c, 6, a2, err, sizeof err) == 0);
    unsetenv("HYSERVE_API_KEY");
    CHECK(!strcmp(c.api_keys, "flag-1\nflag-2\n"));                /* flags over both */

    /* the key set: flags and a key file together, comments skipped */
    f = fopen(kpath, "w");
    CHECK(f != NULL);
    fprintf(f, "# ops keys\n\n  file-key-1 \nfile-key-2\n");
    fclose(f);
    snprintf(c.api_key_file, sizeof c.api_key_file, "%s", kpath);
    static auth_keys k;
    CHECK_MSG(auth_load(&c, &k, err, sizeof err) == 0, "%s", err);
    CHECK(k.n == 4 && !strcmp(k.key[2], "file-key-1") && !strcmp(k.key[3], "file-key-2"));
    CHECK(auth_check(&k, "Bearer flag-1") == 1 && auth_check(&k, "Bearer file-key-2") == 4);
    CHECK(auth_check(&k, "bearer  flag-2 ") == 2);
    CHECK(auth_check(&k, "Bearer flag-3") == 0 && auth_check(&k, "Bearer flag-") == 0);
    CHECK(auth_check(&k, "Bearer flag-11") == 0 && auth_check(&k, "flag-1") == 0);
    CHECK(auth_check(&k, "Basic flag-1") == 0 && auth_check(&k, NULL) == 0 && auth_check(&k, "Bearer ") == 0);
    /* a key with a space, and a missing file, are errors that quote no key */
    snprintf(c.api_keys, sizeof c.api_keys, "two words\n");
    CHECK(auth_load(&c, &k, err, sizeof err) < 0 && strstr(err, "space") && !strstr(err, "two words"));
    snprintf(c.api_keys, sizeof c.api_keys, "ok\n");
    snprintf(c.api_key_file, sizeof c.api_key_file, "/nonexistent/keys");
    CHECK(auth_load(&c, &k, err, sizeof err) < 0 && strstr(err, "/nonexistent/keys"));
    CHECK(auth_open_path("/ready", false) && !auth_open_path("/metrics", false) && auth_open_path("/metrics", true));
    CHECK(!auth_open_path("/info", true) && !auth_open_path("/health/x", false));
}

TEST(test_config_errors_name_the_option)
{
    char err[256];
    server_config c;
    char *a1[] = {"serve", "-m", "x.gguf", "--port", "abc", NULL};
    CHECK(config_load(&c, 5, a1, err, sizeof(err)) < 0 && strstr(err, "port"));
    char *a2[] = {"serve", "-m", "x.gguf", "--bogus", NULL};
    CHECK(config_load(&c, 4, a2, err, sizeof(err)) < 0 && strstr(err, "--bogus"));
    char *a3[] = {"serve", "--config", "/nonexistent/x.conf", NULL};
    CHECK(config_load(&c, 3, a3, err, sizeof(err)) < 0 && strstr(err, "/nonexistent/x.conf"));
    char *a4[] = {"serve", "--config", "/dev/null", NULL};
    CHECK(config_load(&c, 3, a4, err, sizeof(err)) < 0 && strstr(err, "no model"));
}

/* ---------------------------------------------------------------------- */
/* json                                                                   */
/* ---------------------------------------------------------------------- */

static int parse(gen_request *g, int api, const char *body, char *err, size_t errlen)
{
    char param[64];
    return json_parse_gen(g, api, body, strlen(body), 4, err, errlen, param, sizeof(param));
}

TEST(test_tgi_request_defaults_to_greedy_and_samples_when_asked)
{
    gen_request g;
    char err[256];
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"hi\"}", err, sizeof(err)) == JSON_OK);
    CHECK(g.sp.greedy && g.max_new_tokens == -1 && !g.stream);
    json_gen_free(&g);
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"hi\",\"parameters\":{\"temperature\":0.5,\"seed\":9,\"stop\":[\"a\",\"bc\"]}}",
                err, sizeof(err)) == JSON_OK);
    CHECK(!g.sp.greedy && g.sp.seed == 9 && g.seed_given && g.n_stop == 2 && !strcmp(g.stop[1], "bc"));
    json_gen_free(&g);
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"hi\",\"parameters\":{\"do_sample\":true}}", err, sizeof(err)) == JSON_OK);
    CHECK(!g.sp.greedy);
    json_gen_free(&g);
}

TEST(test_request_validation_rejects_with_the_field_named)
{
    gen_request g;
    char err[256];
    CHECK(parse(&g, API_TGI, "{\"inputs\":", err, sizeof(err)) == JSON_EPARSE);
    json_gen_free(&g);
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"x\",\"parameters\":{\"top_p\":1.0}}", err, sizeof(err)) == JSON_EINVALID);
    CHECK(strstr(err, "top_p") != NULL);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"x\",\"n\":2}", err, sizeof(err)) == JSON_EINVALID);
    CHECK(strstr(err, "`n`") != NULL);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", err, sizeof(err)) ==
          JSON_EINVALID);
    CHECK(strstr(err, "wizard") != NULL);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"x\",\"temperature\":0,\"stop\":\"\\n\",\"max_tokens\":3}", err,
                sizeof(err)) == JSON_OK);
    CHECK(g.sp.greedy && g.n_stop == 1 && g.max_new_tokens == 3);
    json_gen_free(&g);
}

TEST(test_json_text_replaces_invalid_utf8)
{
    cJSON *s = json_text("a\xff" "b\xe2\x82" "c\xe2\x82\xac", 9);
    CHECK(s != NULL);
    CHECK(!strcmp(s->valuestring, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xe2\x82\xac"));
    cJSON_Delete(s);
    s = json_text("\xed\xa0\x80", 3);   /* a surrogate is not valid UTF-8 */
    CHECK(s && !strcmp(s->valuestring, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"));
    cJSON_Delete(s);
}

TEST(test_chatml_renders_messages_and_the_generation_prompt)
{
    chat_msg m[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *out = NULL, err[256];
    size_t *data = NULL;
    int n_data = 0;
    CHECK(chat_detect(NULL) == CHAT_NONE);
    CHECK(chat_detect("{% for m in messages %}{{ m.content }}{% endfor %}") == CHAT_UNKNOWN);
    CHECK(chat_detect("{{'<|im_start|>' + m.role}}...<|im_end|>") == CHAT_CHATML);
    CHECK(chat_render(CHAT_CHATML, m, 2, &out, &data, &n_data, err, sizeof(err)) == 0);
    CHECK(!strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n"));
    /* the content spans: "Be brief." at 19 and "Hi" at 56 */
    CHECK(n_data == 2 && data[0] == 19 && data[1] == 28 && data[2] == 56 && data[3] == 58);
    CHECK(!memcmp(out + data[0], "Be brief.", 9) && !memcmp(out + data[2], "Hi", 2));
    free(out);
    free(data);
    CHECK(chat_render(CHAT_UNKNOWN, m, 2, &out, &data, &n_data, err, sizeof(err)) < 0 && strstr(err, "ChatML") && strstr(err, "Llama 3"));
}

TEST(test_llama3_templates_render_headers_trimmed_content_and_the_cutoff_system_text)
{
    /* expected strings written out from the Llama 3 and 3.1 Jinja templates */
    chat_msg m[3] = {{"system", "  Be brief. "}, {"user", "Hi\n"}, {"assistant", "Hello"}};
    char *out = NULL, err[256];
    size_t *data = NULL;
    int n_data = 0;
    CHECK(chat_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}...<|eot_id|>") ==
          CHAT_LLAMA3);
    CHECK(chat_detect("Cutting Knowledge Date: December 2023 <|start_header_id|> <|end_header_id|> <|eot_id|>") ==
          CHAT_LLAMA31);
    CHECK(chat_render(CHAT_LLAMA3, m, 3, &out, &data, &n_data, err, sizeof(err)) == 0);
    CHECK(!strcmp(out, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    /* content spans cover the trimmed text only */
    CHECK(n_data == 3 && !memcmp(out + data[0], "Be brief.<", 10) && data[1] - data[0] == 9 &&
          data[3] - data[2] == 2 && !memcmp(out + data[4], "Hello", 5) && data[5] - data[4] == 5);
    free(out);
    free(data);
    CHECK(chat_render(CHAT_LLAMA31, m + 1, 1, &out, &data, &n_data, err, sizeof(err)) == 0);
    CHECK(!strcmp(out, "<|start_header_id|>system<|end_header_id|>\n\n"
                       "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    /* the cutoff lines are the template's, not the request's */
    CHECK(n_data == 1 && !memcmp(out + data[0], "Hi<|eot_id|>", 12));
    free(out);
    free(data);
    CHECK(chat_render(CHAT_LLAMA31, m, 2, &out, &data, &n_data, err, sizeof(err)) == 0);
    CHECK(strstr(out, "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user") != NULL);
    free(out);
    free(data);
}
