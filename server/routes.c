/* routes.c - the route table and the small request handlers.
 *
 * Owns: one handler per route, the key check and CORS preflight before
 * them, 404 and 405.
 * Does not own: libmicrohttpd (http.c), the generation flow of the five
 * generation routes (generate.c), error statuses and envelopes
 * (errors.c), field rules (json.c), /stats and /metrics contents
 * (metrics.c).
 * ref: docs/serving.md 1 (routes).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "chat.h"
#include "errors.h"
#include "generate.h"
#include "json.h"
#include "memest.h"
#include "config.h"
#include "cors.h"
#include "metrics.h"
#include "anthropic.h"
#include "presets.h"
#include "responses.h"
#include "routes.h"
#include "serve.h"
#include "tokenizer.h"
#include "web.h"

/* ---------------------------------------------------------------------- */
/* The generation routes: one flow for the five (generate.c)           */
/* ---------------------------------------------------------------------- */

static int h_generate(http_req *hr) { return generate_route(hr, API_TGI, GEN_BODY); }
static int h_generate_stream(http_req *hr) { return generate_route(hr, API_TGI, GEN_STREAM); }
static int h_compat(http_req *hr) { return generate_route(hr, API_TGI, GEN_COMPAT); }
static int h_completions(http_req *hr) { return generate_route(hr, API_OAI_COMPLETION, GEN_BODY); }
static int h_chat(http_req *hr) { return generate_route(hr, API_OAI_CHAT, GEN_BODY); }
static int h_completions_render(http_req *hr) { return generate_render(hr, API_OAI_COMPLETION); }
static int h_chat_render(http_req *hr) { return generate_render(hr, API_OAI_CHAT); }

/* ---------------------------------------------------------------------- */
/* Other routes                                                           */
/* ---------------------------------------------------------------------- */

static int h_health(http_req *hr)
{
    /* constant time: no lock, no engine */
    bool failed = atomic_load(&hr->srv->state) == SERVER_FAILED;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", failed ? "failed" : "ok");
    return http_send_json(hr, failed ? 503 : 200, o, NULL);
}

