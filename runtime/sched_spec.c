/* sched_spec.c - speculative decoding inside the scheduler: drafts,
 * verification in one engine step, rollback.
 *
 * Owns: the draft sources (n-gram / prompt lookup over the prompt and the
 * output, the client's prediction aligned against the output, the draft
 * model's rounds, and the MTP head's rows and drafts: spec_mtp), the
 * adaptive draft length, the verify item of a decoding sequence (built in
 * one place, spec_item), accepting or rejecting the drafts after the step,
 * and rolling the sequence back to the last accepted token.
 * Does not own: the engine step (the drafts ride in the sequence's item of
 * the ordinary batched step: continuous batching stays continuous), the
 * sampler, the grammar matcher.
 *
 * Verification. A decoding sequence has c >= 1 accepted tokens not fed yet
 * (the last one sampled, and after a rejection the accepted drafts that
 * were rolled back with it); its item feeds them and the k drafts
 * d1..dk, with every position's logits. Row c - 1 + i is the target's
 * distribution after d1..di. For i = 0, 1, ... the scheduler samples from
 * row c - 1 + i exactly as a plain decode step would (grammar mask,
 * penalties over the tokens so far, the request's sampler and seed) and
 * emits the token; while it equals d(i+1) the next row is valid and it
 * goes on, else it stops: m drafts accepted and one token of the target's
 * own (the correction, or the bonus after all k). For a greedy request
 * that is the argmax rule; for a sampled one it is the standard
 * speculative-sampling rule with a point-mass draft: accept d with
 * probability p(d), else draw from p with d's mass removed, renormalised.
 * Drawing x ~ p and accepting iff x == d is that rule exactly (P(accept)
 * = p(d); given a rejection x is distributed as p restricted to x != d),
 * so the output distribution is the non-speculative one, token for token,
 * and each emitted token's logprob is of the verifying distribution.
 *
 * Rollback. With m == k every fed token stays. Else a model of attention
 * layers only truncates its KV to the accepted length; a model with
 * recurrent layers (DeltaNet, Mamba, Mamba-2, KDA, short conv) cannot undo
 * the rejected tokens' updates, so the verify step takes a snapshot of the
 * state after the c carried tokens (always accepted) inside the step
 * (engine_batch_item.snap at snap_at = c), the sequence is truncated back
 * there, and d1..dm ride in the next step's item with the correction
 * (no step is spent re-feeding them). The snapshot is held from
 * admission, so a verify step allocates nothing.
 * ref: Leviathan et al. 2023 (speculative sampling), llama.cpp's
 * ngram-simple and vLLM's prompt lookup (the n-gram source), OpenAI's
 * Predicted Outputs (the prediction), docs/serving.md 17.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "sampler.h"
#include "scheduler_impl.h"
#include "tokenizer.h"

/* n-gram lookup: the longest suffix of the context, of SPEC_NGRAM_MAX
 * tokens down to SPEC_NGRAM_MIN, that occurred earlier; the draft is what
 * followed its latest earlier occurrence. */
enum { SPEC_NGRAM_MAX = 4, SPEC_NGRAM_MIN = 2 };
/* prediction re-alignment: the longest output suffix of at most this many
 * tokens (and at least SPEC_NGRAM_MIN) found in the prediction */
enum { SPEC_ALIGN_MAX = 8 };
/* bytes of a draft's text the grammar pre-check looks at */
enum { SPEC_GRAMMAR_BYTES = 4096 };

const char *sched_spec_type_name(int type)
{
    return type == SCHED_SPEC_NGRAM ? "ngram-simple" : type == SCHED_SPEC_DRAFT ? "draft-simple"
         : type == SCHED_SPEC_MTP ? "draft-mtp" : "none";
}

/* The verify rows: enough for every sequence to verify a full draft plus
 * the tokens a rollback carries, bounded to 128 MiB of logits (a 248K
 * vocabulary gets 135 rows: a few sequences verify per step, the others
 * decode plainly that step), and never fewer than one full verify item. */
/* The draft engine's pool into s->st (s->mu held; this thread owns the
 * engine, /stats and /metrics read the copy). */
static void draft_stats(sched *s)
{
    if (!s->de)
        return;
    engine_pool_usage u;
    const engine_info *di = engine_get_info(s->de);
    engine_get_pool_usage(s->de, &u);
    s->st.draft_weight_bytes = di->weight_bytes;
    s->st.draft_budget_bytes = u.budget_bytes;
    s->st.draft_reserved_bytes = u.reserved_bytes;
    s->st.draft_seqs = u.n_seqs;
    s->st.draft_snaps = u.n_snaps;
    s->st.draft_n_layer = di->n_layer;
}

/* The MTP KV's pool into s->st (s->mu held), as draft_stats. */
static void mtp_stats(sched *s)
{
    if (!s->mitems)
        return;
    engine_pool_usage u;
    engine_get_pool_usage(s->e, &u);
    s->st.mtp_budget_bytes = u.mtp_budget_bytes;
    s->st.mtp_reserved_bytes = u.mtp_reserved_bytes;
    s->st.mtp_seqs = u.mtp_seqs;
    uint64_t hb = 0;
    for (int i = 0; i < s->n_running; i++)
        hb += s->running[i]->spec.mhid ? (uint64_t)s->mtp_rows * (uint64_t)engine_get_info(s->e)->n_embd * 4u : 0;
    s->st.mtp_hidden_bytes = hb;
}

