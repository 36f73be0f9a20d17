/* test_memplan.c - the planner against published figures (docs/models.md
 * sections 8 and 9, the Jamba paper's 4 GB at 256K) and against a live
 * engine's cache layout. The presets under config/presets/ are the input,
 * so these tests also check the preset files. The cache manager's own
 * tests are tests/test_cache.c. */
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "presets.h"
#include "synth.h"
#include "test.h"

static int load(const char *name, memplan_layout *l)
{
    char err[512];
    if (preset_load(name, l, err, sizeof err) != 0) {
        fprintf(stderr, "    %s\n", err);
        return -1;
    }
    return 0;
}

TEST(test_memplan_llama_3_1_8b_gqa_is_a_quarter_of_mha)
{
    memplan_layout l;
    memplan_costs c;
    CHECK(load("llama-3.1-8b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.gqa_numbers_per_token_layer == 2048);     /* 2 x 8 KV heads x 128 */
    l.attn_kv_heads = 32;                              /* the same model with 32 KV heads */
    memplan_costs_of(&l, &c);
    CHECK(c.gqa_numbers_per_token_layer == 8192);
    l.attn_kv_heads = 8;
    memplan_costs_of(&l, &c);
    CHECK(c.mha_bytes_per_token == 4 * c.cache_bytes_per_token);
}

TEST(test_memplan_deepseek_v2_mla_caches_57_times_less_than_mha)
{
    memplan_layout l;
    memplan_costs c;
    CHECK(load("deepseek-v2", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.mla_numbers_per_token_layer == 576);      /* 512 latent + 64 rope */
    CHECK(c.mha_bytes_per_token / (uint64_t)l.n_layers / (uint64_t)l.kv_bytes == 32768);  /* 2 x 128 x 128 */
    double r = (double)c.mha_bytes_per_token / (double)c.cache_bytes_per_token;
    CHECK_MSG(r > 56.5 && r < 57.5, "ratio %.2f", r);
    CHECK(c.cache_bytes_per_token == 69120);          /* docs/models.md 8: 60 x 576 x 2 */
    CHECK(load("deepseek-v2-lite", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.cache_bytes_per_token == 31104);
}

TEST(test_memplan_qwen3_next_caches_a_quarter_of_all_attention)
{
    memplan_layout l;
    memplan_costs c;
    CHECK(load("qwen3-next-80b-a3b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.cache_bytes_per_token / (uint64_t)l.kv_bytes == 12288);   /* 12 layers x 2 x 2 x 256 */
    CHECK(c.all_attention_bytes_per_token == 4 * c.cache_bytes_per_token);
    CHECK(c.state_bytes_per_seq == 79036416);
    CHECK(c.dnet_state_bytes_per_seq == 75497472 && c.dnet_conv_bytes_per_seq == 3538944);
}

/* The dashboard's chart compares kinds on one layer count: every layer the
 * model's GQA (2 n_kv d_head numbers, seed 000 step 6: 2,048 for Llama 3.1
 * 8B) or its MLA (kv_lora + rope: 576 for DeepSeek-V2); a kind the layout
 * lacks has no such line. */
TEST(test_memplan_gqa_and_mla_on_every_layer_for_the_chart)
{
    memplan_layout l;
    memplan_costs c;
    CHECK(load("llama-3.1-8b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.gqa_all_layers_bytes_per_token == (uint64_t)l.n_layers * 2048 * (uint64_t)l.kv_bytes);
    CHECK(c.gqa_all_layers_bytes_per_token == c.cache_bytes_per_token);
    CHECK(c.mla_all_layers_bytes_per_token == 0);
    CHECK(load("deepseek-v2", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.mla_all_layers_bytes_per_token == 60 * 576 * 2);
    CHECK(c.gqa_all_layers_bytes_per_token == 0);
    CHECK(load("qwen3-next-80b-a3b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.gqa_all_layers_bytes_per_token == c.all_attention_bytes_per_token);
    CHECK(c.gqa_all_layers_bytes_per_token == 4 * c.attn_kv_bytes_per_token);
}

TEST(test_memplan_qwen3_5_state_and_other_published_figures)
{
    memplan_layout l;
    memplan_costs c;
    CHECK(load("qwen3.5-0.8b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.state_bytes_per_seq == 20201472);
    CHECK(c.cache_bytes_per_token == 12288);
    CHECK(load("qwen3.5-9b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.state_bytes_per_seq == 52690944 && c.cache_bytes_per_token == 32768);
    CHECK(load("kimi-linear-48b-a3b", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.cache_bytes_per_token == 8064 && c.state_bytes_per_seq == 44892160);
    CHECK(load("jamba-v0.1", &l) == 0);
    memplan_costs_of(&l, &c);
    CHECK(c.cache_bytes_per_token == 16384 && c.state_bytes_per_seq == 17432576);
    /* Jamba paper: about 4 GB of KV cache at 256K tokens */
    uint64_t kv = memplan_seq_reserved_bytes(&l, 262144) - c.state_bytes_per_seq;
    CHECK_MSG(kv > 4000000000ull && kv < 4400000000ull, "Jamba KV at 256K: %llu", (unsigned long long)kv);
}

TEST(test_memplan_budget_for_exactly_k_sequences_fits_k_not_k_plus_1)
{
    memplan_layout l;
    CHECK(load("qwen3.5-0.8b", &l) == 0);
    const int64_t n = 1000;
    uint64_t per = memplan_seq_reserved_bytes(&l, n);
    CHECK(memplan_max_batch(&l, 5 * per, n) == 5);
    CHECK(memplan_max_batch(&l, 5 * per - 1, n) == 4);
    int64_t ctx = memplan_max_context(&l, 5 * per, 5);
    CHECK(ctx >= n && memplan_seq_reserved_bytes(&l, ctx) * 5 <= 5 * per);
    CHECK(memplan_seq_reserved_bytes(&l, ctx + l.page_tokens) * 5 > 5 * per);
}

TEST(test_memplan_rejects_malformed_layouts_with_the_field_name)
{
    char err[256];
    memplan_layout l;
    cJSON *j = cJSON_Parse("{\"layers\": 4, \"attention\": {\"layers\": \"four\"}}");
    CHECK(j);
    CHECK(preset_from_json(j, &l, err, sizeof err) == -1 && strstr(err, "attention.layers"));
    cJSON_Delete(j);
    j = cJSON_Parse("{\"layers\": 2, \"deltanet\": {\"layers\": 3}}");
    CHECK(preset_from_json(j, &l, err, sizeof err) == -1 && strstr(err, "at most layers"));
    cJSON_Delete(j);
    CHECK(preset_load("no-such-model", &l, err, sizeof err) == -1 && strstr(err, "qwen3.5-0.8b"));
}

TEST(test_live_cache_matches_the_planner_for_a_synthesized_layout)
{
    /* a hybrid with all three cache kinds, described twice: as synth options
     * and as a hand-written layout in the preset format */
    synth_config sc;
    synth_config_default(&sc);
    sc.n_layer = 6;
    snprintf(sc.pattern, sizeof sc.pattern, "LLALLM");
    sc.n_head = 4; sc.n_head_kv = 2; sc.head_dim = 16;
    sc.dnet_n_k = 2; sc.dnet_n_v = 4; sc.dnet_d_k = 16; sc.dnet_d_v = 16;
    sc.mla_kv_lora = 32; sc.mla_rope = 8; sc.mla_nope = 16; sc.mla_v = 16;
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/memplan_live.gguf", test_tmpdir());
    CHECK(synth_write(&sc, path, err, sizeof err) == 0);
    /* LLALLM: 4 DeltaNet, 1 attention, 1 MLA layer */
    cJSON *j = cJSON_Parse(
        "{\"layers\": 6, \"kv_dtype\": \"f16\","
        " \"attention\": {\"layers\": 1, \"heads\": 4, \"kv_heads\": 2, \"head_dim\": 16},"
        " \"mla\": {\"layers\": 1, \"heads\": 4, \"kv_lora_rank\": 32, \"rope_dim\": 8, \"nope_dim\": 16, \"v_dim\": 16},"
        " \"deltanet\": {\"layers\": 4, \"k_heads\": 2, \"v_heads\": 4, \"d_k\": 16, \"d_v\": 16, \"conv_kernel\": 4}}");
    memplan_layout hand;
    CHECK(j && preset_from_json(j, &hand, err, sizeof err) == 0);
    cJSON_Delete(j);

    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    p.n_ctx = 256;
    p.max_seqs = 4;
    p.kv_dtype = ENGINE_KV_F16;
    engine *e = engine_open(&p, err, sizeof err);
    CHECK_MSG(e, "%s", err);
    const int lens[3] = { 1, 17, 200 };
    for (int i = 0; i < 3; i++) {
        int s = engine_seq_new(e);
        CHECK(s >= 0 && engine_seq_reserve(e, s, lens[i]) == 0);
        engine_seq_usage u;
        CHECK(engine_seq_get_usage(e, s, &u) == 0);
        uint64_t want = memplan_seq_reserved_bytes(&hand, lens[i]);
        CHECK_MSG(u.total_reserved_bytes == want, "%d tokens: cache %llu, planner %llu", lens[i],
                  (unsigned long long)u.total_reserved_bytes, (unsigned long long)want);
        CHECK(engine_bytes_for_tokens(e, lens[i]) == want);
    }
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    CHECK(pu.reserved_bytes == memplan_seq_reserved_bytes(&hand, 1) + memplan_seq_reserved_bytes(&hand, 17) +
                               memplan_seq_reserved_bytes(&hand, 200));
    for (int i = 0; i < 4; i++)
        engine_seq_free(e, i);
    engine_get_pool_usage(e, &pu);
    CHECK(pu.reserved_bytes == 0);
    engine_close(e);
}

/* Every preset the engine runs, synthesized and opened: the cache the
 * engine sizes from the loaded file's layers has exactly the preset's byte
 * counts, for every layer kind (GQA, MLA, DeltaNet, Mamba-2, Mamba-1, KDA,
 * short conv, and Nemotron-H's MLP-only layers, which hold nothing). */
TEST(test_synth_from_a_preset_has_exactly_the_preset_cache_layout)
{
    static const char *const presets[] = { "qwen3.5-0.8b", "granite-4.0-h-tiny", "nemotron-h-8b", "lfm2-1.2b",
                                           "jamba-v0.1", "qwen3.5-35b-a3b", "kimi-linear-48b-a3b" };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        memplan_layout want, got;
        synth_config sc;
        char err[512], path[512];
        CHECK(load(presets[i], &want) == 0);
        CHECK_MSG(synth_from_layout(&want, &sc, err, sizeof err) == 0, "%s: %s", presets[i], err);
        snprintf(path, sizeof path, "%s/memplan_preset.gguf", test_tmpdir());
        CHECK_MSG(synth_write(&sc, path, err, sizeof err) == 0, "%s: %s", presets[i], err);
        engine_params p;
        engine_params_default(&p);
        p.model_path = path;
        p.n_threads = 1;
        p.n_ctx = 64;
        p.max_seqs = 1;
        p.kv_dtype = ENGINE_KV_BF16;
        engine *e = engine_open(&p, err, sizeof err);
        CHECK_MSG(e, "%s: %s", presets[i], err);
        engine_get_memplan(e, &got);
        engine_close(e);
        memplan_costs cw, cg;
        memplan_costs_of(&want, &cw);
        memplan_costs_of(&got, &cg);
        CHECK_MSG(cg.cache_bytes_per_token == cw.cache_bytes_per_token, "%s", presets[i]);
        CHECK_MSG(cg.state_bytes_per_seq == cw.state_bytes_per_seq && cw.state_bytes_per_seq > 0, "%s: %llu vs %llu",
                  presets[i], (unsigned long long)cg.state_bytes_per_seq, (unsigned long long)cw.state_bytes_per_seq);
        CHECK_MSG(cg.rec_state_bytes_per_seq == cw.rec_state_bytes_per_seq, "%s", presets[i]);
        CHECK_MSG(cg.mha_bytes_per_token == cw.mha_bytes_per_token, "%s", presets[i]);
        CHECK_MSG(cg.all_attention_bytes_per_token == cw.all_attention_bytes_per_token, "%s", presets[i]);
    }
}