static int h_ready(http_req *hr)
{
    int st = atomic_load(&hr->srv->state);
    static const char *const names[] = {"loading", "ready", "draining", "failed"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", names[st >= 0 && st <= 3 ? st : 3]);
    if (st == SERVER_READY)
        return http_send_json(hr, 200, o, NULL);
    const char *hdrs[] = {"Retry-After", "5", NULL};
    return http_send_json(hr, 503, o, st == SERVER_FAILED ? NULL : hdrs);
}

/* /info "container": the limits seen at start and the defaults they gave
 * (serve.c apply_limits). A missing limit is null. */
static void info_add_container(cJSON *o, const server *srv)
{
    const server_limits *lim = &srv->limits;
    cJSON *k = cJSON_AddObjectToObject(o, "container");
    if (!k)
        return;
    if (lim->cg.version)
        cJSON_AddNumberToObject(k, "cgroup_version", lim->cg.version);
    else
        cJSON_AddNullToObject(k, "cgroup_version");
    if (lim->cg.cpus > 0)
        cJSON_AddNumberToObject(k, "cpu_limit", lim->cg.cpus);
    else
        cJSON_AddNullToObject(k, "cpu_limit");
    if (lim->cg.memory_bytes)
        cJSON_AddNumberToObject(k, "memory_limit_bytes", (double)lim->cg.memory_bytes);
    else
        cJSON_AddNullToObject(k, "memory_limit_bytes");
    engine_kernels ek;
    engine_get_kernels(&ek);
    cJSON_AddNumberToObject(k, "threads", ek.threads);
    cJSON_AddStringToObject(k, "threads_from", lim->threads_from ? lim->threads_from : "");
    cJSON_AddNumberToObject(k, "cache_budget_bytes", (double)srv->info->cache_budget_bytes);
    cJSON_AddStringToObject(k, "cache_budget_from", lim->cache_from ? lim->cache_from : "");
    if (lim->cache_fit_bytes) {
        cJSON_AddNumberToObject(k, "cache_fit_bytes", (double)lim->cache_fit_bytes);
        cJSON_AddNumberToObject(k, "headroom_bytes", (double)lim->headroom_bytes);
    } else {
        cJSON_AddNullToObject(k, "cache_fit_bytes");
        cJSON_AddNullToObject(k, "headroom_bytes");
    }
    cJSON_AddNumberToObject(k, "model_file_bytes", (double)lim->model_file_bytes);
    cJSON_AddStringToObject(k, "kernels", ek.simd);
    cJSON_AddStringToObject(k, "bf16_decode", ek.bf16_decode);
    cJSON_AddStringToObject(k, "bf16_prompt", ek.bf16_prompt);
    cJSON_AddStringToObject(k, "f16_prompt", ek.f16_prompt);
    cJSON_AddStringToObject(k, "f32_prompt", ek.f32_prompt);
    cJSON_AddStringToObject(k, "int8_prompt", ek.int8_prompt);
}

static void info_add_routes(cJSON *o);

static int h_info(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    server *srv = hr->srv;
    const engine_info *in = srv->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_id", server_model_name(srv));
    cJSON_AddNullToObject(o, "model_sha");
    cJSON_AddStringToObject(o, "model_dtype", in->weights_dtype);
    cJSON_AddStringToObject(o, "model_pipeline_tag", "text-generation");
    cJSON_AddNumberToObject(o, "max_concurrent_requests", in->max_seqs + srv->cfg->max_queue);
    cJSON_AddNumberToObject(o, "max_best_of", srv->cfg->max_n);     /* TGI best_of up to --max-n */
    cJSON_AddNumberToObject(o, "max_stop_sequences", srv->cfg->max_stop);
    cJSON_AddNumberToObject(o, "max_input_tokens", in->n_ctx - 1);
    cJSON_AddNumberToObject(o, "max_total_tokens", in->n_ctx);
    cJSON_AddNumberToObject(o, "validation_workers", 0);
    cJSON_AddNumberToObject(o, "max_client_batch_size", 1);
    cJSON_AddStringToObject(o, "router", "hyserve");
    cJSON_AddStringToObject(o, "version", hyserve_version());
    cJSON_AddStringToObject(o, "git_commit", hyserve_git_commit());
    cJSON_AddNullToObject(o, "sha");
    cJSON_AddNullToObject(o, "docker_label");
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "arch", in->arch);
    cJSON_AddStringToObject(m, "name", server_model_name(srv));  /* as model_id: the one name requests send */
    cJSON_AddStringToObject(m, "general_name", in->name);         /* the file's general.name, for reference */
    cJSON_AddNumberToObject(m, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(m, "weight_bytes", (double)in->weight_bytes);
    cJSON_AddNumberToObject(m, "n_vocab", in->n_vocab);
    cJSON_AddNumberToObject(m, "n_embd", in->n_embd);
    cJSON_AddNumberToObject(m, "n_layer", in->n_layer);
    cJSON_AddNumberToObject(m, "n_attn_layers", in->n_attn_layers);
    cJSON_AddNumberToObject(m, "n_dnet_layers", in->n_dnet_layers);
    cJSON_AddNumberToObject(m, "n_mamba2_layers", in->n_mamba2_layers);
    cJSON_AddNumberToObject(m, "n_shortconv_layers", in->n_sconv_layers);
    cJSON_AddNumberToObject(m, "n_mamba_layers", in->n_mamba_layers);
    cJSON_AddNumberToObject(m, "n_kda_layers", in->n_kda_layers);
    cJSON_AddNumberToObject(m, "n_recurrent_layers", in->n_rec_layers);
    cJSON_AddNumberToObject(m, "n_ctx_train", in->n_ctx_train);
    cJSON_AddStringToObject(m, "chat_template", chat_kind_name(srv->chat_kind));
    cJSON *c = cJSON_AddObjectToObject(o, "cache_layout");
    cJSON_AddStringToObject(c, "kind", in->n_rec_layers > 0 && in->n_attn_layers + in->n_mla_layers > 0 ? "hybrid"
                                       : in->n_rec_layers > 0                                             ? "recurrent"
                                                                                                          : "attention");
    cJSON_AddNumberToObject(c, "page_tokens", in->page_tokens);
    cJSON_AddNumberToObject(c, "kv_bytes_per_token", (double)in->kv_bytes_per_token);
    cJSON_AddNumberToObject(c, "dnet_state_bytes_per_seq", (double)in->dnet_state_bytes_per_seq);
    cJSON_AddNumberToObject(c, "dnet_conv_bytes_per_seq", (double)in->dnet_conv_bytes_per_seq);
    cJSON_AddNumberToObject(c, "recurrent_state_bytes_per_seq", (double)in->rec_state_bytes_per_seq);
    cJSON_AddNumberToObject(c, "recurrent_conv_bytes_per_seq", (double)in->rec_conv_bytes_per_seq);
    cJSON_AddNumberToObject(c, "mha_bytes_per_token", (double)in->mha_bytes_per_token);
    cJSON_AddNumberToObject(c, "budget_bytes", (double)in->cache_budget_bytes);
    cJSON_AddNumberToObject(c, "max_seqs", in->max_seqs);
    cJSON_AddStringToObject(o, "replica", srv->replica);
    info_add_routes(o);
    info_add_container(o, srv);
    return http_send_json(hr, 200, o, NULL);
}

static int h_models(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    const engine_info *in = hr->srv->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    /* one entry per served name (aliases of the one model) */
    for (int i = 0; i < hr->srv->n_model_names || i == 0; i++) {
        cJSON *m = cJSON_CreateObject();
        json_push(data, m);
        cJSON_AddStringToObject(m, "id", i < hr->srv->n_model_names ? hr->srv->model_names[i] : in->name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)hr->srv->started_at);
        cJSON_AddStringToObject(m, "owned_by", "hyserve");
        /* vLLM's: the context a request may fill, the model it is (the one) */
        cJSON_AddNumberToObject(m, "max_model_len", in->n_ctx);
        cJSON_AddStringToObject(m, "root", server_model_name(hr->srv));
        cJSON_AddNullToObject(m, "parent");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddNumberToObject(meta, "n_vocab", in->n_vocab);
        cJSON_AddNumberToObject(meta, "n_ctx_train", in->n_ctx_train);
        cJSON_AddNumberToObject(meta, "n_ctx", in->n_ctx);
        cJSON_AddNumberToObject(meta, "n_params", (double)in->n_params);
        cJSON_AddNumberToObject(meta, "size", (double)in->weight_bytes);
    }
    return http_send_json(hr, 200, o, NULL);
}