/* The draft model: its vocabulary must be the target's, id for id (the
 * count and every token's text), or its tokens would mean other text. */
static int draft_init(sched *s, char *err, size_t errlen)
{
    const tokenizer *ta = engine_tokenizer(s->e), *tb = engine_tokenizer(s->de);
    const int nb = engine_get_info(s->de)->n_vocab;
    if (nb != s->n_vocab || tok_n_vocab(tb) != tok_n_vocab(ta)) {
        snprintf(err, errlen, "the draft model's vocabulary has %d tokens, the model's %d: a draft model needs the "
                 "same vocabulary", nb, s->n_vocab);
        return SCHED_EINVAL;
    }
    for (int32_t t = 0; t < s->n_vocab; t++) {
        char a[256], b[256];
        const int la = tok_piece(ta, t, a, sizeof a), lb = tok_piece(tb, t, b, sizeof b);
        if (la != lb || tok_is_control(ta, t) != tok_is_control(tb, t) ||
            (la > 0 && memcmp(a, b, (size_t)(la < (int)sizeof a ? la : (int)sizeof a)) != 0)) {
            snprintf(err, errlen, "the draft model's token %d differs from the model's: a draft model needs the same "
                     "vocabulary", (int)t);
            return SCHED_EINVAL;
        }
    }
    const size_t n = (size_t)s->max_seqs;
    s->spec_drec = engine_snap_bytes(s->de) > 0;
    s->dwant = calloc(n, sizeof *s->dwant);
    s->dreq = calloc(2 * n, sizeof *s->dreq);   /* the drafting requests, then a round's */
    s->ditems = calloc(n, sizeof *s->ditems);
    s->dlogits = malloc(n * (size_t)s->n_vocab * sizeof(float));
    if (!s->dwant || !s->dreq || !s->ditems || !s->dlogits) {
        snprintf(err, errlen, "out of memory for the draft model's %zu rows of logits", n);
        return SCHED_ENOMEM;
    }
    draft_stats(s);
    return 0;
}

/* The MTP source's buffers: a round's items, logits and chained rows'
 * hidden states; each request's hidden rows come at admission. */
static int mtp_init(sched *s, char *err, size_t errlen)
{
    const engine_info *in = engine_get_info(s->e);
    if (!in->mtp_enabled) {
        snprintf(err, errlen, "--spec-type draft-mtp: %s", in->has_mtp ? "the engine was opened without its MTP block"
                 : "the model has no MTP block (nextn_predict_layers is 0): use a file with one, or another --spec-type");
        return -1;
    }
    const size_t n = (size_t)s->max_seqs;
    const int verify = 2 * s->p.spec_n_max + 2;
    s->mtp_rows = s->p.prefill_chunk > verify ? s->p.prefill_chunk : verify;
    s->mitems = calloc(n, sizeof *s->mitems);
    s->mreq = calloc(2 * n, sizeof *s->mreq);
    s->mlogits = malloc(n * (size_t)s->n_vocab * sizeof(float));
    s->mout = malloc(n * (size_t)in->n_embd * sizeof(float));
    if (!s->mitems || !s->mreq || !s->mlogits || !s->mout) {
        snprintf(err, errlen, "out of memory for the MTP drafts' %zu rows of logits", n);
        return -1;
    }
    return 0;
}

int spec_init(sched *s, char *err, size_t errlen)
{
    const size_t nv = (size_t)s->n_vocab;
    const int one = 2 * s->p.spec_n_max + 1;
    size_t rows = (size_t)s->max_seqs * (size_t)(s->p.spec_n_max + 2);
    const size_t cap = ((size_t)128 << 20) / (nv * sizeof(float));
    if (rows > cap)
        rows = cap;
    if (rows < (size_t)one)
        rows = (size_t)one;
    s->spec_rows = (int)rows;
    s->spec_logits = malloc(rows * nv * sizeof(float));
    s->spec_rec = engine_snap_bytes(s->e) > 0;
    if (!s->spec_logits) {
        snprintf(err, errlen, "out of memory for %zu rows of verify logits", rows);
        return SCHED_ENOMEM;
    }
    if (s->p.spec_type == SCHED_SPEC_MTP && mtp_init(s, err, errlen) != 0)
        return SCHED_EINVAL;
    return s->de ? draft_init(s, err, errlen) : 0;
}

