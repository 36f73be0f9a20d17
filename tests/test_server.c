/* test_server.c - unit tests of the server's pure pieces.
 *
 * Config precedence and size parsing, container limits from fake cgroup
 * v1 and v2 trees, request validation, UTF-8 repair, the ChatML and
 * Llama 3 renderers, the MessagePack encoder's forms and the KV events'
 * count of held blocks. The scheduler under them has its own
 * tests/test_scheduler.c; the HTTP surface itself is tested black-box by
 * tests/suite_http.sh.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "auth.h"
#include "cgroup.h"
#include "chat.h"
#include "config.h"
#include "engine.h"
#include "json.h"
#include "kvevents.h"
#include "msgpack.h"
#include "scheduler.h"
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
    CHECK(auth_open_path("GET", "/ready", false) && !auth_open_path("GET", "/metrics", false) &&
          auth_open_path("GET", "/metrics", true));
    CHECK(!auth_open_path("GET", "/info", true) && !auth_open_path("GET", "/health/x", false));
    /* the dashboard's page and files are open to GET; POST / is TGI's generate */
    CHECK(auth_open_path("GET", "/", false) && auth_open_path("HEAD", "/", false) &&
          auth_open_path("GET", "/web/app.js", false));
    CHECK(!auth_open_path("POST", "/", true) && !auth_open_path("GET", "/web/", false) &&
          !auth_open_path("GET", "/web/nothing.js", false) && !auth_open_path("GET", "/web/../stats", false));
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

TEST(test_config_empty_env_counts_as_unset_and_the_address_needs_no_model)
{
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/test_server_env.conf", test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "port = 1111\nmax-queue = 7\n");
    fclose(f);
    /* an image declares every variable; empty ones leave the file in charge */
    setenv("HYSERVE_MAX_QUEUE", "", 1);
    setenv("HYSERVE_PORT", "", 1);
    setenv("HYSERVE_REPLICA", "replica-a", 1);
    char *argv[] = {"health", "--config", path, NULL};
    server_config c;
    int rc = config_load_address(&c, 3, argv, err, sizeof(err));
    unsetenv("HYSERVE_MAX_QUEUE");
    unsetenv("HYSERVE_PORT");
    unsetenv("HYSERVE_REPLICA");
    CHECK_MSG(rc == 0, "config_load_address: %s", err);
    CHECK(c.port == 1111 && c.max_queue == 7);
    CHECK(!strcmp(c.replica, "replica-a"));
    CHECK(!c.model[0]);
}

/* ---------------------------------------------------------------------- */
/* cgroup limits                                                          */
/* ---------------------------------------------------------------------- */