/* GET /props: the facts llama-server's clients read from its /props (its
 * web UI, editors' plugins): the context a slot holds and how many slots,
 * the file, the chat template, the special tokens, the build. The
 * defaults are those of the OpenAI routes (sampling off unless asked,
 * temperature 1). hyserve has no POST /props: settings are fixed at start. */
static void props_add_piece(cJSON *o, const char *name, const tokenizer *t, int32_t id)
{
    char b[256];
    int n = id >= 0 ? tok_piece(t, id, b, sizeof b) : -1;
    if (n >= 0 && (size_t)n < sizeof b) {
        b[n] = 0;
        cJSON_AddStringToObject(o, name, b);
    } else {
        cJSON_AddNullToObject(o, name);
    }
}

static int h_props(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    server *srv = hr->srv;
    const engine_info *in = srv->info;
    const tokenizer *t = engine_tokenizer(srv->eng);
    sampler_params sp;
    sampler_params_default(&sp);
    cJSON *o = cJSON_CreateObject();
    cJSON *d = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", in->n_ctx);
    cJSON_AddBoolToObject(d, "speculative", false);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    cJSON_AddNumberToObject(p, "n_predict", srv->cfg->default_max_tokens);
    cJSON_AddNumberToObject(p, "max_tokens", srv->cfg->default_max_tokens);
    cJSON_AddNumberToObject(p, "temperature", sp.temperature);
    cJSON_AddNumberToObject(p, "top_k", sp.top_k);
    cJSON_AddNumberToObject(p, "top_p", sp.top_p);
    cJSON_AddNumberToObject(p, "min_p", sp.min_p);
    cJSON_AddNumberToObject(p, "typical_p", sp.typical_p);
    cJSON_AddNumberToObject(p, "repeat_penalty", sp.repetition_penalty);
    cJSON_AddNumberToObject(p, "presence_penalty", sp.presence_penalty);
    cJSON_AddNumberToObject(p, "frequency_penalty", sp.frequency_penalty);
    cJSON_AddArrayToObject(p, "stop");
    cJSON_AddNumberToObject(o, "total_slots", in->max_seqs);
    cJSON_AddStringToObject(o, "model_alias", server_model_name(srv));
    cJSON_AddStringToObject(o, "model_path", srv->cfg->synth[0] ? srv->cfg->synth : srv->cfg->model);
    cJSON_AddStringToObject(o, "chat_template", in->chat_template ? in->chat_template : "");
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(mod, "vision", false);
    cJSON_AddBoolToObject(mod, "audio", false);
    props_add_piece(o, "bos_token", t, tok_bos(t));
    props_add_piece(o, "eos_token", t, tok_eos(t));
    char build[128];
    snprintf(build, sizeof build, "hyserve %s-%s", hyserve_version(), hyserve_git_commit());
    cJSON_AddStringToObject(o, "build_info", build);
    return http_send_json(hr, 200, o, NULL);
}