int spec_attach(sched *s, sched_req *r, const sched_req_params *p, char *err, size_t errlen)
{
    sched_spec *sp = &r->spec;
    /* the first draft: the whole --spec-draft-n-max from a prediction (the
     * client says it is the output), 4 tokens from the n-gram lookup */
    *sp = (sched_spec){ .pred_pos = 0, .k = p->n_prediction > 0 ? s->p.spec_n_max : 4, .dseq = -1 };
    if (sp->k > s->p.spec_n_max)
        sp->k = s->p.spec_n_max;
    if (sp->k < s->p.spec_n_min)
        sp->k = s->p.spec_n_min;
    if (p->speculative < 0)
        return 0;
    /* "speculative": true adds the server's model source, else n-gram drafts */
    sp->dmodel = s->p.spec_type == SCHED_SPEC_DRAFT && s->de;
    sp->mtp = s->p.spec_type == SCHED_SPEC_MTP && s->mitems;
    sp->ngram = (p->speculative > 0 && !sp->dmodel && !sp->mtp) || s->p.spec_type == SCHED_SPEC_NGRAM;
    if (p->n_prediction < 0 || p->n_prediction > SCHED_MAX_PREDICTION || (p->n_prediction > 0 && !p->prediction)) {
        snprintf(err, errlen, "a prediction holds 0 to %d tokens", SCHED_MAX_PREDICTION);
        return SCHED_EINVAL;
    }
    for (int i = 0; i < p->n_prediction; i++) {
        if (p->prediction[i] < 0 || p->prediction[i] >= s->n_vocab) {
            snprintf(err, errlen, "prediction token %d is %d, outside the vocabulary (0..%d)", i,
                     (int)p->prediction[i], s->n_vocab - 1);
            return SCHED_EINVAL;
        }
    }
    if (p->n_prediction > 0) {
        sp->pred = FAULT_OR(malloc((size_t)p->n_prediction * sizeof(int32_t)));
        if (!sp->pred) {
            snprintf(err, errlen, "out of memory while queueing the request");
            return SCHED_ENOMEM;
        }
        memcpy(sp->pred, p->prediction, (size_t)p->n_prediction * sizeof(int32_t));
        sp->n_pred = p->n_prediction;
    }
    sp->on = sp->ngram || sp->dmodel || sp->mtp || sp->n_pred > 0;
    return 0;
}

void spec_admit(sched *s, sched_req *r)
{
    sched_spec *sp = &r->spec;
    if (sp->on && sp->mtp && !sp->mhid) {
        /* no room for the hidden rows: the request drafts from no MTP */
        sp->mhid = FAULT_OR(malloc((size_t)s->mtp_rows * (size_t)engine_get_info(s->e)->n_embd * sizeof(float)));
        sp->mtp = sp->mhid != NULL;
        sp->mbase = 0;
        sp->hrows = 0;
    }
    if (!r->spec.on || !s->spec_rec || r->spec.snap)
        return;
    /* no room for the snapshot: the request decodes without drafts */
    r->spec.snap = engine_snap_new(s->e);
    if (!r->spec.snap)
        r->spec.on = false;
}

void spec_release(sched *s, sched_req *r)
{
    engine_snap_free(s->e, r->spec.snap);
    r->spec.snap = NULL;
    r->spec.n_draft = 0;
    if (s->de) {
        engine_snap_free(s->de, r->spec.dsnap);
        engine_seq_free(s->de, r->spec.dseq);
    }
    r->spec.dsnap = NULL;
    r->spec.dseq = -1;
    r->spec.dwant = false;
    free(r->spec.mhid);
    r->spec.mhid = NULL;
    r->spec.mwant = false;
    r->spec.hrows = 0;
    draft_stats(s);
    mtp_stats(s);
}

/* ---- draft sources ---- */

/* What followed the latest earlier occurrence of the longest suffix of
 * t[0..n) (SPEC_NGRAM_MAX .. SPEC_NGRAM_MIN tokens): up to k tokens into
 * out. Returns the count. */
static int ngram_draft(const int32_t *t, int n, int k, int32_t *out)
{
    for (int g = SPEC_NGRAM_MAX; g >= SPEC_NGRAM_MIN; g--) {
        if (n < g + 1)
            continue;
        const int32_t *suf = t + n - g;
        for (int j = n - g - 1; j >= 0; j--) {
            if (t[j] != suf[0] || memcmp(t + j, suf, (size_t)g * sizeof *t) != 0)
                continue;
            int m = n - (j + g);
            m = m < k ? m : k;
            memcpy(out, t + j + g, (size_t)m * sizeof *t);
            return m;
        }
    }
    return 0;
}

/* The first index at or after from where the g tokens at o occur in
 * pred, else -1. */
static int pred_find(const sched_spec *sp, const int32_t *o, int g, int from)
{
    for (int j = from < 0 ? 0 : from; j + g <= sp->n_pred; j++)
        if (sp->pred[j] == o[0] && !memcmp(sp->pred + j, o, (size_t)g * sizeof *o))
            return j;
    return -1;
}

/* Follow the output through the prediction: each output token that is
 * the next prediction token advances the position; one that is not loses
 * it, and the output's longest recent suffix (SPEC_ALIGN_MAX ..
 * SPEC_NGRAM_MIN tokens) found in the prediction, first from where it was
 * lost on, then anywhere, finds it again (an edit in the middle of a
 * predicted file: the output rejoins the prediction after it). */
