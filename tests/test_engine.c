/* test_engine.c - engine invariants on synthesized models: the two
 * DeltaNet paths agree, prefill + decode equals a longer prefill, a batch
 * equals each sequence alone, the cache accounting adds up, and every kind
 * of broken model file fails with one clear line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "layers.h"
#include "synth.h"
#include "test.h"

static const char *model_path(const char *tag, synth_config *c)
{
    static char path[4][512];
    static int slot;
    char *p = path[slot++ % 4];
    snprintf(p, sizeof path[0], "%s/engine_%s.gguf", test_tmpdir(), tag);
    char err[256];
    if (synth_write(c, p, err, sizeof err) != 0) {
        fprintf(stderr, "    synth failed: %s\n", err);
        return NULL;
    }
    return p;
}

/* The tests' engine parameters: 2 threads, 512 tokens of context. */
static void test_params(engine_params *p, const char *path, int mode, int max_seqs)
{
    engine_params_default(p);
    p->model_path = path;
    p->n_threads = 2;
    p->n_ctx = 512;
    p->max_seqs = max_seqs;
    p->dnet_mode = mode;
}

static engine *open_params(const engine_params *p)
{
    char err[512];
    engine *e = engine_open(p, err, sizeof err);
    if (!e)
        fprintf(stderr, "    engine_open: %s\n", err);
    return e;
}

static engine *open_model_ex(const char *path, int mode, int max_seqs, bool huge_weights, uint64_t cache_bytes)
{
    engine_params p;
    test_params(&p, path, mode, max_seqs);
    p.huge_weights = huge_weights;
    p.cache_bytes = cache_bytes;
    return open_params(&p);
}

static engine *open_model(const char *path, int mode, int max_seqs)
{
    return open_model_ex(path, mode, max_seqs, false, 0);
}

static void prompt_tokens(int32_t *t, int n, int vocab, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
}

static double max_rel_diff(const float *a, const float *b, long n)
{
    double md = 0, mx = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        md = d > md ? d : md;
        mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
    }
    return md / (mx > 0 ? mx : 1);
}

/* logits for all n positions of one sequence fed in pieces of `step` */
static int run_logits(engine *e, const int32_t *toks, int n, int step, float *out)
{
    int seq = engine_seq_new(e);
    char err[256];
    if (seq < 0)
        return -1;
    const int V = engine_get_info(e)->n_vocab;
    for (int s0 = 0; s0 < n; s0 += step) {
        int cnt = n - s0 < step ? n - s0 : step;
        engine_batch_item it = { .seq = seq, .tokens = toks + s0, .n_tokens = cnt,
                                 .logits = ENGINE_LOGITS_ALL, .out = out + (size_t)s0 * V };
        if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "    forward: %s\n", err);
            engine_seq_free(e, seq);
            return -1;
        }
    }
    engine_seq_free(e, seq);
    return 0;
}

static void hybrid_config(synth_config *c)
{
    synth_config_default(c);
    c->n_layer = 4;
    c->attn_every = 2;
    c->dnet_n_k = 2;
    c->dnet_n_v = 4;        /* n_v = 2 n_k: exercises the tiled head order */
    c->seed = 7;
}

TEST(test_deltanet_chunked_prefill_matches_recurrent_path)
{
    synth_config c;
    hybrid_config(&c);
    const char *p = model_path("chunk", &c);
    CHECK(p);
    engine *rec = open_model(p, ENGINE_DNET_RECURRENT, 1), *chk = open_model(p, ENGINE_DNET_CHUNKED, 1);
    CHECK(rec && chk);
    enum { N = 150 };       /* spans three chunks of 64, the last one partial */
    const int V = engine_get_info(rec)->n_vocab;
    int32_t toks[N];
    prompt_tokens(toks, N, V, 1);
    float *a = malloc(sizeof(float) * N * V), *b = malloc(sizeof(float) * N * V);
    CHECK(a && b);
    CHECK(run_logits(rec, toks, N, N, a) == 0);
    CHECK(run_logits(chk, toks, N, N, b) == 0);
    double d = max_rel_diff(b, a, (long)N * V);
    CHECK_MSG(d < 1e-4, "chunked vs recurrent: max relative difference %g", d);
    free(a); free(b);
    engine_close(rec);
    engine_close(chk);
}

TEST(test_deltanet_chunked_head_matches_recurrent_head_on_strong_decay)
{
    /* direct kernel check with decays as strong as trained models reach */
    enum { N = 130, DK = 8, DV = 6 };
    float q[N][DK], k[N][DK], v[N][DV], beta[N], g[N];
    float S1[DV * DK] = { 0 }, S2[DV * DK] = { 0 }, o1[N][DV], o2[N][DV];
    uint32_t s = 99;
    for (int t = 0; t < N; t++) {
        double nq = 0, nk = 0;
        for (int i = 0; i < DK; i++) {
            s = s * 1664525u + 1013904223u; q[t][i] = (float)((s >> 9) % 2001) / 1000.0f - 1.0f;
            s = s * 1664525u + 1013904223u; k[t][i] = (float)((s >> 9) % 2001) / 1000.0f - 1.0f;
            nq += q[t][i] * q[t][i];
            nk += k[t][i] * k[t][i];
        }
        for (int i = 0; i < DK; i++) {
            q[t][i] /= (float)sqrt(nq);
            k[t][i] /= (float)sqrt(nk);
        }
        for (int j = 0; j < DV; j++) {
            s = s * 1664525u + 1013904223u; v[t][j] = (float)((s >> 9) % 2001) / 1000.0f - 1.0f;
        }
        s = s * 1664525u + 1013904223u; beta[t] = (float)((s >> 9) % 1000) / 1000.0f;
        s = s * 1664525u + 1013904223u; g[t] = -(float)((s >> 9) % 3000) / 1000.0f;
    }
    for (int i = 0; i < DV * DK; i++)
        S1[i] = S2[i] = 0.01f * (float)(i % 7);
    float *scr = malloc(sizeof(float) * (size_t)dnet_chunk_scratch_floats(DK, DV));
    CHECK(scr);
    dnet_recurrent_head(N, DK, DV, &q[0][0], DK, &k[0][0], DK, &v[0][0], DV, beta, g, S1, &o1[0][0], DV);
    dnet_chunked_head(N, DK, DV, &q[0][0], DK, &k[0][0], DK, &v[0][0], DV, beta, g, S2, &o2[0][0], DV, scr);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < DV; j++)
            CHECK_NEAR(o2[t][j], o1[t][j], 1e-5);
    for (int i = 0; i < DV * DK; i++)
        CHECK_NEAR(S2[i], S1[i], 1e-5);
    free(scr);
}