/* POST /detokenize: {"tokens": [ids]} -> the text they spell, as
 * llama-server's "content" and vLLM's "prompt" (the same string). A BOS
 * the model adds is skipped when it comes first, so /tokenize's ids come
 * back to its input. */
static int h_detokenize(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    server *srv = hr->srv;
    char err[256];
    int32_t *ids = NULL;
    int n = 0;
    int jrc = json_parse_detokenize(hr->body, hr->n_body, srv->info->n_vocab - 1, &ids, &n, err, sizeof(err));
    if (jrc != JSON_OK)
        return errors_reply(hr, errors_of_json(jrc),
                            err);
    char *text = NULL, piece[512];
    size_t len = 0, cap = 0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 && srv->info->add_bos && ids[0] == srv->info->bos_id)
            continue;
        int pl = tok_piece(engine_tokenizer(srv->eng), ids[i], piece, sizeof(piece));
        if (pl > (int)sizeof(piece))
            pl = (int)sizeof(piece);
        if (pl > 0 && json_buf_append(&text, &len, &cap, piece, (size_t)pl)) {
            rc = errors_reply(hr, ERR_INTERNAL, "out of memory");
            goto out;
        }
    }
    cJSON *o = cJSON_CreateObject();
    json_add_text(o, "content", text ? text : "", len);
    json_add_text(o, "prompt", text ? text : "", len);
    rc = http_send_json(hr, 200, o, NULL);
out:
    free(text);
    free(ids);
    return rc;
}

static int h_tokenize(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    server *srv = hr->srv;
    char err[256], *inputs = NULL;
    int32_t *toks = NULL;
    int jrc = json_parse_tokenize(hr->body, hr->n_body, &inputs, err, sizeof(err));
    if (jrc != JSON_OK)
        return errors_reply(hr, errors_of_json(jrc), err);
    int n = generate_tokenize(srv, inputs, NULL, 0, &toks);
    free(inputs);
    if (n < 0)
        return errors_reply(hr, ERR_INTERNAL, "out of memory while tokenizing the input");   /* any text encodes */
    /* the answer costs about 80 bytes a token: bound it by what a request
     * can hold (a 2 MB body of CJK text is over a million tokens) */
    if (n > srv->info->n_ctx) {
        free(toks);
        malloc_trim(0);
        snprintf(err, sizeof err, "the input is %d tokens, more than the %d a request can hold "
                                  "(max_input_tokens); /tokenize answers up to that many", n, srv->info->n_ctx);
        return errors_reply(hr, ERR_CONTEXT, err);
    }
    cJSON *arr = cJSON_CreateArray();
    size_t off = 0;
    char piece[512];
    for (int i = 0; arr && i < n; i++) {
        int pl = tok_piece(engine_tokenizer(srv->eng), toks[i], piece, sizeof(piece));
        if (pl < 0)
            pl = 0;
        if ((size_t)pl > sizeof(piece))
            pl = (int)sizeof(piece);
        bool added_bos = i == 0 && srv->info->add_bos && toks[0] == srv->info->bos_id;
        cJSON *t = cJSON_CreateObject();
        json_push(arr, t);
        cJSON_AddNumberToObject(t, "id", toks[i]);
        json_add_text(t, "text", piece, (size_t)pl);
        cJSON_AddNumberToObject(t, "start", (double)off);
        if (!added_bos)
            off += (size_t)pl;
        cJSON_AddNumberToObject(t, "stop", (double)off);
    }
    free(toks);
    int rc = http_send_json(hr, 200, arr, NULL);
    /* many small nodes were freed: hand the pages back to the system */
    if (n > 4096)
        malloc_trim(0);
    return rc;
}

/* Is name one of config/presets/ (a name, never a path: "qwen3.5-9b" has a
 * dot, so the check is membership, not a character filter)? */
/* POST /apply-template (llama-server's name): the chat body's prompt text,
 * exactly as /v1/chat/completions would feed it to the model, tools and
 * tool calls included: {"prompt": "..."}. */
static int h_apply_template(http_req *hr)
{
    server *srv = hr->srv;
    gen_request g;
    char err[512], param[64];
    char *prompt = NULL;
    size_t *content = NULL;
    int n_content = 0, rc;
    int jrc = json_parse_gen(&g, API_OAI_CHAT, hr->body, hr->n_body, srv->cfg->max_stop, err, sizeof(err), param,
                             sizeof(param));
    if (jrc != JSON_OK) {
        json_gen_free(&g);
        return errors_reply(hr, errors_of_json(jrc), err);
    }
    const char *tools = g.tool_choice != TOOL_CHOICE_NONE ? g.tools : NULL;
    int crc = chat_render_tools(srv->chat_kind, g.msgs, g.n_msgs, tools, g.no_think, g.tools_in_system, &prompt,
                                &content, &n_content, err, sizeof(err));
    if (crc) {
        rc = errors_reply(hr, crc == CHAT_ENOMEM ? ERR_INTERNAL : ERR_TEMPLATE, err);
    } else {
        cJSON *o = cJSON_CreateObject();
        json_add_text(o, "prompt", prompt, strlen(prompt));
        rc = http_send_json(hr, 200, o, NULL);
    }
    free(prompt);
    free(content);
    json_gen_free(&g);
    return rc;
}