static void pred_align(sched *s, sched_req *r)
{
    sched_spec *sp = &r->spec;
    const int32_t *o = r->tokens + r->n_prompt;
    for (; sp->n_aligned < r->n_gen; sp->n_aligned++) {
        if (sp->pred_pos >= 0 && sp->pred_pos < sp->n_pred && sp->pred[sp->pred_pos] == o[sp->n_aligned]) {
            sp->pred_pos++;
            sp->n.pred_accepted++;
            s->spec_step.pred_accepted++;
        } else if (sp->pred_pos >= 0) {
            sp->pred_lo = sp->pred_pos;
            sp->pred_pos = -1;
        }
    }
    if (sp->pred_pos >= 0)
        return;
    for (int g = r->n_gen < SPEC_ALIGN_MAX ? r->n_gen : SPEC_ALIGN_MAX; g >= SPEC_NGRAM_MIN; g--) {
        const int32_t *suf = o + r->n_gen - g;
        int j = pred_find(sp, suf, g, sp->pred_lo - g);
        if (j < 0)
            j = pred_find(sp, suf, g, 0);
        if (j >= 0) {
            sp->pred_pos = j + g;
            return;
        }
    }
}

/* The longest prefix of d[0..n) a constrained request can emit: its
 * tokens' text must continue the output the grammar admits (checked on the
 * matcher's current state, which stays unchanged), and no draft holds an
 * end-of-generation token (the verifier emits one itself where the model
 * ends). Returns the count kept. */
static int draft_cut(sched *s, sched_req *r, const int32_t *d, int n)
{
    const tokenizer *tk = engine_tokenizer(s->e);
    char buf[SPEC_GRAMMAR_BYTES];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (tok_is_eog(tk, d[i]))
            return i;
        if (!r->gm)
            continue;
        int l = tok_piece(tk, d[i], buf + len, sizeof buf - len);
        if (l < 0 || (size_t)l > sizeof buf - len)
            return i;
        len += (size_t)l;
        if (!gram_matcher_can_accept_bytes(r->gm, buf, len))
            return i;
    }
    return n;
}

/* r's draft becomes its first n tokens that draft_cut keeps, or none when
 * fewer than --spec-draft-n-min are left (every source ends its draft so). */
static void draft_keep(sched *s, sched_req *r, int n)
{
    const int kept = draft_cut(s, r, r->spec.draft, n);
    r->spec.n_draft = kept >= s->p.spec_n_min ? kept : 0;
}

/* The cost gate (spec_cost.h): of the lengths up to k, the one whose
 * expected accepted drafts best pay for the rows they add to the step, at
 * r's acceptance rate so far and the step times measured by rows; 0 when
 * no draft pays. Every SPEC_PROBE-th proposal in a row it would decline
 * drafts k anyway, so that a rate that has risen (a passage the source
 * predicts) and a step time that has changed are measured again. */
enum { SPEC_PROBE = 16 };
static int cost_gate(sched *s, sched_spec *sp, int k)
{
    if (!s->p.spec_cost || k <= 0)
        return k;
    const double a = (sp->hits + 0.5) / (sp->trials + 1.0);
    const int n = s->cost_seqs > 0 ? s->cost_seqs : 1;
    const int best = spec_cost_best_k(&s->cost, n, n, a, k);
    if (best > 0 || ++sp->declined >= SPEC_PROBE) {
        sp->declined = 0;
        return best > 0 ? best : k;
    }
    sp->n.declined++;
    s->spec_step.declined++;
    return 0;
}

void spec_propose(sched *s, sched_req *r, int rc)
{
    sched_spec *sp = &r->spec;
    sp->n_draft = 0;
    if (sp->on && sp->n_pred > 0 && rc >= 0)
        pred_align(s, r);   /* also after the last token: it counts the prediction's tokens in the output */
    if (!sp->on || rc != 0 || (s->spec_rec && !sp->snap))
        return;
    if (sp->cool > 0) {
        sp->cool--;
        return;
    }
    /* never past max_new_tokens: the m accepted drafts and the target's
     * own token are at most what is left */
    const int left = r->max_new - r->n_gen - 1;
    int k = sp->k < left ? sp->k : left;
    if (k <= 0)
        return;
    int n = 0;
    if (sp->n_pred > 0 && sp->pred_pos >= 0 && sp->pred_pos < sp->n_pred) {
        n = sp->n_pred - sp->pred_pos < k ? sp->n_pred - sp->pred_pos : k;
        memcpy(sp->draft, sp->pred + sp->pred_pos, (size_t)n * sizeof(int32_t));
        sp->draft_pred = true;
    }
    sp->draft_dm = false;
    if (n == 0 && sp->ngram) {
        n = ngram_draft(r->tokens, r->n_prompt + r->n_gen, k, sp->draft);
        sp->draft_pred = false;
    }
    if (n > 0) {        /* the prediction's or the lookup's: the gate weighs the draft there is */
        draft_keep(s, r, cost_gate(s, sp, n));
        return;
    }
    /* a model drafts at a cost of its own: the gate decides before it runs */
    if ((sp->dmodel && s->n_dwant < s->max_seqs) || sp->mtp)
        k = cost_gate(s, sp, k);
    if (k <= 0)
        return;
    if (sp->dmodel && s->n_dwant < s->max_seqs) {
        /* the draft model's rounds run once every item of the step is
         * done, batched across requests (spec_draft_model) */
        sp->draft_pred = false;
        sp->dwant = true;
        sp->dwant_k = k;
        s->dwant[s->n_dwant++] = r;
        return;
    }
    if (sp->mtp) {
        /* the MTP drafts once its rows have caught up with this step (spec_mtp) */
        sp->draft_pred = false;
        sp->mwant = true;
        sp->mwant_k = k;
    }
}