TEST(test_prefill_then_decode_equals_longer_prefill)
{
    synth_config c;
    hybrid_config(&c);
    const char *p = model_path("decode", &c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 2);
    CHECK(e);
    enum { N = 40 };
    const int V = engine_get_info(e)->n_vocab;
    int32_t toks[N + 1];
    prompt_tokens(toks, N + 1, V, 3);
    float *a = malloc(sizeof(float) * (N + 1) * V), *b = malloc(sizeof(float) * (N + 1) * V);
    CHECK(a && b);
    CHECK(run_logits(e, toks, N + 1, N + 1, a) == 0);      /* one prefill of N+1 */
    CHECK(run_logits(e, toks, N + 1, N, b) == 0);          /* prefill N, decode 1 */
    double d = max_rel_diff(b + (size_t)N * V, a + (size_t)N * V, V);
    CHECK_MSG(d < 1e-4, "last-position logits differ by %g", d);
    /* and token by token all the way */
    CHECK(run_logits(e, toks, N + 1, 1, b) == 0);
    d = max_rel_diff(b, a, (long)(N + 1) * V);
    CHECK_MSG(d < 1e-4, "token-by-token logits differ by %g", d);
    /* pieces shorter and longer than the conv window (K - 1 = 3 rows,
     * kept as a ring): every piece length leaves the ring at another phase */
    for (int step = 2; step <= 5; step++) {
        CHECK(run_logits(e, toks, N + 1, step, b) == 0);
        d = max_rel_diff(b, a, (long)(N + 1) * V);
        CHECK_MSG(d < 1e-4, "pieces of %d: logits differ by %g", step, d);
    }
    free(a); free(b);
    engine_close(e);
}

/* NS sequences: prompts of len[i] tokens in one batch, then one decode
 * token each in one batch, against each sequence run alone; logits within
 * tol (relative to the largest) */
enum { NS = 4, NS_MAX = 12 };
static void check_batch_vs_alone_n(synth_config *c, const char *name, int ns, const int *len, double tol)
{
    const char *p = model_path(name, c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, NS_MAX + 4);
    CHECK(e);
    const int V = engine_get_info(e)->n_vocab;
    int32_t toks[NS_MAX][80];
    float *alone[NS_MAX], *batched[NS_MAX];
    for (int i = 0; i < ns; i++) {
        prompt_tokens(toks[i], len[i] + 1, V, 10u + (uint32_t)i);
        alone[i] = malloc(sizeof(float) * (size_t)(len[i] + 1) * V);
        batched[i] = malloc(sizeof(float) * (size_t)(len[i] + 1) * V);
        CHECK(alone[i] && batched[i]);
        CHECK(run_logits(e, toks[i], len[i] + 1, len[i], alone[i]) == 0);
    }
    /* step 1: all prompts in one batch; step 2: one decode token each */
    int seq[NS_MAX];
    char err[256];
    engine_batch_item items[NS_MAX];
    for (int i = 0; i < ns; i++) {
        seq[i] = engine_seq_new(e);
        CHECK(seq[i] >= 0);
        items[i] = (engine_batch_item){ .seq = seq[i], .tokens = toks[i], .n_tokens = len[i],
                                        .logits = ENGINE_LOGITS_ALL, .out = batched[i] };
    }
    CHECK(engine_forward(e, items, ns, err, sizeof err) == 0);
    for (int i = 0; i < ns; i++)
        items[i] = (engine_batch_item){ .seq = seq[i], .tokens = &toks[i][len[i]], .n_tokens = 1,
                                        .logits = ENGINE_LOGITS_LAST, .out = batched[i] + (size_t)len[i] * V };
    CHECK(engine_forward(e, items, ns, err, sizeof err) == 0);
    for (int i = 0; i < ns; i++) {
        double d = max_rel_diff(batched[i], alone[i], (long)(len[i] + 1) * V);
        CHECK_MSG(d < tol, "sequence %d: batched logits differ from alone by %g", i, d);
        engine_seq_free(e, seq[i]);
        free(alone[i]);
        free(batched[i]);
    }
    engine_close(e);
}

static void check_batch_vs_alone(synth_config *c, const char *name, const int *len, double tol)
{
    check_batch_vs_alone_n(c, name, NS, len, tol);
}

TEST(test_batch_of_sequences_matches_each_sequence_alone)
{
    synth_config c;
    hybrid_config(&c);
    static const int len[NS] = { 9, 33, 1, 70 };
    check_batch_vs_alone(&c, "batch", len, 1e-4);
}

/* the hybrid model in another weight type, batch against alone */
static void check_dtype_batch_vs_alone(uint32_t dtype, const char *name, double tol)
{
    synth_config c;
    hybrid_config(&c);
    c.dtype = dtype;
    static const int len[NS] = { 9, 33, 2, 70 };
    check_batch_vs_alone(&c, name, len, tol);
}

/* Q8_0 meets int8 activations in decode steps, alone (one token) and in a
 * batch (the VNNI kernel for these 4 sequences, AMX from 5, where the CPU
 * has them; f32 activations without either). Rounding
 * to int8 is discontinuous: inputs that differ in the 7th digit (a prompt
 * run in a batch vs alone) can round one element to the next step, which
 * moved logits by up to 5e-3 here, as does f32 against int8 activations
 * (8e-3). So this end-to-end check only guards against gross errors (rows
 * or sequences mixed up, a wrong scale: differences of order 1); the
 * precision of the batched kernel is test_amx.c's, against exact sums. */
TEST(test_q8_0_batch_of_sequences_matches_each_sequence_alone)
{
    check_dtype_batch_vs_alone(GGML_Q8_0, "batch_q8", 3e-2);
}

/* F16 decode steps of 2-11 sequences take the AVX-512 tile with the rows
 * widened to f32 (the one-token path's products, summed in another
 * order); from 12 sequences the bf16 tiles (AMX, where the CPU has it)
 * with x split into two bf16 parts: each term within 2^-15 of the f32
 * product (test_amx.c checks the kernel against exact sums). End to end
 * the tiles moved logits by 5e-6 here; rows or sequences mixed up would
 * move them by order 1. Both batch sizes run. */
TEST(test_f16_batch_of_sequences_matches_each_sequence_alone)
{
    check_dtype_batch_vs_alone(GGML_F16, "batch_f16", 1e-4);
    synth_config c;
    hybrid_config(&c);
    c.dtype = GGML_F16;
    static const int len[NS_MAX] = { 9, 33, 2, 70, 1, 5, 17, 3, 40, 8, 12, 6 };
    check_batch_vs_alone_n(&c, "batch_f16", NS_MAX, len, 1e-4);
}