/* POST /v1/memory/estimate: the planner (memplan.c) over HTTP, no weights;
 * memest.c reads the body. */
static int h_memory_estimate(http_req *hr)
{
    server *srv = hr->srv;
    char err[512];
    memplan_layout served;
    const bool loaded = atomic_load(&srv->state) == SERVER_READY || atomic_load(&srv->state) == SERVER_DRAINING;
    if (loaded) {
        engine_get_memplan(srv->eng, &served);
        snprintf(served.name, sizeof(served.name), "%s", server_model_name(srv));
    }
    memest_req q;
    int jrc = memest_parse(hr->body, hr->n_body, loaded ? &served : NULL, loaded ? srv->info->n_ctx : 0, &q, err,
                           sizeof(err));
    if (jrc != JSON_OK)
        return errors_reply(hr, errors_of_json(jrc), err);
    cJSON *r = memplan_estimate_json(&q.l, q.context, q.batch, q.budget);
    /* speculation's share: asked for, or by default when the served model
     * is estimated and the server speculates; the draft model is the
     * server's own, so only with the served model */
    const bool spec = q.speculative >= 0 ? q.speculative == 1
                                         : q.served && strcmp(srv->cfg->spec_type, "none") != 0;
    if (r && spec) {
        memplan_layout dl;
        engine *draft = q.served ? srv->draft : NULL;
        if (draft)
            engine_get_memplan(draft, &dl);
        memplan_spec_add_json(r, &q.l, draft ? &dl : NULL, draft ? engine_get_info(draft)->weight_bytes : 0,
                              q.served && !strcmp(srv->cfg->spec_type, "draft-mtp"), q.context, q.batch, q.budget);
    }
    return http_send_json(hr, 200, r, NULL);
}

/* GET /v1/memory/presets: the names POST /v1/memory/estimate takes as
 * "preset" (config/presets/, or $HYSERVE_PRESETS), for the dashboard's
 * planner. */
static int h_memory_presets(http_req *hr)
{
    char names[64][PRESET_NAME_MAX];
    int n = preset_list(names, 64);
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "presets");
    for (int i = 0; arr && i < n; i++)
        json_push(arr, cJSON_CreateString(names[i]));
    return http_send_json(hr, 200, o, NULL);
}

static int h_stats(http_req *hr)
{
    /* still useful while draining: watch the in-flight work finish */
    if (atomic_load(&hr->srv->state) != SERVER_DRAINING && !errors_ready(hr))
        return 0;
    const char *rid = http_query(hr, "request_id");
    const char *reqs = http_query(hr, "requests");
    bool with = !(reqs && !strcmp(reqs, "0"));
    /* a key sees its own live requests (their ids, tags, sizes); the totals
     * stay the server's. Without keys, or open by --metrics-public, all. */
    return http_send_json(hr, 200, metrics_stats_json(hr->srv, rid, with, hr->key_id), NULL);
}

static int h_metrics(http_req *hr)
{
    char *txt = metrics_prometheus(hr->srv);
    if (!txt)
        return errors_reply(hr, ERR_INTERNAL, "out of memory");
    int rc = http_send(hr, 200, "text/plain; version=0.0.4; charset=utf-8", txt, strlen(txt), NULL);
    free(txt);
    return rc;
}

/* POST /reset_prefix_cache (vLLM's route): empty the prefix cache. Never
 * refused for running requests: it drops the entries, and a running
 * request forked from one keeps the pages it shares until it ends. Says
 * what it freed. */
