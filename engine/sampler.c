/* sampler.c - turning logits into the next token, seeded per request.
 *
 * Owns: the sampling chain (logit bias, repetition penalty, frequency and
 * presence penalties, top-k, temperature softmax, top-p, typical-p, min-p,
 * draw), the counts of the tokens drawn so far, greedy argmax, and a per-sampler xoshiro256** PRNG
 * seeded through splitmix64, so the same seed gives the same choices.
 * Does not own: stop strings (server), logits (engine), the seed policy
 * for requests without one (server).
 * ref: CTRL (Keskar et al. 2019) for the penalty; Holtzman et al. 2019 for
 * top-p; OpenAI's API reference for frequency/presence penalties and
 * logit_bias; Meister et al. 2022 ("Locally Typical Sampling") and HF's
 * TypicalLogitsWarper for typical-p; "min-p" as in llama.cpp/HF (keep p >= min_p * p_max); xoshiro256**
 * and splitmix64 by Blackman and Vigna.
 *
 * Order of the chain (as the brief fixes it): bias -> repetition penalty
 * -> frequency/presence penalties -> top-k -> temperature softmax -> top-p
 * -> typical-p -> min-p -> draw. The bias comes first, as an edit of the
 * model's logits (vLLM applies logit_bias as a logits processor before its
 * penalties); typical-p follows top-p as in TGI's and HF's warper order. Top-k before the softmax
 * is free (it ranks logits, which temperature does not reorder); top-p and
 * min-p see the tempered distribution, as in Hugging Face's order
 * (llama.cpp applies temperature last instead, so its top-p/min-p cut on
 * T = 1 probabilities).
 *
 * All memory is allocated in sampler_new(); sampler_sample() allocates
 * nothing, and the frequency/presence penalties cost O(distinct tokens
 * drawn) per step, not O(vocab): the sampler keeps a count per token and
 * the list of tokens with a non-zero count.
 */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

/* One candidate token: logit, then probability after the softmax. */
typedef struct samp_cand {
    int32_t id;
    float v;
    float aux;              /* typical-p: the probability while v holds the sort key */
} samp_cand;

/* A sampler. Owned by one request (the scheduler thread drives it); not
 * shared between threads. */
struct sampler {
    sampler_params p;
    int n_vocab;
    uint64_t rng[4];        /* xoshiro256** state, never all zero */
    samp_cand *cand;        /* [n_vocab] scratch */
    uint8_t *seen;          /* [n_vocab] penalty de-dup marks, all 0 between calls */
    sampler_bias *bias;     /* [n_bias] copy of p.bias (p.bias is cleared) */
    int n_bias;
    uint32_t *count;        /* [n_vocab] times each token was drawn; NULL without freq/presence penalty */
    int32_t *drawn;         /* [n_drawn] tokens with count > 0, in first-drawn order; NULL likewise */
    int n_drawn;
    /* the distribution of the last draw, for sampler_last_top */
    bool last_greedy;       /* argmax: the logits the caller passed, at T = 1 */
    size_t last_n_c;        /* cand[0..last_n_c) hold the kept probabilities */
    double last_total;      /* their sum (the renormaliser) */
};

/* ------------------------------------------------------------------ */
/* PRNG                                                                */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t sampler_choice_seed(uint64_t seed, int i)
{
    if (i <= 0)
        return seed;
    uint64_t x = seed + (uint64_t)(i - 1) * 0x9e3779b97f4a7c15ull;
    return splitmix64(&x);      /* advances x by one more step first */
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256**: next 64 random bits */
static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform double in [0, 1) from the top 53 bits */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */

void sampler_params_default(sampler_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->typical_p = 1.0f;
    p->bias = NULL;
    p->n_bias = 0;
    p->greedy = false;
    p->seed = 0;
}

sampler *sampler_new(const sampler_params *p, int n_vocab)
{
    sampler *s = NULL;
    if (!p || n_vocab <= 0)
        return NULL;
    s = FAULT_OR(calloc(1, sizeof *s));
    if (!s)
        goto fail;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = FAULT_OR(malloc((size_t)n_vocab * sizeof *s->cand));
    s->seen = FAULT_OR(calloc((size_t)n_vocab, 1));
    if (!s->cand || !s->seen)
        goto fail;
    s->p.bias = NULL;
    s->p.n_bias = 0;
    if (p->n_bias > 0 && p->bias) {
        s->bias = FAULT_OR(malloc((size_t)p->n_bias * sizeof *s->bias));
        if (!s->bias)
            goto fail;
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
        s->n_bias = p->n_bias;
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        s->count = FAULT_OR(calloc((size_t)n_vocab, sizeof *s->count));
        s->drawn = FAULT_OR(malloc((size_t)n_vocab * sizeof *s->drawn));
        if (!s->count || !s->drawn)
            goto fail;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);     /* splitmix64 never yields four zeros in a row */
    return s;

fail:
    sampler_free(s);
    return NULL;
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->seen);
    free(s->bias);
    free(s->count);
    free(s->drawn);
    free(s);
}