/* VmFlags of the mapping that holds addr ("hg": madvise(MADV_HUGEPAGE)),
 * from /proc/self/smaps; "" when not found */
static void vm_flags_of(const void *addr, char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    bool in = false;
    const uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = a >= lo && a < hi;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, n, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

static long file_size(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static bool thp_on(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    const bool on = f && fgets(line, sizeof line, f) && !strstr(line, "[never]");
    if (f)
        fclose(f);
    return on;
}

/* Weights read into huge pages hold the file's bytes: every tensor equals
 * the mapped one byte for byte, the copy is 2 MiB aligned and madvised
 * (VmFlags "hg"), and a model served from either gives identical logits,
 * bit for bit. Skipped when the kernel has THP off, after checking that the
 * load then leaves the weights mapped, which the info reports. */
TEST(test_weights_in_huge_pages_match_the_mapped_file)
{
    synth_config c;
    hybrid_config(&c);
    c.seed = 21;
    const char *p = model_path("huge", &c);
    CHECK(p);
    char err[256];
    gguf_ctx *g = gguf_open(p, err, sizeof err), *h = gguf_open(p, err, sizeof err);
    CHECK(g && h);
    const int rc = gguf_load_huge(h, NULL, NULL, err, sizeof err);
    if (!thp_on()) {
        CHECK(rc == -1 && h->data_copy == NULL && strstr(err, "huge pages are off"));
    } else {
        CHECK_MSG(rc == 0, "gguf_load_huge: %s", err);
        CHECK(h->data_copy && ((uintptr_t)h->data_copy & ((2u << 20) - 1)) == 0);
        CHECK(h->data_copy_bytes % (2u << 20) == 0 && h->data_copy_bytes >= h->size - h->data_offset);
        char flags[512];
        vm_flags_of(h->data_copy, flags, sizeof flags);
        CHECK_MSG(strstr(flags, " hg"), "VmFlags of the copy: '%s'", flags);
        CHECK(h->n_tensors == g->n_tensors);
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const gguf_tensor *a = &g->tensors[i], *b = &h->tensors[i];
            CHECK(b->data == h->data_copy + b->offset);
            CHECK_MSG(a->n_bytes == b->n_bytes && memcmp(a->data, b->data, a->n_bytes) == 0, "tensor %s differs",
                      a->name);
        }
    }
    gguf_close(g);
    gguf_close(h);

    engine *em = open_model_ex(p, ENGINE_DNET_AUTO, 1, false, 0), *eh = open_model_ex(p, ENGINE_DNET_AUTO, 1, true, 0);
    CHECK(eh && em);
    CHECK(!strcmp(engine_get_info(em)->weights_memory, "mapped"));
    CHECK(!strcmp(engine_get_info(eh)->weights_memory, thp_on() ? "huge_pages" : "mapped"));
    CHECK(engine_get_info(em)->weights_note[0] == '\0');      /* not asked for: nothing to explain */
    CHECK(thp_on() ? engine_get_info(eh)->weights_note[0] == '\0'
                   : strstr(engine_get_info(eh)->weights_note, "huge pages are off") != NULL);
    enum { N = 40 };
    const int V = engine_get_info(em)->n_vocab;
    int32_t toks[N];
    prompt_tokens(toks, N, V, 5);
    float *a = malloc(sizeof(float) * N * V), *b = malloc(sizeof(float) * N * V);
    CHECK(a && b);
    CHECK(run_logits(em, toks, N, 7, a) == 0);
    CHECK(run_logits(eh, toks, N, 7, b) == 0);
    CHECK_MSG(memcmp(a, b, sizeof(float) * N * V) == 0, "logits differ: max relative %g", max_rel_diff(b, a, (long)N * V));
    free(a);
    free(b);
    engine_close(eh);
    engine_close(em);
    if (!thp_on())
        SKIP("transparent huge pages are off in this kernel (only the fallback was checked)");
}

/* true when [p, p + n) lies inside [base, base + len) */
static bool inside(const void *p, size_t n, const void *base, size_t len)
{
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && a + n <= b + len;
}

/* F32 weights are copied out of the file mapping at load (model.c
 * copy_f32): the projections, the LM head and the embedding lie in the
 * model's own region, advised for huge pages (VmFlags "hg"), none in the
 * mapping, each equal to the file's tensor byte for byte; an engine on
 * that copy gives the logits of one on the mapping (HYSERVE_F32_COPY=0)
 * bit for bit: the same rows, the same kernels. */
TEST(test_f32_weights_are_copied_out_of_the_file_mapping)
{
    synth_config c;
    hybrid_config(&c);
    c.seed = 23;
    c.tied = 0;                 /* an LM head of its own too */
    const char *p = model_path("f32copy", &c);
    CHECK(p);
    char err[256];
    gguf_ctx *g = gguf_open(p, err, sizeof err);
    model *m = model_load(p, NULL, err, sizeof err);
    CHECK_MSG(g && m, "%s", err);
    if (!g || !m)
        goto out;
    CHECK(m->f32_arena && m->n_f32_copied > 0);
    char flags[512];
    vm_flags_of(m->f32_arena, flags, sizeof flags);
    CHECK_MSG(!thp_on() || strstr(flags, " hg"), "VmFlags of the copy: '%s'", flags);
    const struct { const weight *w; const char *name; } ws[] = {
        { &m->tok_embd, "token_embd.weight" }, { &m->output, "output.weight" },
        { &m->layers[0].ffn_up, "blk.0.ffn_up.weight" }, { &m->layers[1].ffn_down, "blk.1.ffn_down.weight" },
        { &m->layers[1].wo, "blk.1.attn_output.weight" },
    };
    int copied = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        const gguf_tensor *t = gguf_find_tensor(g, ws[i].name);
        CHECK_MSG(t && ws[i].w->data, "%s missing", ws[i].name);
        if (!t || !ws[i].w->data)
            continue;
        const size_t n = (size_t)ws[i].w->n_out * ws[i].w->row_bytes;
        CHECK_MSG(n == t->n_bytes && !memcmp(ws[i].w->data, t->data, n), "%s: not the file's bytes", ws[i].name);
        CHECK_MSG(inside(ws[i].w->data, n, m->f32_arena, m->f32_arena_bytes), "%s: not in the copy", ws[i].name);
        copied++;
    }
    CHECK(copied == (int)(sizeof ws / sizeof ws[0]));

    engine *ec = open_model(p, ENGINE_DNET_AUTO, 1);
    setenv("HYSERVE_F32_COPY", "0", 1);
    engine *em = open_model(p, ENGINE_DNET_AUTO, 1);
    unsetenv("HYSERVE_F32_COPY");
    CHECK(ec && em);
    enum { N = 40 };
    const int V = ec ? engine_get_info(ec)->n_vocab : 0;
    int32_t toks[N];
    prompt_tokens(toks, N, V, 9);
    float *a = malloc(sizeof(float) * N * (size_t)V), *b = malloc(sizeof(float) * N * (size_t)V);
    CHECK(a && b);
    if (ec && em && a && b) {
        CHECK(run_logits(ec, toks, N, 7, a) == 0);
        CHECK(run_logits(em, toks, N, 7, b) == 0);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * N * (size_t)V), "logits differ: max relative %g",
                  max_rel_diff(b, a, (long)N * V));
    }
    free(a);
    free(b);
    engine_close(ec);
    engine_close(em);