/* ---- the verify item and what follows it ---- */

/* The one place a decoding sequence's item is shaped: its accepted tokens
 * not fed yet (c >= 1) and, when rows are left this step, its drafts
 * (written after them in r->tokens, which has room up to max_new), every
 * position's logits and the rollback snapshot after the c carried tokens.
 * (Where the engine offers a per-item flag that makes a k-token step
 * bit-identical to k one-token steps, it is set here on verify items.) */
void spec_item(sched *s, sched_req *r, engine_batch_item *it, int *rows_left, int *row_off)
{
    sched_spec *sp = &r->spec;
    const int c = r->n_prompt + r->n_gen - r->n_fed;
    int k = sp->n_draft;
    if (k > 0 && (c + k > *rows_left || (s->spec_rec && !sp->snap)))
        k = 0;      /* the step's verify rows are taken: decode plainly, draft again next step */
    it->n_tokens = c + k;
    it->snap = NULL;
    it->snap_at = 0;
    /* rows bit for bit as one-token steps compute them (engine.h): carried
     * tokens and drafts alike, so greedy output and every state after a
     * rollback are those of plain decoding; build_batch marks the step's
     * other decode items exact too (one read of the weights). A
     * speculating request's plain decode steps are exact as well: batched
     * plain decode is not batch-invariant (a batch's kernels round
     * otherwise than one sequence's), so only exact steps throughout give
     * it the output it has alone without speculation, whatever runs beside */
    it->exact = it->n_tokens > 1 || sp->on;
    sp->n_fed_draft = k;
    if (k == 0) {
        it->logits = ENGINE_LOGITS_LAST;
        return;     /* it->out: r's logits slot (build_batch) */
    }
    memcpy(r->tokens + r->n_prompt + r->n_gen, sp->draft, (size_t)k * sizeof(int32_t));
    it->logits = ENGINE_LOGITS_ALL;
    it->out = s->spec_logits + (size_t)*row_off * (size_t)s->n_vocab;
    *row_off += c + k;
    *rows_left -= c + k;
    if (s->spec_rec) {
        it->snap = sp->snap;
        it->snap_at = c;
    }
}

/* the weight of the verify steps before the last in a request's acceptance rate */
#define SPEC_DECAY 0.75

/* The adaptive draft length: doubled after a draft accepted whole, cut to
 * one more than the accepted part after a rejection, and after verify
 * steps that accepted nothing, no drafts for 1, 2, 4 .. 16 steps (text
 * the source does not predict costs little more than plain decoding). */
static void adapt(sched *s, sched_spec *sp, int k, int m)
{
    if (m == k) {
        sp->k = sp->k * 2 < s->p.spec_n_max ? sp->k * 2 : s->p.spec_n_max;
        sp->miss = 0;
        return;
    }
    sp->k = m + 1;
    if (m == 0) {
        sp->miss++;
        sp->cool = sp->miss >= 5 ? 16 : 1 << (sp->miss - 1);
    } else {
        sp->miss = 0;
    }
    if (sp->k < s->p.spec_n_min)
        sp->k = s->p.spec_n_min;
    if (sp->k < 1)
        sp->k = 1;
}

/* The draft sequence back to its accepted tokens: it holds dbase tokens
 * (all accepted) and the first dfed drafts, of which m were accepted. An
 * attention-only draft model drops the rest; a recurrent one goes back to
 * its snapshot at dbase and the accepted drafts are fed again with the
 * next draft's catch-up (the draft model's own bits need not be exact:
 * only the target's verification decides what is emitted). */
static void draft_rollback(sched *s, sched_req *r, int m)
{
    sched_spec *sp = &r->spec;
    if (sp->dseq < 0 || sp->dfed == 0)
        return;
    const int keep = sp->dbase + (m < sp->dfed ? m : sp->dfed);
    int rc = 0;
    if (keep < sp->dbase + sp->dfed)
        rc = s->spec_drec ? engine_seq_truncate(s->de, sp->dseq, sp->dbase, sp->dsnap)
                          : engine_seq_truncate(s->de, sp->dseq, keep, NULL);
    sp->dfed = 0;
    if (rc != 0) {      /* not expected: the draft model stops drafting for r, the target goes on */
        engine_seq_free(s->de, sp->dseq);
        sp->dseq = -1;
        sp->dmodel = false;
    }
}