/* ------------------------------------------------------------------ */
/* Ordering helpers                                                    */

/* Strict total order "a ranks before b": larger value, then smaller id,
 * so every selection below is deterministic. */
static int better(const samp_cand *a, const samp_cand *b)
{
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

/* Sift-down in a heap whose root is the WORST element. */
static void sift_worst(samp_cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && better(&h[w], &h[l]))
            w = l;
        if (l + 1 < n && better(&h[w], &h[l + 1]))
            w = l + 1;
        if (w == i)
            return;
        samp_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Moves the m best of c[0..n) to c[0..m), sorted best first; the rest
 * stay in c[m..n) (unordered). O(n log m), in place, no allocation. */
static void select_top_sorted(samp_cand *c, size_t n, size_t m)
{
    if (m > n)
        m = n;
    if (m == 0)
        return;
    /* heap of the m best so far, worst at the root */
    for (size_t i = m / 2; i-- > 0;)
        sift_worst(c, m, i);
    for (size_t i = m; i < n; i++) {
        if (better(&c[i], &c[0])) {
            samp_cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sift_worst(c, m, 0);
        }
    }
    /* heap sort: popping the worst to the back leaves best first */
    for (size_t k = m; k > 1; k--) {
        samp_cand t = c[0];
        c[0] = c[k - 1];
        c[k - 1] = t;
        sift_worst(c, k - 1, 0);
    }
}

int32_t sampler_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ------------------------------------------------------------------ */
/* Sampling                                                            */

/* CTRL-style penalty on each distinct id in history:
 * l' = l / r if l > 0, else l * r (r > 1 pushes seen tokens down). */
static void apply_penalty(sampler *s, float *logits, const int32_t *history, int n_history)
{
    const float r = s->p.repetition_penalty;
    if (!history || n_history <= 0 || !(r > 0.0f) || r == 1.0f)
        return;
    for (int i = 0; i < n_history; i++) {
        int32_t id = history[i];
        if (id < 0 || id >= s->n_vocab || s->seen[id])
            continue;
        s->seen[id] = 1;
        logits[id] = logits[id] > 0.0f ? logits[id] / r : logits[id] * r;
    }
    for (int i = 0; i < n_history; i++) {
        int32_t id = history[i];
        if (id >= 0 && id < s->n_vocab)
            s->seen[id] = 0;
    }
}

/* l[id] += bias for each biased token; a bias of -inf bans. */
static void apply_bias(const sampler *s, float *logits)
{
    for (int i = 0; i < s->n_bias; i++) {
        int32_t id = s->bias[i].id;
        if (id >= 0 && id < s->n_vocab)
            logits[id] += s->bias[i].bias;
    }
}

/* OpenAI's penalties over the tokens drawn so far:
 * l[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty.
 * O(distinct tokens drawn). */
static void apply_oai_penalties(const sampler *s, float *logits)
{
    if (!s->count)
        return;
    const float f = s->p.frequency_penalty, pres = s->p.presence_penalty;
    for (int i = 0; i < s->n_drawn; i++) {
        int32_t id = s->drawn[i];
        logits[id] -= (float)s->count[id] * f + pres;
    }
}

/* Counts a returned token for the penalties. */
static void record_draw(sampler *s, int32_t id)
{
    if (!s->count || id < 0 || id >= s->n_vocab)
        return;
    if (s->count[id]++ == 0)
        s->drawn[s->n_drawn++] = id;    /* at most n_vocab distinct ids */
}

/* Locally typical sampling over c[0..n_c) holding probabilities: with
 * q_i = p_i / sum p and H = -sum q log q, keep the tokens whose surprise
 * -log q_i is closest to H, in that order, until their mass reaches
 * typical_p (at least one). Returns the new count; c[0..count) hold the
 * probabilities again, most typical first. ref: HF TypicalLogitsWarper. */
static size_t typical_cut(samp_cand *c, size_t n_c, double typical_p)
{
    double mass = 0.0, h = 0.0;
    for (size_t i = 0; i < n_c; i++)
        mass += c[i].v;
    for (size_t i = 0; i < n_c; i++) {
        double q = c[i].v / mass;
        if (q > 0.0)
            h -= q * log(q);
    }
    /* sort key: -|(-log q) - H|, so the most typical ranks best */
    for (size_t i = 0; i < n_c; i++) {
        double q = c[i].v / mass;
        c[i].aux = c[i].v;
        c[i].v = q > 0.0 ? (float)-fabs(-log(q) - h) : -INFINITY;
    }
    select_top_sorted(c, n_c, n_c);
    double cum = 0.0;
    size_t keep = 0;
    while (keep < n_c) {
        cum += c[keep].aux / mass;
        keep++;
        if (cum >= typical_p)
            break;
    }
    for (size_t i = 0; i < n_c; i++)
        c[i].v = c[i].aux;
    return keep;
}

static int32_t sample_chain(sampler *s, float *logits, const int32_t *history,
                            int n_history, float *logprob);

int32_t sampler_sample(sampler *s, float *logits, const int32_t *history,
                       int n_history, float *logprob)
{
    if (!s || !logits)
        return -1;
    int32_t id = sample_chain(s, logits, history, n_history, logprob);
    record_draw(s, id);
    return id;
}

static int32_t sample_chain(sampler *s, float *logits, const int32_t *history,
                            int n_history, float *logprob)
{
    const int n = s->n_vocab;
    const sampler_params *p = &s->p;

    /* NaN never wins; +inf is clamped so the softmax stays finite */
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        else if (logits[i] > FLT_MAX)
            logits[i] = FLT_MAX;
    }

    /* 1. logit bias, repetition penalty, frequency and presence penalties */
    apply_bias(s, logits);
    apply_penalty(s, logits, history, n_history);
    apply_oai_penalties(s, logits);

    /* greedy: argmax; logprob is log softmax at T = 1 (the model's own
     * distribution), since the "final distribution" of argmax is a point */
    s->last_greedy = p->greedy || !(p->temperature > 0.0f);
    s->last_n_c = 0;
    if (s->last_greedy) {
        int32_t best = sampler_argmax(logits, n);
        if (logprob) {
            double m = logits[best], z = 0.0;
            for (int i = 0; i < n; i++)
                z += exp((double)logits[i] - m);
            *logprob = isinf(logits[best]) ? -INFINITY : (float)-log(z);
        }
        return best;
    }

    /* candidates: every token that is not masked out (-inf) */
    samp_cand *c = s->cand;
    size_t n_c = 0;
    for (int i = 0; i < n; i++) {
        if (logits[i] > -INFINITY) {
            c[n_c].id = i;
            c[n_c].v = logits[i];
            n_c++;
        }
    }
    if (n_c == 0) {
        if (logprob)
            *logprob = -INFINITY;
        return 0;       /* everything masked: nothing better to say */
    }

    /* 2. top-k: the k largest logits, sorted best first */
    size_t n_sorted = 0;
    if (p->top_k > 0 && (size_t)p->top_k < n_c) {
        select_top_sorted(c, n_c, (size_t)p->top_k);
        n_c = (size_t)p->top_k;
        n_sorted = n_c;
    }

    /* 3. temperature softmax: p_i = exp((l_i - l_max) / T) / Z */
    double l_max = -INFINITY;
    for (size_t i = 0; i < n_c; i++)
        if (c[i].v > l_max)
            l_max = c[i].v;
    double z = 0.0;
    for (size_t i = 0; i < n_c; i++) {
        double e = exp(((double)c[i].v - l_max) / (double)p->temperature);
        c[i].v = (float)e;
        z += e;
    }
    for (size_t i = 0; i < n_c; i++)
        c[i].v = (float)(c[i].v / z);
    double p_max = 0.0;
    for (size_t i = 0; i < n_c; i++)
        if (c[i].v > p_max)
            p_max = c[i].v;

    /* 4. top-p: the smallest best-first prefix with mass >= top_p (at
     * least one token). Sorts only as far as needed, doubling the sorted
     * prefix, so a peaked distribution over 250k tokens sorts a few hundred. */
    if (p->top_p < 1.0f) {
        const double target = p->top_p;
        double cum = 0.0;
        size_t keep = 0, m = n_sorted ? n_sorted : 256;
        for (;;) {
            if (m > n_c)
                m = n_c;
            if (m > n_sorted) {
                select_top_sorted(c + n_sorted, n_c - n_sorted, m - n_sorted);
                n_sorted = m;
            }
            while (keep < n_sorted) {
                cum += c[keep].v;
                keep++;
                if (cum >= target)
                    break;
            }
            if (cum >= target || n_sorted == n_c)
                break;
            m = 2 * n_sorted;
        }
        n_c = keep > 0 ? keep : 1;
    }

    /* 5. typical-p (the best may leave here, so min-p's p_max is re-read) */
    if (p->typical_p < 1.0f && p->typical_p > 0.0f && n_c > 1) {
        n_c = typical_cut(c, n_c, p->typical_p);
        p_max = 0.0;
        for (size_t i = 0; i < n_c; i++)
            if (c[i].v > p_max)
                p_max = c[i].v;
    }

    /* 6. min-p: drop tokens with p < min_p * p_max (the best always stays) */
    if (p->min_p > 0.0f) {
        const double thr = (double)p->min_p * p_max;
        size_t k = 0;
        for (size_t i = 0; i < n_c; i++)
            if (c[i].v >= thr || c[i].v == p_max)
                c[k++] = c[i];
        n_c = k;
    }

    /* 7. draw from what is left, renormalised */
    double total = 0.0;
    for (size_t i = 0; i < n_c; i++)
        total += c[i].v;
    double u = rng_uniform(s->rng) * total, acc = 0.0;
    size_t pick = n_c - 1;
    for (size_t i = 0; i < n_c; i++) {
        acc += c[i].v;
        if (u < acc) {
            pick = i;
            break;
        }
    }
    if (logprob)
        *logprob = (float)(log((double)c[pick].v) - log(total));
    s->last_n_c = n_c;
    s->last_total = total;
    return c[pick].id;
}