out:
    model_free(m);
    gguf_close(g);
}

/* When the copy into huge pages cannot be made, the model still loads, its
 * weights stay mapped and huge_note says why (the server and the CLI print
 * it). The copy is made to fail by an address-space limit, in a child
 * process so the limit does not outlive the check: the limit leaves room
 * for the file mapping and small allocations, not for the copy's 2 MiB-
 * aligned region. AddressSanitizer reserves its shadow memory and cannot
 * run under such a limit, so sanitizer builds skip it (and say so). */
TEST(test_huge_pages_fallback_says_why)
{
#if defined(__SANITIZE_ADDRESS__)
    SKIP("an address-space limit cannot be set under AddressSanitizer");
#else
    synth_config c;
    hybrid_config(&c);
    c.seed = 22;
    const char *p = model_path("hugefb", &c);
    CHECK(p);
    const long size = file_size(p);
    CHECK(size > 0);
    fflush(stdout);
    const pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* 0 loaded, mapped, reason given; 1 no limit; 2 load failed; 3 copied; 4 no reason */
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long vm_kb = -1;
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "VmSize:", 7))
                vm_kb = atol(line + 7);
        if (f)
            fclose(f);
        const rlim_t lim = (rlim_t)vm_kb * 1024 + (rlim_t)size + (3u << 19);    /* + 1.5 MiB */
        const struct rlimit rl = { lim, lim };
        if (vm_kb < 0 || setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(1);
        char err[256];
        engine_params hp = {.huge_weights = true};
        model *m = model_load(p, &hp, err, sizeof err);
        if (!m)
            _exit(2);
        if (m->gguf->data_copy)
            _exit(3);
        const bool said = strstr(m->huge_note, "cannot allocate") != NULL ||
                          strstr(m->huge_note, "huge pages are off") != NULL;
        _exit(said ? 0 : 4);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %s %d",
              WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
#endif
}

TEST(test_cache_accounting_reconciles_with_the_layout)
{
    synth_config c;
    hybrid_config(&c);
    const char *p = model_path("acct", &c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 4);
    CHECK(e);
    const engine_info *in = engine_get_info(e);
    /* 2 attention layers x K and V x 2 kv heads x 16 dims x 4 bytes */
    CHECK(in->kv_bytes_per_token == 2ull * 2 * 2 * 16 * 4);
    /* 2 DeltaNet layers x 4 value heads x 16 x 16 x 4 bytes */
    CHECK(in->dnet_state_bytes_per_seq == 2ull * 4 * 16 * 16 * 4);
    /* conv: 2 layers x 3 rows x conv_dim (2*2*16 + 4*16 = 128) x 4 bytes */
    CHECK(in->dnet_conv_bytes_per_seq == 2ull * 3 * 128 * 4);
    int a = engine_seq_new(e), b = engine_seq_new(e);
    CHECK(a >= 0 && b >= 0);
    CHECK(engine_seq_reserve(e, a, 20) == 0);   /* 2 pages of 16 */
    CHECK(engine_seq_reserve(e, b, 16) == 0);   /* 1 page */
    engine_seq_usage ua, ub;
    engine_pool_usage pu;
    CHECK(engine_seq_get_usage(e, a, &ua) == 0 && engine_seq_get_usage(e, b, &ub) == 0);
    engine_get_pool_usage(e, &pu);
    CHECK(ua.kv_reserved_bytes == 2 * 16 * in->kv_bytes_per_token);
    CHECK(pu.reserved_bytes == ua.total_reserved_bytes + ub.total_reserved_bytes);
    CHECK(pu.n_seqs == 2);
    engine_seq_free(e, a);
    engine_seq_free(e, b);
    engine_get_pool_usage(e, &pu);
    CHECK(pu.reserved_bytes == 0 && pu.n_seqs == 0);
    engine_close(e);
}

/* engine.h: "on error no sequence is modified". A batch whose second item
 * does not fit the budget fails, and the first item, which alone would
 * fit, keeps its reservation, its length and its cache; the pool is as it
 * was. Then the first item alone runs. */
TEST(test_forward_that_fails_on_the_second_item_leaves_the_first_unchanged)
{
    synth_config c;
    hybrid_config(&c);
    const char *p = model_path("allornone", &c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 2);
    CHECK(e);
    const engine_info *in = engine_get_info(e);
    const uint64_t slot = in->dnet_state_bytes_per_seq + in->dnet_conv_bytes_per_seq;
    const uint64_t page = (uint64_t)in->page_tokens * in->kv_bytes_per_token;
    const int V = in->n_vocab, PT = in->page_tokens;
    engine_close(e);
    /* two sequences' slots and 4 pages: a holds 1 page, wants 2 more; b wants 3 */
    e = open_model_ex(p, ENGINE_DNET_AUTO, 2, false, 2 * slot + 4 * page);
    CHECK(e);
    char err[256];
    int32_t toks[64];
    prompt_tokens(toks, 64, V, 5);
    float *out = malloc(sizeof(float) * (size_t)V);
    const int a = engine_seq_new(e), b = engine_seq_new(e);
    CHECK(out && a >= 0 && b >= 0);
    engine_batch_item first = { .seq = a, .tokens = toks, .n_tokens = PT / 2,
                                .logits = ENGINE_LOGITS_NONE, .out = NULL };
    CHECK(engine_forward(e, &first, 1, err, sizeof err) == 0);
    engine_seq_usage ua0, ua1;
    engine_pool_usage p0, p1;
    CHECK(engine_seq_get_usage(e, a, &ua0) == 0);
    engine_get_pool_usage(e, &p0);
    CHECK(ua0.n_tokens == PT / 2 && ua0.n_reserved_tokens == PT);
    engine_batch_item batch[2] = {
        { .seq = a, .tokens = toks + PT / 2, .n_tokens = 2 * PT,
          .logits = ENGINE_LOGITS_LAST, .out = out },        /* 1 page -> 3 */
        { .seq = b, .tokens = toks, .n_tokens = 3 * PT,
          .logits = ENGINE_LOGITS_LAST, .out = out },                 /* 0 pages -> 3 */
    };
    CHECK(engine_forward(e, batch, 2, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "budget"), "%s", err);
    CHECK(engine_seq_get_usage(e, a, &ua1) == 0);
    engine_get_pool_usage(e, &p1);
    CHECK_MSG(ua1.n_tokens == ua0.n_tokens && ua1.n_reserved_tokens == ua0.n_reserved_tokens &&
              ua1.total_reserved_bytes == ua0.total_reserved_bytes,
              "a: %d tokens in %d reserved, was %d in %d", ua1.n_tokens, ua1.n_reserved_tokens, ua0.n_tokens,
              ua0.n_reserved_tokens);
    CHECK(p1.reserved_bytes == p0.reserved_bytes && p1.n_pages_used == p0.n_pages_used);
    CHECK(engine_seq_len(e, b) == 0);
    CHECK(engine_forward(e, &batch[0], 1, err, sizeof err) == 0);
    CHECK(engine_seq_len(e, a) == PT / 2 + 2 * PT);
    free(out);
    engine_close(e);
}