int spec_after(sched *s, sched_req *r, engine_batch_item *it)
{
    sched_spec *sp = &r->spec;
    const int k = sp->n_fed_draft, c = it->n_tokens - k, base = r->n_fed;
    sp->n_fed_draft = 0;
    it->snap = NULL;        /* r's own, not the prefix store's */
    if (k == 0) {
        draft_rollback(s, r, 0);
        r->n_fed += c;
        return sample_emit(s, r, it->out, NULL);
    }
    const size_t nv = (size_t)s->n_vocab;
    int32_t d[SCHED_SPEC_MAX];
    memcpy(d, sp->draft, (size_t)k * sizeof *d);   /* emitting overwrites them in r->tokens */
    int m = 0, rc = 0;
    for (int i = 0; i <= k; i++) {
        int32_t tok = -1;
        rc = sample_emit(s, r, it->out + (size_t)(c - 1 + i) * nv, &tok);
        const bool hit = i < k && tok == d[i];
        m += hit;
        if (hit)
            s->spec_pos[i]++;
        if (rc != 0 || !hit)
            break;
    }
    /* what the engine holds back to the accepted tokens */
    int keep = base + c + k, trc = 0;
    if (m < k) {
        keep = s->spec_rec ? base + c : base + c + m;
        trc = engine_seq_truncate(s->e, r->seq, keep, s->spec_rec ? sp->snap : NULL);
    }
    r->n_fed = engine_seq_len(s->e, r->seq);
    draft_rollback(s, r, sp->draft_dm ? m : 0);
    sp->n.drafts++;
    sp->n.drafted += (uint64_t)k;
    sp->n.accepted += (uint64_t)m;
    sp->n.rollbacks += m < k;
    if (sp->draft_pred)
        sp->n.pred_rejected += (uint64_t)(k - m);
    s->spec_step.drafts++;
    s->spec_step.drafted += (uint64_t)k;
    s->spec_step.accepted += (uint64_t)m;
    s->spec_step.rollbacks += m < k;
    s->spec_step.pred_rejected += sp->draft_pred ? (uint64_t)(k - m) : 0;
    adapt(s, sp, k, m);
    /* the gate's acceptance rate: m accepted positions, and the rejected one
     * (positions after it were not tried), decayed so the rate follows the text */
    sp->hits = SPEC_DECAY * sp->hits + (double)m;
    sp->trials = SPEC_DECAY * sp->trials + (double)(m + (m < k));
    if (trc != 0 || r->n_fed != keep) {
        if (rc == 1)
            sched_event_clear(&r->final_ev);
        return SCHED_EENGINE;
    }
    return rc;
}

void spec_publish(sched *s)
{
    sched_spec_counts *t = &s->st.spec, *d = &s->spec_step;
    t->drafts += d->drafts;
    t->drafted += d->drafted;
    t->accepted += d->accepted;
    t->pred_accepted += d->pred_accepted;
    t->pred_rejected += d->pred_rejected;
    t->rollbacks += d->rollbacks;
    t->declined += d->declined;
    *d = (sched_spec_counts){0};
    for (int r = 1; r <= s->p.spec_n_max + 1; r++) {
        const double sec = spec_cost_seconds(&s->cost, r);
        s->st.spec_step_seconds[r] = sec > 0.0 ? sec : 0.0;
    }
    for (int i = 0; i < SCHED_SPEC_MAX; i++) {
        s->st.spec_accepted_per_pos[i] += s->spec_pos[i];
        s->spec_pos[i] = 0;
    }
    draft_stats(s);
    mtp_stats(s);
}

/* ---- the draft model (--spec-type draft-simple) ---- */

/* r's draft sequence, made and reserved for the request's whole length at
 * its first draft; false (r drafts no more from the model) when the draft
 * engine has no room. */
static bool draft_seq_ready(sched *s, sched_req *r)
{
    sched_spec *sp = &r->spec;
    if (sp->dseq >= 0)
        return true;
    sp->dseq = engine_seq_new(s->de);
    if (sp->dseq >= 0 && engine_seq_reserve(s->de, sp->dseq, r->n_prompt + r->max_new) == 0 &&
        (!s->spec_drec || (sp->dsnap = engine_snap_new(s->de)) != NULL))
        return true;
    engine_seq_free(s->de, sp->dseq);
    sp->dseq = -1;
    sp->dmodel = false;
    return false;
}

/* One round: the items of s->ditems[0..n) (of reqs[0..n)) in one engine_forward of the
 * draft engine; on failure the round's requests stop drafting from it. */
static bool draft_round(sched *s, sched_req **reqs, int n)
{
    char err[256];
    if (n == 0)
        return true;
    if (engine_forward(s->de, s->ditems, n, err, sizeof err) == 0)
        return true;
    for (int i = 0; i < n; i++) {
        sched_spec *sp = &reqs[i]->spec;
        engine_snap_free(s->de, sp->dsnap);
        engine_seq_free(s->de, sp->dseq);
        sp->dsnap = NULL;
        sp->dseq = -1;
        sp->dmodel = false;
        sp->dwant = false;
    }
    return false;
}