/* Write text to root/rel, making the directories on the way. */
static int put_file(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

TEST(test_cgroup_v2_takes_the_tightest_level_from_the_process_cgroup_up)
{
    char root[512];
    snprintf(root, sizeof root, "%s/cgroup_v2", test_tmpdir());
    mkdir(root, 0755);
    /* a pod level with 2 CPUs and 1 GiB, the container below it with 1.5
     * CPUs and no memory limit of its own */
    CHECK(put_file(root, "cgroup.controllers", "cpuset cpu io memory pids\n") == 0);
    CHECK(put_file(root, "cpu.max", "max 100000\n") == 0);
    CHECK(put_file(root, "memory.max", "max\n") == 0);
    CHECK(put_file(root, "kubepods/pod1/cpu.max", "200000 100000\n") == 0);
    CHECK(put_file(root, "kubepods/pod1/memory.max", "1073741824\n") == 0);
    CHECK(put_file(root, "kubepods/pod1/ctr/cpu.max", "150000 100000\n") == 0);
    CHECK(put_file(root, "kubepods/pod1/ctr/memory.max", "max\n") == 0);
    cgroup_limits l;
    cgroup_read(root, "0::/kubepods/pod1/ctr\n", &l);
    CHECK(l.version == 2);
    CHECK_NEAR(l.cpus, 1.5, 1e-9);
    CHECK(l.memory_bytes == 1073741824ULL);
    CHECK(cgroup_threads(&l, 8) == 1);          /* 1.5 CPUs: one thread is never throttled */
    /* a cgroup namespace shows the container as "/": the mount's own files */
    cgroup_read(root, "0::/\n", &l);
    CHECK(l.version == 2 && l.cpus == 0 && l.memory_bytes == 0);
    CHECK(cgroup_threads(&l, 8) == 0);          /* no limit: the engine takes every CPU */
}

TEST(test_cgroup_v1_reads_cfs_quota_and_memory_limit_at_the_mount)
{
    char root[512];
    snprintf(root, sizeof root, "%s/cgroup_v1", test_tmpdir());
    mkdir(root, 0755);
    /* docker on v1: the container's own cgroup is mounted, /proc/self/cgroup
     * still names the host's path, which does not exist under the mount */
    CHECK(put_file(root, "cpu,cpuacct/cpu.cfs_quota_us", "100000\n") == 0);
    CHECK(put_file(root, "cpu,cpuacct/cpu.cfs_period_us", "100000\n") == 0);
    CHECK(put_file(root, "memory/memory.limit_in_bytes", "1073741824\n") == 0);
    const char *self = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
    cgroup_limits l;
    cgroup_read(root, self, &l);
    CHECK(l.version == 1);
    CHECK_NEAR(l.cpus, 1.0, 1e-9);
    CHECK(l.memory_bytes == 1073741824ULL);
    CHECK(cgroup_threads(&l, 2) == 1);
    /* no limits: quota -1, and the huge page-aligned "unlimited" */
    CHECK(put_file(root, "cpu,cpuacct/cpu.cfs_quota_us", "-1\n") == 0);
    CHECK(put_file(root, "memory/memory.limit_in_bytes", "9223372036854771712\n") == 0);
    cgroup_read(root, self, &l);
    CHECK(l.version == 1 && l.cpus == 0 && l.memory_bytes == 0);
    /* a quota above the CPUs there are gives them all; a small one gives 1 */
    l.cpus = 6;
    CHECK(cgroup_threads(&l, 4) == 4);
    l.cpus = 0.25;
    CHECK(cgroup_threads(&l, 4) == 1);
}

TEST(test_cgroup_cache_fits_beside_the_weights_with_headroom)
{
    const uint64_t MiB = 1ULL << 20;
    /* 1 GiB: 64 MiB + 128 MiB kept back, 100 MiB of weights */
    CHECK(cgroup_headroom_bytes(1024 * MiB) == 192 * MiB);
    CHECK(cgroup_cache_fit(1024 * MiB, 100 * MiB) == 732 * MiB);
    CHECK(cgroup_cache_fit(1024 * MiB, 100 * MiB) + 100 * MiB + cgroup_headroom_bytes(1024 * MiB) == 1024 * MiB);
    /* weights that do not fit leave no room */
    CHECK(cgroup_cache_fit(128 * MiB, 200 * MiB) == 0);
    CHECK(cgroup_cache_fit(64 * MiB, 0) == 0);
}

TEST(test_cgroup_nothing_mounted_means_no_limits)
{
    cgroup_limits l;
    cgroup_read("/nonexistent/cgroup", "0::/\n", &l);
    CHECK(l.version == 0 && l.cpus == 0 && l.memory_bytes == 0);
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

TEST(test_generation_field_rules_check_limits_in_order_and_name_the_field)
{
    static const char names[2][128] = {"main", "alias"};
    const gen_limits lim = {.max_stop_len = 3, .max_n = 4, .names = names, .n_names = 2, .name = "main",
                            .n_vocab = 100};
    gen_request g;
    char err[256], param[64];
    /* a stop sequence too long comes first, before the unknown model */
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"abcd\"],\"model\":\"x\"}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_EINVALID && !strcmp(param, "stop"));
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"model\":\"x\"}", err,
                sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_EMODEL && !strcmp(param, "model") &&
          strstr(err, "serves main"));
    json_gen_free(&g);
    /* a served alias, and a URL (this endpoint) cleared */
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"model\":\"alias\"}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_OK && !strcmp(g.model, "alias"));
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"model\":\"https://h/v1\"}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_OK && !g.model[0]);
    json_gen_free(&g);
    /* --max-n, and best_of never streamed (the route's stream counts) */
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"n\":5}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_EINVALID && !strcmp(param, "n"));
    json_gen_free(&g);
    gen_limits ls = lim;
    ls.stream = true;
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"a\",\"parameters\":{\"best_of\":2,\"do_sample\":true}}", err, sizeof err) ==
          JSON_OK);
    CHECK(json_check_gen(&g, &ls, err, sizeof err, param, sizeof param) == JSON_EINVALID && g.stream &&
          !strcmp(param, "best_of"));
    json_gen_free(&g);
    /* token ids inside the vocabulary; logit_bias too */
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":[1,100]}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_EINVALID && !strcmp(param, "prompt") &&
          strstr(err, "token 100"));
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":{\"100\":1}}", err, sizeof err) == JSON_OK);
    CHECK(json_check_gen(&g, &lim, err, sizeof err, param, sizeof param) == JSON_OK);
    CHECK(json_check_bias(&g, 100, err, sizeof err) == JSON_EINVALID && strstr(err, "token 100"));
    CHECK(json_check_bias(&g, 101, err, sizeof err) == JSON_OK);
    json_gen_free(&g);
}