/* ---- broken files ---------------------------------------------------- */

/* Rewrite src into dst, changing one tensor: drop it, reshape it, or
 * retype it (with a correctly sized zero payload). */
enum edit { EDIT_DROP, EDIT_RESHAPE, EDIT_RETYPE, EDIT_ARCH };

static int rewrite(const char *src, const char *dst, const char *tensor, enum edit how)
{
    char err[256];
    gguf_ctx *g = gguf_open(src, err, sizeof err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (how == EDIT_ARCH && kv->key.n == 20 && !memcmp(kv->key.p, "general.architecture", 20))
            gguf_w_str(w, "general.architecture", "mamba9");
        else
            gguf_w_copy_kv(w, kv);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (!strcmp(t->name, tensor ? tensor : "")) {
            if (how == EDIT_DROP)
                continue;
            if (how == EDIT_RESHAPE) {
                uint64_t ne[2] = { t->ne[0], t->ne[1] - 1 };
                gguf_w_tensor(w, t->name, t->type, 2, ne, t->data);
                continue;
            }
            if (how == EDIT_RETYPE) {   /* Q2_K: 256-element blocks of 84 bytes */
                void *z = calloc(1, t->ne[0] / 256 * 84 * t->ne[1]);
                gguf_w_tensor(w, t->name, GGML_Q2_K, t->n_dims, t->ne, z);
                free(z);
                continue;
            }
        }
        gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    int rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static int copy_prefix(const char *src, const char *dst, long n)
{
    FILE *f = fopen(src, "rb"), *o = fopen(dst, "wb");
    int rc = -1;
    if (f && o) {
        char *buf = malloc((size_t)n);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n && fwrite(buf, 1, (size_t)n, o) == (size_t)n)
            rc = 0;
        free(buf);
    }
    if (f) fclose(f);
    if (o) fclose(o);
    return rc;
}

/* engine_open must fail with one line naming the file and containing `what`. */
static bool fails_with(const char *path, const char *what)
{
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    char err[512] = "";
    engine *e = engine_open(&p, err, sizeof err);
    if (e) {
        engine_close(e);
        fprintf(stderr, "    %s opened, expected failure '%s'\n", path, what);
        return false;
    }
    bool ok = strstr(err, path) && strstr(err, what) && !strchr(err, '\n');
    if (!ok)
        fprintf(stderr, "    %s: got '%s', expected a line with the path and '%s'\n", path, err, what);
    return ok;
}

/* Writes tests/tmp/bad_*.gguf (the CLI suite reuses them) and checks each. */
TEST(test_bad_model_files_fail_with_one_clear_line)
{
    synth_config c;
    hybrid_config(&c);
    c.n_ff = 256;
    const char *good = model_path("good", &c);
    CHECK(good);
    char p[512];
    const char *d = test_tmpdir();
    long size = file_size(good);
    CHECK(size > 1000);

    snprintf(p, sizeof p, "%s/bad_truncated.gguf", d);
    CHECK(copy_prefix(good, p, 100) == 0);
    CHECK(fails_with(p, "truncated"));

    snprintf(p, sizeof p, "%s/bad_past_end.gguf", d);
    CHECK(copy_prefix(good, p, size - 64) == 0);
    CHECK(fails_with(p, "points past the end"));

    snprintf(p, sizeof p, "%s/bad_magic.gguf", d);
    CHECK(copy_prefix(good, p, size) == 0);
    FILE *f = fopen(p, "r+b");
    CHECK(f);
    fwrite("GGML", 1, 4, f);
    fclose(f);
    CHECK(fails_with(p, "bad magic"));

    snprintf(p, sizeof p, "%s/bad_arch.gguf", d);
    CHECK(rewrite(good, p, NULL, EDIT_ARCH) == 0);
    CHECK(fails_with(p, "unknown architecture 'mamba9'"));

    snprintf(p, sizeof p, "%s/bad_missing.gguf", d);
    CHECK(rewrite(good, p, "blk.1.attn_k.weight", EDIT_DROP) == 0);
    CHECK(fails_with(p, "missing tensor 'blk.1.attn_k.weight'"));

    snprintf(p, sizeof p, "%s/bad_shape.gguf", d);
    CHECK(rewrite(good, p, "blk.0.attn_qkv.weight", EDIT_RESHAPE) == 0);
    CHECK(fails_with(p, "tensor 'blk.0.attn_qkv.weight' has shape"));

    snprintf(p, sizeof p, "%s/bad_type.gguf", d);
    CHECK(rewrite(good, p, "blk.0.ffn_down.weight", EDIT_RETYPE) == 0);
    CHECK(fails_with(p, "weight type Q2_K"));

    snprintf(p, sizeof p, "%s/bad_missing_file.gguf", d);
    remove(p);
    CHECK(fails_with(p, "cannot open"));
}

TEST(test_model_with_context_length_zero_fails_to_load)
{
    /* it would load and then refuse every request: a load error instead */
    synth_config c;
    hybrid_config(&c);
    c.n_ctx = 77;
    const char *p = model_path("ctx0", &c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 2);
    CHECK(e);
    engine_close(e);
    /* the writer refuses 0, so patch the value in place: the key
     * "<arch>.context_length", then its u32 type tag (4), then 77 */
    FILE *f = fopen(p, "r+b");
    CHECK(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    const char *k = memmem(buf, n, "context_length", 14);
    CHECK(k && (size_t)(k - buf) + 22 <= n);
    uint32_t v;
    memcpy(&v, k + 18, 4);
    CHECK(v == 77);
    v = 0;
    fseek(f, (long)(k - buf) + 18, SEEK_SET);
    fwrite(&v, 4, 1, f);
    fclose(f);
    CHECK(fails_with(p, "context_length is 0"));
}

/* ---- MLA and cache dtypes --------------------------------------------- */

static engine *open_mode(const char *path, int mla_mode, int kv_dtype)
{
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 256;
    p.max_seqs = 2;
    p.mla_mode = mla_mode;
    p.kv_dtype = kv_dtype;
    char err[512];
    engine *e = engine_open(&p, err, sizeof err);
    if (!e)
        fprintf(stderr, "    engine_open: %s\n", err);
    return e;
}

static double compare_modes(const char *path, int ma, int ka, int mb, int kb, int n, int step)
{
    engine *a = open_mode(path, ma, ka), *b = open_mode(path, mb, kb);
    double d = 1e9;
    if (a && b) {
        const int V = engine_get_info(a)->n_vocab;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
        float *la = malloc(sizeof(float) * (size_t)n * V), *lb = malloc(sizeof(float) * (size_t)n * V);
        prompt_tokens(toks, n, V, 5);
        if (toks && la && lb && run_logits(a, toks, n, step, la) == 0 && run_logits(b, toks, n, step, lb) == 0)
            d = max_rel_diff(la, lb, (long)n * V);
        free(toks); free(la); free(lb);
    }
    engine_close(a);
    engine_close(b);
    return d;
}

TEST(test_mla_absorbed_decode_equals_expanded_computation)
{
    synth_config c;
    synth_config_default(&c);
    c.n_layer = 4;
    snprintf(c.pattern, sizeof c.pattern, "LAML");  /* MLA mixed with GQA and DeltaNet */
    c.mla_q_lora = 24;
    const char *p = model_path("mla_mix", &c);
    CHECK(p);
    /* whole prompt at once, and token by token (decode) */
    double d1 = compare_modes(p, ENGINE_MLA_ABSORBED, 0, ENGINE_MLA_EXPANDED, 0, 40, 40);
    double d2 = compare_modes(p, ENGINE_MLA_ABSORBED, 0, ENGINE_MLA_EXPANDED, 0, 40, 1);
    double d3 = compare_modes(p, ENGINE_MLA_AUTO, 0, ENGINE_MLA_EXPANDED, 0, 40, 7);
    CHECK_MSG(d1 < 1e-4 && d2 < 1e-4 && d3 < 1e-4, "absorbed vs expanded: %g, %g, auto: %g", d1, d2, d3);

    synth_config_default(&c);
    snprintf(c.arch, sizeof c.arch, "deepseek2");
    c.n_layer = 3;
    const char *p2 = model_path("mla_ds2", &c);
    CHECK(p2);
    double d4 = compare_modes(p2, ENGINE_MLA_ABSORBED, 0, ENGINE_MLA_EXPANDED, 0, 33, 33);
    CHECK_MSG(d4 < 1e-4, "deepseek2 absorbed vs expanded: %g", d4);
}

TEST(test_f16_and_bf16_kv_cache_stay_close_to_f32)
{
    synth_config c;
    synth_config_default(&c);
    c.n_layer = 4;
    snprintf(c.pattern, sizeof c.pattern, "ALMA");
    const char *p = model_path("kvdtype", &c);
    CHECK(p);
    /* rounding K/V to 11 (f16) or 8 (bf16) significant bits moves logits a little */
    double d16 = compare_modes(p, 0, ENGINE_KV_F16, 0, ENGINE_KV_F32, 48, 48);
    double db16 = compare_modes(p, 0, ENGINE_KV_BF16, 0, ENGINE_KV_F32, 48, 48);
    CHECK_MSG(d16 > 0 && d16 < 5e-3, "f16 cache: %g", d16);
    CHECK_MSG(db16 > 0 && db16 < 3e-2, "bf16 cache: %g", db16);
    /* and the cache really is smaller: 2 bytes per number */
    engine *e16 = open_mode(p, 0, ENGINE_KV_F16), *e32 = open_mode(p, 0, ENGINE_KV_F32);
    CHECK(e16 && e32);
    CHECK(engine_get_info(e16)->kv_bytes_per_token * 2 == engine_get_info(e32)->kv_bytes_per_token);
    CHECK(engine_get_info(e16)->mla_bytes_per_token * 2 == engine_get_info(e32)->mla_bytes_per_token);
    engine_close(e16);
    engine_close(e32);
}

/* ---- sharing: forks, snapshots and truncation equal a cold run ---- */

/* One forward of n tokens on seq with every position's logits. */
static int feed(engine *e, int seq, const int32_t *toks, int n, float *out)
{
    char err[256];
    engine_batch_item it = { .seq = seq, .tokens = toks, .n_tokens = n,
                             .logits = out ? ENGINE_LOGITS_ALL : ENGINE_LOGITS_NONE, .out = out };
    int rc = engine_forward(e, &it, 1, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "    forward: %s\n", err);
    return rc;
}

/* Nothing left in the pool: no sequence, page or snapshot. */
static void check_pool_empty(engine *e)
{
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    CHECK_MSG(pu.reserved_bytes == 0 && pu.n_seqs == 0 && pu.n_snaps == 0, "pool left %llu bytes",
              (unsigned long long)pu.reserved_bytes);
}

/* For a cut P: the cold run feeds toks[0..P) then toks[P..N) and keeps the
 * logits of the second piece. A source sequence feeds toks[0..P), takes a
 * snapshot, then runs on with other tokens (so its state and pages move
 * past P). Three warm runs then feed the same second piece, each with the
 * same calls as the cold one: a fork of the source at P with the snapshot
 * restored, the source itself truncated to P, and a fork of a sequence
 * whose whole length is P (no snapshot). Each must equal the cold logits
 * to the bit: the same kernels ran on the same bytes. The pool returns to
 * zero afterwards. */
static void check_fork_equals_cold(const char *tag, synth_config *c, int P)
{
    const char *p = model_path(tag, c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 6);
    CHECK(e);
    enum { N = 45, X = 60 };
    const int V = engine_get_info(e)->n_vocab;
    int32_t toks[N], other[X];
    prompt_tokens(toks, N, V, 11);
    prompt_tokens(other, X, V, 12);
    float *cold = malloc(sizeof(float) * (size_t)N * V), *warm = malloc(sizeof(float) * (size_t)N * V);
    CHECK(cold && warm);
    int s0 = engine_seq_new(e);
    CHECK(s0 >= 0 && feed(e, s0, toks, P, NULL) == 0 && feed(e, s0, toks + P, N - P, cold) == 0);
    engine_seq_free(e, s0);

    int src = engine_seq_new(e);
    CHECK(src >= 0 && feed(e, src, toks, P, NULL) == 0);
    engine_snap *snap = engine_snap_take(e, src);
    CHECK(snap && engine_snap_tokens(snap) == P);
    int whole = engine_seq_fork(e, src, P);         /* a sequence of length exactly P */
    CHECK(whole >= 0);
    CHECK(feed(e, src, other, X - P, NULL) == 0);   /* the source moves on */

    const char *how[3] = { "fork at the snapshot", "truncate to the snapshot", "fork of the whole sequence" };
    for (int k = 0; k < 3; k++) {
        int w = -1;
        if (k == 0) {
            w = engine_seq_fork(e, src, P);
            CHECK(w >= 0 && engine_snap_restore(e, w, snap) == 0);
        } else if (k == 1) {
            w = src;
            CHECK(engine_seq_truncate(e, w, P, snap) == 0);
        } else {
            w = engine_seq_fork(e, whole, P);
            CHECK(w >= 0);
        }
        CHECK(engine_seq_len(e, w) == P);
        engine_seq_usage u;
        CHECK(engine_seq_get_usage(e, w, &u) == 0);
        if (engine_get_info(e)->n_attn_layers + engine_get_info(e)->n_mla_layers > 0)
            CHECK_MSG(u.n_shared_pages == P / 16, "%s: %d shared pages, expected %d", how[k], u.n_shared_pages,
                      P / 16);
        memset(warm, 0, sizeof(float) * (size_t)N * V);
        CHECK(feed(e, w, toks + P, N - P, warm) == 0);
        CHECK_MSG(memcmp(warm, cold, sizeof(float) * (size_t)(N - P) * V) == 0,
                  "%s (%s, P = %d): logits differ from the cold run, max relative %g", how[k], tag, P,
                  max_rel_diff(warm, cold, (long)(N - P) * V));
        if (k != 1)
            engine_seq_free(e, w);
    }
    /* the source, truncated, no longer shares a page it will write */
    engine_seq_free(e, src);
    engine_seq_free(e, whole);
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    CHECK(pu.n_snaps == 1 && pu.snap_state_bytes + pu.snap_conv_bytes == engine_snap_bytes(e));
    CHECK(pu.reserved_bytes == pu.snap_state_bytes + pu.snap_conv_bytes && pu.n_pages_used == 0);
    engine_snap_free(e, snap);
    check_pool_empty(e);
    free(cold);
    free(warm);
    engine_close(e);
}

static void layout_config(synth_config *c, const char *pattern)
{
    synth_config_default(c);
    c->n_layer = 4;
    snprintf(c->pattern, sizeof c->pattern, "%s", pattern);
    c->dnet_n_k = 2;
    c->dnet_n_v = 4;
    c->seed = 9;
}

TEST(test_fork_snapshot_and_truncate_equal_a_cold_run_bit_for_bit)
{
    static const struct { const char *tag, *pattern; } layouts[] = {
        { "fork_attn", "A" },       /* pure attention */
        { "fork_hyb", "LLLA" },     /* 3:1 hybrid */
        { "fork_dnet", "L" },       /* DeltaNet only */
        { "fork_mla", "LAML" },     /* MLA with GQA and DeltaNet */
    };
    static const int cuts[] = { 20, 32, 1 };       /* mid-page, a page boundary, one token */
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            synth_config c;
            layout_config(&c, layouts[i].pattern);
            check_fork_equals_cold(layouts[i].tag, &c, cuts[k]);
        }
}

/* A truncation to a length inside a page another sequence holds copies
 * that page before writing: the other sequence's tokens stay as they were. */
TEST(test_truncate_into_a_shared_page_leaves_the_other_holder_unchanged)
{
    synth_config c;
    layout_config(&c, "A");
    const char *p = model_path("trunc_cow", &c);
    CHECK(p);
    engine *e = open_model(p, ENGINE_DNET_AUTO, 4);
    CHECK(e);
    enum { N = 40 };
    const int V = engine_get_info(e)->n_vocab;
    int32_t toks[N], other[N];
    prompt_tokens(toks, N, V, 21);
    prompt_tokens(other, N, V, 22);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    CHECK(a && b);
    int s = engine_seq_new(e);
    CHECK(s >= 0 && feed(e, s, toks, 32, NULL) == 0);
    int f = engine_seq_fork(e, s, 32);              /* shares both pages */
    CHECK(f >= 0);
    engine_seq_usage u;
    CHECK(engine_seq_get_usage(e, f, &u) == 0 && u.n_shared_pages == 2);
    CHECK(engine_seq_truncate(e, f, 20, NULL) == 0);   /* page 1 copied, then overwritten */
    CHECK(feed(e, f, other, 12, NULL) == 0);
    CHECK(engine_seq_get_usage(e, f, &u) == 0 && u.n_shared_pages == 1);
    char err[256];
    engine_batch_item it = { .seq = s, .tokens = toks + 32, .n_tokens = 1, .logits = ENGINE_LOGITS_LAST, .out = a };
    CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
    engine_seq_free(e, f);
    engine_seq_free(e, s);
    int cold = engine_seq_new(e);
    CHECK(cold >= 0 && feed(e, cold, toks, 32, NULL) == 0);
    it = (engine_batch_item){ .seq = cold, .tokens = toks + 32, .n_tokens = 1,
                              .logits = ENGINE_LOGITS_LAST, .out = b };
    CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
    CHECK(memcmp(a, b, sizeof(float) * V) == 0);
    engine_seq_free(e, cold);
    free(a);
    free(b);
    engine_close(e);
}

/* A snapshot taken inside a step (engine_batch_item.snap after P of N
 * tokens: the engine copies every recurrent layer's state and conv window
 * there, so the prefix store needs no step that stops at P). The step's
 * logits are those of the same step without it: bit for bit on the
 * recurrent path (the copy changes nothing), within 1e-4 on the chunked
 * one (its chunks restart at P); with a bf16 state, up to P (the step then
 * goes on from the rounded snapshot, and reads after P as its restore). The snapshot is the state after P
 * tokens: restored into a fork at P, feeding the rest gives the logits of
 * a snapshot taken after a step of P tokens, within 1e-4 (the projections
 * ran in batches of another size). Cuts: one token in, mid-page, one short
 * of the end (the store's own); with N past ENGINE_UBATCH, at the pass
 * boundary and inside the second pass; f32 and bf16 states. */
static void check_snap_in_step(const char *tag, synth_config *c, int mode, int state_dtype, int N, int P)
{
    const char *p = model_path(tag, c);
    CHECK(p);
    engine_params ep;
    test_params(&ep, p, mode, 10);      /* room in the default budget for 4 sequences and 3 snapshots */
    ep.n_ctx = 1024;
    ep.state_dtype = state_dtype;
    engine *e = open_params(&ep);
    CHECK(e);
    char err[256];
    const int V = engine_get_info(e)->n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)N);
    float *in = malloc(sizeof(float) * (size_t)N * V), *plain = malloc(sizeof(float) * (size_t)N * V);
    float *cold = malloc(sizeof(float) * (size_t)N * V), *warm = malloc(sizeof(float) * (size_t)N * V);
    CHECK(toks && in && plain && cold && warm);
    prompt_tokens(toks, N, V, 31);
    /* one step with the snapshot inside it, and the same step without */
    const int a = engine_seq_new(e), b = engine_seq_new(e);
    engine_snap *sn = engine_snap_new(e);
    CHECK(a >= 0 && b >= 0 && sn && engine_snap_tokens(sn) == -1);
    engine_batch_item it = { .seq = a, .tokens = toks, .n_tokens = N,
                             .logits = ENGINE_LOGITS_ALL, .out = in, .snap = sn, .snap_at = P };
    CHECK_MSG(engine_forward(e, &it, 1, err, sizeof err) == 0, "%s", err);
    CHECK(feed(e, b, toks, N, plain) == 0);
    CHECK_MSG(engine_snap_tokens(sn) == P, "%s: snapshot of length %d, expected %d", tag, engine_snap_tokens(sn), P);
    /* a bf16 state is rounded into the snapshot and the step goes on from
     * the rounded numbers (rec_snapshot_state): its rows from P on are
     * compared with the restored snapshot's below, not with the plain step */
    const bool b16 = state_dtype == ENGINE_STATE_BF16;
    const long rows = b16 ? P : N;
    const double d_step = max_rel_diff(in, plain, rows * V);
    if (mode == ENGINE_DNET_RECURRENT)
        CHECK_MSG(memcmp(in, plain, sizeof(float) * (size_t)rows * V) == 0,
                  "%s (P = %d): the step's logits changed with a snapshot inside it, max relative %g", tag, P, d_step);
    else
        CHECK_MSG(d_step < 1e-4, "%s (P = %d): logits differ by %g with a snapshot inside the step", tag, P, d_step);
    /* against a snapshot taken after a step of its own: P tokens, take, the rest */
    const int s0 = engine_seq_new(e);
    CHECK(s0 >= 0 && feed(e, s0, toks, P, NULL) == 0);
    engine_snap *own = engine_snap_take(e, s0);
    CHECK(own && feed(e, s0, toks + P, N - P, cold) == 0);
    const int w = engine_seq_fork(e, a, P);
    CHECK(w >= 0 && engine_snap_restore(e, w, sn) == 0 && feed(e, w, toks + P, N - P, warm) == 0);
    const double d_rest = max_rel_diff(warm, cold, (long)(N - P) * V);
    /* a bf16 state is rounded at P in both: a rounding flipped by the other batch shapes moves more */
    const double tol = b16 ? 1e-2 : 1e-4;
    CHECK_MSG(d_rest < tol, "%s (P = %d): restored from the in-step snapshot, logits differ by %g", tag, P, d_rest);
    /* the step that took the snapshot read on, after P, as its restore does
     * (a prefix-cache hit reads as the cold request that stored it): the
     * same state numbers, only the projections' batch shapes differ */
    const double d_hit = max_rel_diff(in + (size_t)P * V, warm, (long)(N - P) * V);
    /* (a step longer than ENGINE_UBATCH rounds a bf16 state again between its passes, the restore's doesn't) */
    const double tol_hit = b16 && N > ENGINE_UBATCH ? 1e-2 : 1e-4;
    CHECK_MSG(d_hit < tol_hit, "%s (P = %d): the in-step snapshot's restore differs from the step by %g after P", tag,
              P, d_hit);
    /* a snapshot outside the item's tokens is refused, nothing changed */
    engine_snap *bad = engine_snap_new(e);
    CHECK(bad);
    const int len_b = engine_seq_len(e, b);
    for (int at = 0; at <= 1; at++) {
        engine_batch_item nb = { .seq = b, .tokens = toks, .n_tokens = 2,
                                 .logits = ENGINE_LOGITS_NONE, .out = NULL, .snap = bad, .snap_at = at ? 2 : 0 };
        CHECK(engine_forward(e, &nb, 1, err, sizeof err) != 0 && strstr(err, "snapshot"));
    }
    CHECK(engine_seq_len(e, b) == len_b && engine_snap_tokens(bad) == -1);
    engine_snap_free(e, bad);
    engine_snap_free(e, own);
    engine_snap_free(e, sn);
    engine_seq_free(e, a);
    engine_seq_free(e, b);
    engine_seq_free(e, s0);
    engine_seq_free(e, w);
    check_pool_empty(e);
    free(toks);
    free(in);
    free(plain);
    free(cold);
    free(warm);
    engine_close(e);
}