/* The draft model drafts for every request queued this step: round 0
 * feeds each draft sequence the accepted tokens it has not seen (the
 * prompt at the first draft, at most prefill_chunk tokens a step; a
 * request still behind drafts next step) and gives the first draft token;
 * round j feeds draft j and gives draft j + 1, one engine_forward of the
 * draft engine per position for all requests. Greedy (argmax) drafts:
 * they are only guesses, the target's verification keeps its
 * distribution. */
void spec_draft_model(sched *s)
{
    const size_t nv = (size_t)s->n_vocab;
    const tokenizer *tk = engine_tokenizer(s->e);
    int n = 0;
    for (int i = 0; i < s->n_dwant; i++) {
        sched_req *r = s->dwant[i];
        sched_spec *sp = &r->spec;
        sp->dwant = false;
        if (!sp->dmodel || !draft_seq_ready(s, r))
            continue;
        const int L = r->n_prompt + r->n_gen, have = engine_seq_len(s->de, sp->dseq);
        int feed = L - have;
        if (feed <= 0)
            continue;       /* not expected: nothing to feed, no logits */
        const bool last = feed <= s->p.prefill_chunk;
        if (!last)
            feed = s->p.prefill_chunk;
        s->ditems[n] = (engine_batch_item){ .seq = sp->dseq, .tokens = r->tokens + have, .n_tokens = feed,
                                            .logits = last ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE,
                                            .out = s->dlogits + (size_t)n * nv };
        s->dreq[n++] = r;
    }
    s->n_dwant = 0;
    if (!draft_round(s, s->dreq, n))
        return;
    /* the requests that draft: their first token, and the rollback point */
    int nd = 0;
    for (int i = 0; i < n; i++) {
        sched_req *r = s->dreq[i];
        sched_spec *sp = &r->spec;
        if (s->ditems[i].logits == ENGINE_LOGITS_NONE)
            continue;
        sp->dbase = engine_seq_len(s->de, sp->dseq);
        sp->dfed = 0;
        if (s->spec_drec && engine_snap_save(s->de, sp->dseq, sp->dsnap) != 0)
            continue;
        sp->draft[0] = sampler_argmax(s->dlogits + (size_t)i * nv, s->n_vocab);
        sp->n_draft = 1;
        sp->draft_dm = true;
        s->dreq[nd] = r;
        memmove(s->dlogits + (size_t)nd * nv, s->dlogits + (size_t)i * nv, nv * sizeof(float));
        nd++;
    }
    for (;;) {
        int m = 0;
        for (int i = 0; i < nd; i++) {
            sched_spec *sp = &s->dreq[i]->spec;
            if (!sp->dmodel || sp->n_draft >= sp->dwant_k || tok_is_eog(tk, sp->draft[sp->n_draft - 1]))
                continue;
            s->ditems[m] = (engine_batch_item){ .seq = sp->dseq, .tokens = sp->draft + sp->n_draft - 1,
                                                .n_tokens = 1, .logits = ENGINE_LOGITS_LAST,
                                                .out = s->dlogits + (size_t)m * nv };
            s->dreq[nd + m] = s->dreq[i];   /* [nd .. nd + m): this round's, in item order */
            m++;
        }
        if (m == 0)
            break;
        sched_req **round = s->dreq + nd;
        const bool ok = draft_round(s, round, m);
        for (int i = 0; i < m && ok; i++) {
            sched_spec *sp = &round[i]->spec;
            sp->dfed++;
            sp->draft[sp->n_draft++] = sampler_argmax(s->dlogits + (size_t)i * nv, s->n_vocab);
        }
    }
    for (int i = 0; i < nd; i++) {
        sched_req *r = s->dreq[i];
        sched_spec *sp = &r->spec;
        if (!sp->dmodel) {
            sp->n_draft = 0;
            continue;
        }
        draft_keep(s, r, sp->n_draft);
    }
}

/* ---- the MTP block (--spec-type draft-mtp) ---- */

/* r drafts from the MTP no more (its rows released); the trunk goes on. */
static void mtp_stop(sched *s, sched_req *r)
{
    engine_mtp_truncate(s->e, r->seq, 0);
    r->spec.mtp = false;
    r->spec.mwant = false;
}

/* The MTP rows of this step's items, then the drafts. MTP row j takes the
 * trunk's hidden row h_j and token t_{j+1} (docs/models.md 1.7): of an
 * item's rows [hpos0, hpos0 + hrows) those are the accepted ones with a
 * known next token, j < tokens known - 1 (a verify step's rejected drafts
 * are past that; its accepted drafts are in, even where a recurrent
 * rollback feeds them again next step: their rows were exact). When the
 * MTP's rows do not reach this step's (a prefix-cache hit or a fork left
 * the trunk rows before it uncomputed here), the MTP begins again at this
 * step's rows: its positions are its own, and RoPE sees only differences.
 * A request that asked (spec_propose: mwant) and whose MTP now holds every
 * row up to the last sampled token's gets draft 1 from the last row's
 * logits, then drafts 2.. from chained rows (h := the previous row's
 * normed output o, the token just drafted), one engine_mtp_step per
 * position for all requests at once; the chained rows go back after.
 * Greedy (argmax) drafts, as the draft model's. */