static int h_reset_prefix(http_req *hr)
{
    if (!errors_ready(hr))
        return 0;
    sched_prefix_freed f;
    if (sched_prefix_reset(hr->srv->sched, &f) != SCHED_OK)
        return errors_reply(hr, ERR_DRAINING, "the server is shutting down");
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddBoolToObject(o, "enabled", f.enabled) ||
        !cJSON_AddNumberToObject(o, "freed_entries", f.entries) ||
        !cJSON_AddNumberToObject(o, "freed_snapshots", f.snapshots) ||
        !cJSON_AddNumberToObject(o, "freed_store_bytes", (double)f.bytes) ||
        !cJSON_AddNumberToObject(o, "freed_pool_bytes", (double)f.pool_freed_bytes) ||
        !cJSON_AddNumberToObject(o, "pool_reserved_bytes", (double)f.pool_reserved_bytes) ||
        !cJSON_AddNumberToObject(o, "running_requests", f.running)) {
        cJSON_Delete(o);
        return errors_reply(hr, ERR_INTERNAL, "out of memory");
    }
    return http_send_json(hr, 200, o, NULL);
}

/* DELETE /requests/{id}: cancel a request by its X-Request-Id, for
 * clients that cannot close their socket. Its own client gets the
 * cancellation (an error event on a stream). */
static int h_cancel(http_req *hr)
{
    if (atomic_load(&hr->srv->state) != SERVER_DRAINING && !errors_ready(hr))
        return 0;
    const char *id = hr->path + strlen("/requests/");
    char msg[200];
    /* only the key that made a request may cancel it: another key's
     * request is as unknown to it as a finished one */
    if (!*id || sched_cancel_id(hr->srv->sched, id, hr->key_id, "request cancelled by DELETE /requests/{id}") != 0) {
        snprintf(msg, sizeof(msg), "no queued or running request has the id '%.100s'", id);
        return errors_reply(hr, ERR_NOT_FOUND, msg);
    }
    return http_send(hr, 204, NULL, "", 0, NULL);
}

/* GET / and GET /web/NAME: the dashboard, embedded at build time (web.h).
 * Static files that hold no data, so they are served without a key and
 * before the model is loaded; the page asks the API for everything it
 * shows. The policy allows only this origin's scripts, styles and API
 * calls: the page has no inline script or style to allow. */
static int h_web(http_req *hr)
{
    const web_asset *a = web_find(hr->path);
    if (!a) {
        char msg[320];
        snprintf(msg, sizeof(msg), "no dashboard file %s", hr->path);
        return errors_reply(hr, ERR_NOT_FOUND, msg);
    }
    static const char *const hdrs[] = {
        "Cache-Control", "no-store",
        "Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "
                                   "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                                   "form-action 'none'; frame-ancestors 'none'",
        "X-Content-Type-Options", "nosniff",
        "Referrer-Policy", "no-referrer",
        NULL,
    };
    return http_send(hr, 200, a->content_type, (const char *)a->data, a->len, hdrs);
}

/* GET /debug/fault, test builds started with HYSERVE_FAULT_LIVE=1 only
 * (fault.h; a 404 like any unknown path otherwise): the request arrived
 * disarmed (http.c); says whether the failure armed by the last
 * X-Hyserve-Fault-Nth happened, and how many allocations it had left. */
static int h_debug_fault(http_req *hr)
{
    if (!fault_live()) {
        char msg[400];
        snprintf(msg, sizeof(msg), "no route %s %s; GET /info lists the routes (\"routes\")", hr->method, hr->path);
        return errors_reply(hr, ERR_NOT_FOUND, msg);
    }
    bool fired;
    int remaining;
    fault_taken(&fired, &remaining);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "fired", fired);
    cJSON_AddNumberToObject(o, "remaining", remaining);
    return http_send_json(hr, 200, o, NULL);
}

/* ---------------------------------------------------------------------- */
/* The table                                                              */
/* ---------------------------------------------------------------------- */

typedef struct route {
    const char *method;
    const char *path;           /* exact, or a prefix when it ends with '/' and is not "/" */
    int (*fn)(http_req *hr);
} route;

static const route ROUTES[] = {
    {"POST", "/generate", h_generate},
    {"POST", "/generate_stream", h_generate_stream},
    {"POST", "/", h_compat},
    {"GET", "/", h_web},
    {"GET", "/web/", h_web},
    {"POST", "/v1/completions", h_completions},
    {"POST", "/v1/chat/completions", h_chat},
    {"POST", "/v1/completions/render", h_completions_render},
    {"POST", "/v1/chat/completions/render", h_chat_render},
    {"POST", "/v1/responses", responses_route},
    {"POST", "/v1/messages", anthropic_messages_route},
    {"POST", "/v1/messages/count_tokens", anthropic_count_tokens_route},
    {"GET", "/v1/models", h_models},
    {"POST", "/tokenize", h_tokenize},
    {"POST", "/detokenize", h_detokenize},
    {"POST", "/apply-template", h_apply_template},
    {"GET", "/health", h_health},
    {"GET", "/live", h_health},
    {"GET", "/ready", h_ready},
    {"GET", "/info", h_info},
    {"GET", "/props", h_props},
    {"GET", "/stats", h_stats},
    {"POST", "/v1/memory/estimate", h_memory_estimate},
    {"GET", "/v1/memory/presets", h_memory_presets},
    {"GET", "/metrics", h_metrics},
    {"POST", "/reset_prefix_cache", h_reset_prefix},
    {"DELETE", "/requests/", h_cancel},
    {"GET", "/debug/fault", h_debug_fault},
};