TEST(test_seed_is_read_from_the_body_text_as_a_64_bit_integer)
{
    gen_request g;
    char err[256];
    /* 2^64 - 59 and its neighbour are the same double; the text tells them apart */
    CHECK(parse(&g, API_TGI, "{\"inputs\":\"hi\", \"parameters\" : {\"stop\":[\"}\"],\"x\":{\"seed\":1},"
                "\"seed\" : 18446744073709551557, \"temperature\":1}}", err, sizeof(err)) == JSON_OK);
    CHECK(g.sp.seed == 18446744073709551557ull && g.seed_given);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"seed\":18446744073709551556}", err, sizeof(err)) == JSON_OK);
    CHECK(g.sp.seed == 18446744073709551556ull);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"seed\":18446744073709551615}", err, sizeof(err)) == JSON_OK);
    CHECK(g.sp.seed == UINT64_MAX);
    json_gen_free(&g);
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"a\",\"seed\":12.000}", err, sizeof(err)) == JSON_OK);
    CHECK(g.sp.seed == 12);
    json_gen_free(&g);
    static const char *const bad[] = {"18446744073709551616", "-1", "0.5", "1e3", "\"1\"", "true"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char body[128];
        snprintf(body, sizeof(body), "{\"prompt\":\"a\",\"seed\":%s}", bad[i]);
        CHECK(parse(&g, API_OAI_COMPLETION, body, err, sizeof(err)) == JSON_EINVALID);
        CHECK(strstr(err, "0..18446744073709551615") != NULL);
        json_gen_free(&g);
    }
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
    CHECK(parse(&g, API_OAI_COMPLETION, "{\"prompt\":\"x\",\"n\":0}", err, sizeof(err)) == JSON_EINVALID);
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
    chat_msg m[2] = {{"system", "Be brief.", NULL}, {"user", "Hi", NULL}};
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

/* What chat_parse_tool_calls makes of text: the number of calls, or -1
 * when *calls is NULL (the text is all content), and the content length. */
static int parse_calls(int kind, const char *text, size_t *clen, cJSON **calls)
{
    int n = chat_parse_tool_calls(kind, text, strlen(text), "t", clen, calls);
    return *calls ? n : -1;
}

TEST(test_tool_calls_keep_complete_calls_and_drop_a_cut_off_last_one)
{
    const char *one = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    char buf[512];
    size_t clen;
    cJSON *calls;
    /* two whole calls after text */
    snprintf(buf, sizeof buf, "Hi \n%s\n%s", one, one);
    CHECK(parse_calls(CHAT_CHATML, buf, &clen, &calls) == 2 && clen == 2);
    CHECK(!strcmp(cJSON_GetArrayItem(calls, 1)->child->valuestring, "call_t_1"));
    cJSON_Delete(calls);
    /* cut inside the second call's arguments, in its open tag, in the first's close tag */
    static const char *const tails[] = {"\n<tool_call>\n{\"name\": \"f\", \"argu", "\n<tool_c", "\n<tool_call>", ""};
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "%s%s", one, tails[i]);
        CHECK(parse_calls(CHAT_CHATML, buf, &clen, &calls) == 1 && clen == 0);
        cJSON_Delete(calls);
    }
    snprintf(buf, sizeof buf, "%.*s", (int)strlen(one) - 5, one);      /* "</tool_" */
    CHECK(parse_calls(CHAT_CHATML, buf, &clen, &calls) == 1);
    cJSON_Delete(calls);
    /* the only call cut off: no call, and the markup is not content */
    CHECK(parse_calls(CHAT_CHATML, "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"", &clen, &calls) == 0 &&
          clen == 2 && cJSON_GetArraySize(calls) == 0);
    cJSON_Delete(calls);
    CHECK(parse_calls(CHAT_LLAMA31, "{\"name\": \"f\", \"parameters\": {\"a\": [1, ", &clen, &calls) == 0 && clen == 0);
    cJSON_Delete(calls);
    /* not calls: text after a call, a malformed call, no tag */
    snprintf(buf, sizeof buf, "%s and more", one);
    CHECK(parse_calls(CHAT_CHATML, buf, &clen, &calls) == -1 && clen == strlen(buf));
    CHECK(parse_calls(CHAT_CHATML, "<tool_call>\nnot json\n</tool_call>", &clen, &calls) == -1);
    CHECK(parse_calls(CHAT_CHATML, "<tool_call> plain words", &clen, &calls) == -1);
    CHECK(parse_calls(CHAT_CHATML, "no calls", &clen, &calls) == -1);
}