TEST(test_snapshot_inside_a_step_equals_one_taken_after_a_step_of_its_own)
{
    static const struct { const char *tag, *pattern; } layouts[] = {
        { "snapstep_hyb", "LLLA" },
        { "snapstep_dnet", "L" },
        { "snapstep_mla", "LAML" },
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        synth_config c;
        layout_config(&c, layouts[i].pattern);
        for (int mode = 0; mode < 2; mode++) {
            const int m = mode ? ENGINE_DNET_CHUNKED : ENGINE_DNET_RECURRENT;
            check_snap_in_step(layouts[i].tag, &c, m, ENGINE_STATE_F32, 45, 1);
            check_snap_in_step(layouts[i].tag, &c, m, ENGINE_STATE_F32, 45, 20);
            check_snap_in_step(layouts[i].tag, &c, m, ENGINE_STATE_F32, 45, 44);
        }
    }
    synth_config c;
    layout_config(&c, "LLLA");
    c.n_ctx = 1024;
    check_snap_in_step("snapstep_long", &c, ENGINE_DNET_RECURRENT, ENGINE_STATE_F32, ENGINE_UBATCH + 20, ENGINE_UBATCH);
    check_snap_in_step("snapstep_long", &c, ENGINE_DNET_RECURRENT, ENGINE_STATE_F32, ENGINE_UBATCH + 20,
                       ENGINE_UBATCH + 7);
    check_snap_in_step("snapstep_long", &c, ENGINE_DNET_CHUNKED, ENGINE_STATE_BF16, ENGINE_UBATCH + 20, 300);
    check_snap_in_step("snapstep_bf16", &c, ENGINE_DNET_RECURRENT, ENGINE_STATE_BF16, 45, 20);
}