/* /info "routes": "METHOD /path" of every route served (a prefix route as
 * its pattern, /debug/fault only where it answers), what a 404 points at */
static void info_add_routes(cJSON *o)
{
    cJSON *a = cJSON_AddArrayToObject(o, "routes");
    for (size_t i = 0; a && i < sizeof ROUTES / sizeof ROUTES[0]; i++) {
        const route *r = &ROUTES[i];
        if (!strcmp(r->path, "/debug/fault") && !fault_live())
            continue;
        char line[160];
        size_t n = strlen(r->path);
        const char *tail = n <= 1 || r->path[n - 1] != '/' ? "" : !strcmp(r->path, "/web/") ? "NAME" : "{id}";
        snprintf(line, sizeof line, "%s %s%s", r->method, r->path, tail);
        json_push(a, cJSON_CreateString(line));
    }
}

static bool route_matches(const route *r, const char *path)
{
    size_t n = strlen(r->path);
    if (n > 1 && r->path[n - 1] == '/')
        return !strncmp(r->path, path, n);
    return !strcmp(r->path, path);
}
#define N_ROUTES ((int)(sizeof(ROUTES) / sizeof(ROUTES[0])))

/* 401 for a request without a valid key. The same body whatever was wrong
 * (absent, malformed, unknown), in OpenAI's shape on every route (in
 * Anthropic's on /v1/messages), so the answer tells an attacker nothing
 * and an OpenAI or Anthropic client raises its AuthenticationError. */
static int send_unauthorized(http_req *hr)
{
    static const char body[] = "{\"error\":{\"message\":\"a valid API key is required: send the header "
                               "'Authorization: Bearer KEY' (or 'x-api-key: KEY')\",\"type\":\"invalid_request_error\","
                               "\"param\":null,\"code\":\"invalid_api_key\"}}";
    static const char anthropic[] = "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":"
                                    "\"a valid API key is required: send the header 'x-api-key: KEY'\"}}";
    static const char *const hdrs[] = {"WWW-Authenticate", "Bearer", NULL};
    bool a = !strncmp(hr->path, "/v1/messages", 12) && (!hr->path[12] || hr->path[12] == '/');
    return http_send(hr, 401, "application/json", a ? anthropic : body, a ? sizeof(anthropic) - 1 : sizeof(body) - 1,
                     hdrs);
}

/* A CORS preflight (OPTIONS on a known path, --cors-origin set): answered
 * before the key check, since browsers send it without credentials.
 * Returns 1 when it was not one (nothing sent), else what sending gave. */
static int preflight(http_req *hr)
{
    if (strcmp(hr->method, "OPTIONS") || !cors_enabled(hr->srv))
        return 1;
    char allow[64] = "";
    for (int i = 0; i < N_ROUTES; i++) {
        if (!route_matches(&ROUTES[i], hr->path) || strstr(allow, ROUTES[i].method))
            continue;
        size_t l = strlen(allow);
        snprintf(allow + l, sizeof(allow) - l, "%s%s", l ? ", " : "", ROUTES[i].method);
    }
    return allow[0] ? cors_preflight(hr, allow) : 1;
}

/* The --metrics-port listener: the scrape and the probes, without a key
 * (it is bound where the operator lets only the scraper reach); every
 * other path is a 404 there, whatever the main port serves. */
static int metrics_port_dispatch(http_req *hr)
{
    static const route OPEN[] = {
        {"GET", "/metrics", h_metrics},
        {"GET", "/health", h_health},
        {"GET", "/live", h_health},
        {"GET", "/ready", h_ready},
    };
    const char *method = !strcmp(hr->method, "HEAD") ? "GET" : hr->method;
    for (size_t i = 0; i < sizeof OPEN / sizeof OPEN[0]; i++) {
        if (strcmp(OPEN[i].path, hr->path))
            continue;
        if (strcmp(method, "GET")) {
            char msg[400];
            snprintf(msg, sizeof(msg), "method %s is not allowed on %s (allowed: GET)", hr->method, hr->path);
            err_extra x = {.allow = "GET"};
            return errors_send(hr, ERR_METHOD, msg, &x);
        }
        return OPEN[i].fn(hr);
    }
    char msg[400];
    snprintf(msg, sizeof(msg), "no route %s %s on the metrics listener (--metrics-port): it serves GET /metrics, "
             "/health, /live and /ready; the API is on --port", hr->method, hr->path);
    return errors_reply(hr, ERR_NOT_FOUND, msg);
}