/* ------------------------------------------------------------------ */
/* Log-probabilities of the top tokens                                 */

/* Keeps t->id/logprob[0..t->n) the n_top best keys seen, best first
 * (ties: the smaller id); the keys are converted to logprobs afterwards.
 * O(n_top) per insertion that makes the cut, O(1) otherwise. */
static void top_insert(sampler_top *t, int n_top, int32_t id, float key)
{
    int i = t->n;
    if (i == n_top) {
        if (!(key > t->logprob[i - 1] || (key == t->logprob[i - 1] && id < t->id[i - 1])))
            return;
        i--;
    } else {
        t->n++;
    }
    while (i > 0 && (key > t->logprob[i - 1] || (key == t->logprob[i - 1] && id < t->id[i - 1]))) {
        t->id[i] = t->id[i - 1];
        t->logprob[i] = t->logprob[i - 1];
        i--;
    }
    t->id[i] = id;
    t->logprob[i] = key;
}

static int clamp_top(int n_top)
{
    return n_top < 0 ? 0 : n_top > SAMPLER_MAX_TOP ? SAMPLER_MAX_TOP : n_top;
}

float sampler_logprobs(const float *logits, int n_vocab, float temp, int32_t tok, int n_top,
                       sampler_top *out)
{
    /* log p_i = (l_i - l_max) / T - log sum_j exp((l_j - l_max) / T) */
    const double t = temp > 0.0f ? (double)temp : 1.0;
    double l_max = -INFINITY, z = 0.0;
    n_top = clamp_top(n_top);
    if (out)
        out->n = 0;
    for (int i = 0; i < n_vocab; i++)
        if (!isnan(logits[i]) && logits[i] > l_max)
            l_max = logits[i];
    if (isinf(l_max))
        return -INFINITY;   /* everything masked (or +inf): no distribution to speak of */
    for (int i = 0; i < n_vocab; i++)
        if (!isnan(logits[i]))
            z += exp(((double)logits[i] - l_max) / t);
    const double log_z = log(z);
    if (out && n_top > 0) {
        for (int i = 0; i < n_vocab; i++)
            if (!isnan(logits[i]) && logits[i] > -INFINITY)
                top_insert(out, n_top, i, logits[i]);
        for (int k = 0; k < out->n; k++)
            out->logprob[k] = (float)(((double)out->logprob[k] - l_max) / t - log_z);
    }
    if (tok < 0 || tok >= n_vocab || isnan(logits[tok]))
        return -INFINITY;
    return (float)(((double)logits[tok] - l_max) / t - log_z);
}

void sampler_last_top(sampler *s, const float *logits, int n_top, sampler_top *out)
{
    out->n = 0;
    n_top = clamp_top(n_top);
    if (!s || n_top == 0)
        return;
    if (s->last_greedy) {
        sampler_logprobs(logits, s->n_vocab, 1.0f, -1, n_top, out);
        return;
    }
    for (size_t i = 0; i < s->last_n_c; i++)
        if (s->cand[i].v > 0.0f)
            top_insert(out, n_top, s->cand[i].id, s->cand[i].v);
    for (int k = 0; k < out->n; k++)
        out->logprob[k] = (float)(log((double)out->logprob[k]) - log(s->last_total));
}