TEST(test_llama3_templates_render_headers_trimmed_content_and_the_cutoff_system_text)
{
    /* expected strings written out from the Llama 3 and 3.1 Jinja templates */
    chat_msg m[3] = {{"system", "  Be brief. ", NULL}, {"user", "Hi\n", NULL}, {"assistant", "Hello", NULL}};
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

/* ---------------------------------------------------------------------- */
/* msgpack and KV events                                                  */
/* ---------------------------------------------------------------------- */

static bool mp_is(const mp_buf *b, const char *hex)
{
    char got[256] = "";
    for (size_t i = 0; i < b->len && 2 * i + 2 < sizeof got; i++)
        snprintf(got + 2 * i, 3, "%02x", b->data[i]);
    return !b->failed && !strcmp(got, hex);
}

/* The bytes are the MessagePack specification's forms, written out by hand. */
TEST(test_msgpack_writes_the_smallest_form_the_spec_gives_each_value)
{
    mp_buf b;
    mp_init(&b);
    mp_nil(&b); mp_bool(&b, true); mp_bool(&b, false);
    CHECK(mp_is(&b, "c0c3c2"));
    mp_reset(&b);
    mp_uint(&b, 0); mp_uint(&b, 127); mp_uint(&b, 128); mp_uint(&b, 255); mp_uint(&b, 256);
    CHECK(mp_is(&b, "007fcc80ccffcd0100"));
    mp_reset(&b);
    mp_uint(&b, 65536); mp_uint(&b, 0xffffffffu); mp_uint(&b, 0x100000000ull);
    CHECK(mp_is(&b, "ce00010000ceffffffffcf0000000100000000"));
    mp_reset(&b);
    mp_int(&b, -1); mp_int(&b, -32); mp_int(&b, -33); mp_int(&b, -129); mp_int(&b, -32769); mp_int(&b, INT64_MIN);
    CHECK(mp_is(&b, "ffe0d0dfd1ff7fd2ffff7fffd38000000000000000"));
    mp_reset(&b);
    mp_f64(&b, 1.5);
    CHECK(mp_is(&b, "cb3ff8000000000000"));
    mp_reset(&b);
    mp_cstr(&b, "BlockStored");
    CHECK(mp_is(&b, "ab426c6f636b53746f726564"));
    mp_reset(&b);
    char s32[33];
    memset(s32, 'a', 32);
    s32[32] = 0;
    mp_cstr(&b, s32);               /* past fixstr: str 8 */
    CHECK(b.len == 34 && b.data[0] == 0xd9 && b.data[1] == 32);
    mp_reset(&b);
    mp_array(&b, 15); mp_array(&b, 16); mp_array(&b, 65536); mp_bin(&b, "\x01", 1);
    CHECK(mp_is(&b, "9fdc0010dd00010000c40101"));
    mp_deinit(&b);
}

/* The drop path: an event the queue cannot take (here one past the
 * queue's 64 MiB bound: a 16M-token entry's hashes and ids) is dropped and
 * counted, never blocks the caller, and the events after it are sent. */
TEST(test_kv_events_an_event_past_the_queue_bound_is_dropped_and_counted)
{
    char err[256];
    const kvev_params p = { .endpoint = "inproc://test-kvev-drop", .topic = "kv@t:1@m", .block_tokens = 16,
                            .kind = "full_attention", .max_queue = 16 };
    kvev *k = kvev_new(&p, err, sizeof err);
    CHECK_MSG(k != NULL, "%s", err);
    const int n_big = 16 << 20;
    int32_t *big = malloc((size_t)n_big * sizeof *big);
    CHECK(big);
    for (int i = 0; i < n_big; i++)
        big[i] = i;
    int32_t small[32];
    for (int i = 0; i < 32; i++)
        small[i] = -1 - i;
    kvev_sink(k, PREFIX_EV_STORED, "", 0, big, n_big);
    kvev_sink(k, PREFIX_EV_STORED, "", 0, small, 32);
    kvev_stats st;
    for (int i = 0; i < 500; i++) {     /* the publisher sends the small one */
        kvev_get_stats(k, &st);
        if (st.queued == 0 && st.published == 1)
            break;
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    CHECK_MSG(st.dropped == 1 && st.published == 1 && st.batches == 1,
              "%llu dropped, %llu published in %llu messages", (unsigned long long)st.dropped,
              (unsigned long long)st.published, (unsigned long long)st.batches);
    /* the dropped entry's blocks still count as held: a router that missed them resynchronises at
     * the next AllBlocksCleared (docs/serving.md 16.1) */
    CHECK(st.blocks_held == (uint64_t)(n_big / 16 + 2));
    free(big);
    kvev_free(k);
}

/* Entries of random conversations stored and removed through the sink:
 * /stats' blocks_held must be the distinct full blocks of the entries
 * left, counted here by brute force over the chained hashes (enough
 * blocks that the held map grows and deletes shift runs back). */
TEST(test_kv_events_hold_a_block_while_any_entry_has_it)
{
    char err[256];
    const kvev_params p = { .endpoint = "inproc://test-kvev", .topic = "kv@t:1@m", .block_tokens = 4,
                            .kind = "full_attention", .max_queue = 1 << 16 };
    kvev *k = kvev_new(&p, err, sizeof err);
    CHECK_MSG(k != NULL, "%s", err);
    enum { N_ENTRIES = 300, MAX_TOK = 64 };
    static int32_t tok[N_ENTRIES][MAX_TOK];
    int n_tok[N_ENTRIES];
    bool live[N_ENTRIES] = { false };
    uint64_t rng = 12345;
    for (int e = 0; e < N_ENTRIES; e++) {
        /* entries share prefixes: copy a random earlier one's head, then diverge */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int from = e ? (int)((rng >> 33) % (uint64_t)e) : 0, keep = (int)((rng >> 20) % 40);
        n_tok[e] = 8 + (int)((rng >> 40) % (MAX_TOK - 8));
        for (int i = 0; i < n_tok[e]; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[e][i] = e && i < keep && i < n_tok[from] ? tok[from][i] : (int32_t)(rng >> 50);
        }
    }
    for (int step = 0; step < 3 * N_ENTRIES; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int e = (int)((rng >> 33) % N_ENTRIES);
        kvev_sink(k, live[e] ? PREFIX_EV_REMOVED : PREFIX_EV_STORED, "", 0, tok[e], n_tok[e]);
        live[e] = !live[e];
        if (step % 50 != 49)
            continue;
        /* the distinct blocks of the live entries */
        static uint64_t seen[N_ENTRIES * MAX_TOK / 4];
        int n_seen = 0;
        for (int x = 0; x < N_ENTRIES; x++) {
            if (!live[x])
                continue;
            uint64_t h = kvev_seed("", 0);
            for (int b = 0; b + 4 <= n_tok[x]; b += 4) {
                h = kvev_block_hash(h, tok[x] + b, 4);
                bool dup = false;
                for (int j = 0; j < n_seen && !dup; j++)
                    dup = seen[j] == h;
                if (!dup)
                    seen[n_seen++] = h;
            }
        }
        kvev_stats st;
        kvev_get_stats(k, &st);
        CHECK_MSG(st.blocks_held == (uint64_t)n_seen, "step %d: %llu held, %d distinct", step,
                  (unsigned long long)st.blocks_held, n_seen);
    }
    kvev_sink(k, PREFIX_EV_CLEARED, NULL, 0, NULL, 0);
    kvev_stats st;
    kvev_get_stats(k, &st);
    CHECK(st.blocks_held == 0 && st.dropped == 0);
    kvev_free(k);
}