/* The key of a request on a keyed route: 1 when valid (hr->key_id set),
 * else what sending the 401 gave. */
static int check_key(http_req *hr)
{
    /* Authorization: Bearer KEY, or Anthropic's x-api-key: KEY */
    const auth_keys *keys = &hr->srv->keys;
    const char *bearer = http_header(hr, "Authorization");
    hr->key_id = bearer ? auth_check(keys, bearer) : auth_check_key(keys, http_header(hr, "x-api-key"));
    return hr->key_id ? 1 : send_unauthorized(hr);
}

int routes_head(http_req *hr)
{
    const auth_keys *keys = &hr->srv->keys;
    if (hr->metrics_port || !keys->n || auth_open_path(hr->method, hr->path, hr->srv->cfg->metrics_public))
        return 1;
    if (!strcmp(hr->method, "OPTIONS") && cors_enabled(hr->srv))
        return 1;   /* perhaps a preflight, answered without a key once read (routes_dispatch) */
    return check_key(hr);
}

int routes_dispatch(http_req *hr)
{
    const auth_keys *keys = &hr->srv->keys;
    if (hr->framing) {
        static const char *const why[] = {
            [HTTP_FRAMING_CL_DIFFER] = "Content-Length is repeated with different values: the body's length is "
                                       "ambiguous (RFC 9112 6.3); the connection is closed",
            [HTTP_FRAMING_TE_CL] = "Transfer-Encoding and Content-Length together: the body's length is ambiguous "
                                   "(RFC 9112 6.3); the connection is closed",
            [HTTP_FRAMING_TE_CODING] = "the only transfer coding implemented is a lone Transfer-Encoding: chunked; "
                                       "the connection is closed",
        };
        return errors_reply(hr, hr->framing == HTTP_FRAMING_TE_CODING ? ERR_NOT_IMPLEMENTED : ERR_BAD_JSON,
                            why[hr->framing]);
    }
    if (hr->metrics_port && !hr->body_oom && !hr->head_too_large)
        return metrics_port_dispatch(hr);
    if (hr->body_oom)
        return errors_reply(hr, ERR_INTERNAL, "out of memory reading the request body");
    if (hr->head_too_large) {
        char msg[160];
        snprintf(msg, sizeof(msg), "request line and headers are larger than the limit of %llu bytes "
                 "(--max-header-bytes)", (unsigned long long)hr->srv->cfg->max_header_bytes);
        return errors_reply(hr, ERR_HEAD_TOO_LARGE, msg);
    }
    int pf = preflight(hr);
    if (pf <= 0)
        return pf;
    if (keys->n && !auth_open_path(hr->method, hr->path, hr->srv->cfg->metrics_public)) {
        int k = check_key(hr);
        if (k != 1)
            return k;
    }
    const char *method = !strcmp(hr->method, "HEAD") ? "GET" : hr->method;
    char allow[64] = "";
    bool path_known = false;
    for (int i = 0; i < N_ROUTES; i++) {
        if (!route_matches(&ROUTES[i], hr->path))
            continue;
        path_known = true;
        if (strcmp(ROUTES[i].method, method)) {
            size_t l = strlen(allow);
            snprintf(allow + l, sizeof(allow) - l, "%s%s", l ? ", " : "", ROUTES[i].method);
            continue;
        }
        if (hr->body_too_large) {
            char msg[160];
            snprintf(msg, sizeof(msg), "request body is larger than the limit of %llu bytes (--max-body)",
                     (unsigned long long)hr->srv->cfg->max_body);
            return errors_reply(hr, ERR_TOO_LARGE, msg);
        }
        return ROUTES[i].fn(hr);
    }
    char msg[400];
    if (path_known) {
        snprintf(msg, sizeof(msg), "method %s is not allowed on %s (allowed: %s)", hr->method, hr->path, allow);
        err_extra x = {.allow = allow};
        return errors_send(hr, ERR_METHOD, msg, &x);
    }
    snprintf(msg, sizeof(msg), "no route %s %s; GET /info lists the routes (\"routes\")", hr->method, hr->path);
    return errors_reply(hr, ERR_NOT_FOUND, msg);
}