void spec_mtp(sched *s, int n_items)
{
    if (!s->mitems)
        return;
    const size_t nv = (size_t)s->n_vocab, E = (size_t)engine_get_info(s->e)->n_embd;
    const tokenizer *tk = engine_tokenizer(s->e);
    char err[256];
    int n = 0;
    for (int i = 0; i < n_items; i++) {
        sched_req *r = s->item_req[i];
        sched_spec *sp = &r->spec;
        const int hpos0 = sp->hpos0, hrows = sp->hrows;
        sp->hrows = 0;
        if (!sp->mtp || s->rcs[i] != 0 || hrows <= 0 || r->seq < 0)
            continue;
        const int known = r->n_prompt + r->n_gen, have = engine_mtp_len(s->e, r->seq);
        if (have < 0) {
            sp->mtp = false;
            continue;
        }
        int j0 = sp->mbase + have;
        if (j0 < hpos0 || j0 > hpos0 + hrows || have == 0) {
            /* (re)starting: room for the request's whole length in the MTP pool, taken now as
             * the draft model's sequence is (no room: r drafts from its other sources only);
             * a rollback past whole pages releases them as the trunk's does, and
             * engine_mtp_step takes them again */
            engine_mtp_truncate(s->e, r->seq, 0);
            sp->mbase = j0 = hpos0;
            if (engine_mtp_reserve(s->e, r->seq, r->n_prompt + r->max_new - hpos0) != 0) {
                mtp_stop(s, r);
                continue;
            }
        }
        const int j1 = hpos0 + hrows < known - 1 ? hpos0 + hrows : known - 1;
        if (j1 <= j0)
            continue;
        const bool want = sp->mwant && j1 == known - 1;
        s->mitems[n] = (engine_mtp_item){ .seq = r->seq, .hidden = sp->mhid + (size_t)(j0 - hpos0) * E,
                                          .tokens = r->tokens + j0 + 1, .n = j1 - j0,
                                          .logits = want ? s->mlogits + (size_t)n * nv : NULL,
                                          .out_hidden = want ? s->mout + (size_t)n * E : NULL };
        sp->mkeep = j1 - sp->mbase;
        s->mreq[n++] = r;
    }
    if (n > 0 && engine_mtp_step(s->e, s->mitems, n, false, err, sizeof err) != 0)
        for (int i = 0; i < n; i++)
            mtp_stop(s, s->mreq[i]);
    /* the requests that draft: draft 1 from the last row */
    int nd = 0;
    for (int i = 0; i < n; i++) {
        sched_req *r = s->mreq[i];
        sched_spec *sp = &r->spec;
        if (!sp->mtp || !s->mitems[i].logits)
            continue;
        sp->draft[0] = sampler_argmax(s->mitems[i].logits, s->n_vocab);
        sp->n_draft = 1;
        sp->draft_dm = false;
        memmove(s->mout + (size_t)nd * E, s->mitems[i].out_hidden, E * sizeof(float));
        s->mreq[nd++] = r;
    }
    for (;;) {
        int m = 0;
        for (int i = 0; i < nd; i++) {
            sched_spec *sp = &s->mreq[i]->spec;
            if (!sp->mtp || sp->n_draft >= sp->mwant_k || tok_is_eog(tk, sp->draft[sp->n_draft - 1]))
                continue;
            float *h = s->mout + (size_t)i * E;     /* read before it is written: in place */
            s->mitems[m] = (engine_mtp_item){ .seq = s->mreq[i]->seq, .hidden = h,
                                              .tokens = sp->draft + sp->n_draft - 1, .n = 1,
                                              .logits = s->mlogits + (size_t)m * nv, .out_hidden = h };
            s->mreq[nd + m] = s->mreq[i];
            m++;
        }
        if (m == 0)
            break;
        if (engine_mtp_step(s->e, s->mitems, m, false, err, sizeof err) != 0) {
            for (int i = 0; i < m; i++)
                mtp_stop(s, s->mreq[nd + i]);
            break;
        }
        for (int i = 0; i < m; i++) {
            sched_spec *sp = &s->mreq[nd + i]->spec;
            sp->draft[sp->n_draft++] = sampler_argmax(s->mlogits + (size_t)i * nv, s->n_vocab);
        }
    }
    for (int i = 0; i < nd; i++) {
        sched_req *r = s->mreq[i];
        sched_spec *sp = &r->spec;
        if (!sp->mtp) {
            sp->n_draft = 0;
            continue;
        }
        engine_mtp_truncate(s->e, r->seq, sp->mkeep);    /* the chained rows were guesses' */
        draft_keep(s, r, sp->n_draft);
    }
    for (int i = 0; i < s->n_running; i++)
        s->running[i]->spec.mwant = false;      /* asked but not caught up (a fork's first step): next step */
}
