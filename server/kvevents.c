/* kvevents.c - KV events over ZMQ (see kvevents.h).
 *
 * Two threads meet here. The scheduler thread calls kvev_sink inside the
 * prefix store's calls: it hashes the entry's full blocks, updates the
 * count of entries holding each block (the map below, its thread's
 * alone), and queues the events that change what the pod holds; it takes
 * the queue's mutex only to append a pointer, and drops when the queue is
 * full. The publisher thread takes up to MAX_BATCH events at a time,
 * encodes them outside the lock as one KVEventBatch and sends it as the
 * next sequence number. A dropped event leaves no gap in the sequence
 * numbers (they count messages, as vLLM's do); /metrics counts it.
 *
 * The events, as msgspec encodes vLLM's tagged array_like structs with
 * omit_defaults (trailing fields at their defaults left out):
 *   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 *    lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind]
 *   ["BlockRemoved", block_hashes, medium, group_idx]
 *   ["AllBlocksCleared"]
 * ref: vllm/distributed/kv_events.py (BlockStored, BlockRemoved,
 * AllBlocksCleared, KVEventBatch, ZmqEventPublisher).
 */
#include "kvevents.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "fault.h"
#include "msgpack.h"
#include "scheduler.h"    /* prefix.h's events, by the one runtime header server/ includes */

enum { MAX_BATCH = 256, DEFAULT_QUEUE = 4096, DEFAULT_REPLAY = 1000 };
/* The KV cache groups, as vLLM numbers a hybrid's: the attention pages,
 * and the recurrent states at block ends (kind "mamba", whatever the
 * recurrent layer: its spec kind is the state's, not the layer's). */
enum { GROUP_ATTENTION = 0, GROUP_STATE = 1 };
#define STATE_KIND "mamba"
#define MAX_QUEUED_BYTES ((size_t)64 << 20)     /* the queue's hashes and token ids at most */
#define MAX_KEPT_BYTES ((size_t)64 << 20)       /* the replay buffer's payloads at most */
#define MEDIUM "CPU"                            /* vLLM's MEDIUM_CPU: the cache lives in host memory */

/* One queued event, in one allocation: hashes and tokens follow it. */
typedef struct kv_item {
    int type;                   /* enum prefix_event: STORED, REMOVED or CLEARED */
    int group;                  /* group_idx: GROUP_ATTENTION or GROUP_STATE */
    bool has_parent;
    uint64_t parent;            /* parent_block_hash, when has_parent */
    int n_hashes;
    uint64_t *hashes;           /* [n_hashes] */
    int n_tokens;
    int32_t *tokens;            /* [n_tokens], BlockStored only */
    size_t bytes;               /* of the allocation */
} kv_item;

/* A message kept for the replay socket: its sequence number and payload. */
typedef struct replay_msg {
    uint64_t seq;
    uint8_t *data;              /* [len] */
    size_t len;
} replay_msg;

/* Which blocks the store holds: hash -> entries holding it, open
 * addressing with linear probing, key 0 empty (no hash is 0). Owned by the
 * scheduler thread (kvev_sink). */
typedef struct held_map {
    uint64_t *keys;             /* [cap] */
    uint32_t *counts;           /* [cap] */
    size_t cap, n;              /* cap a power of two, n < cap / 2 */
} held_map;

struct kvev {
    kvev_params p;
    char *endpoint, *topic, *kind;  /* copies of p's strings */
    void *ctx, *sock;           /* the ZMQ context and the PUB socket: the publisher thread's */
    void *replay;               /* the ROUTER socket of --kv-events-replay, NULL without; the publisher thread's */
    replay_msg *kept;           /* [p.replay_batches] the last messages sent, oldest at kept_head */
    int kept_head, n_kept;
    size_t kept_bytes;
    pthread_t thread;
    pthread_mutex_t mu;         /* guards the queue and stop */
    pthread_cond_t cv;
    kv_item **ring;             /* [max_queue] */
    int head, count;
    size_t queued_bytes;
    bool stop;
    held_map held;              /* the scheduler thread's */
    held_map held_state;        /* block hashes at whose end some entry holds the recurrent state; the same */
    uint64_t *scratch;          /* [n_scratch] block hashes of one entry, the scheduler thread's */
    int n_scratch;
    _Atomic uint64_t published, dropped, batches, blocks_held, state_blocks_held;
};

/* ---- hashes ---------------------------------------------------------- */

static uint64_t fnv_bytes(uint64_t h, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t fnv_le(uint64_t h, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return fnv_bytes(h, b, (size_t)n);
}

#define FNV_BASIS 14695981039346656037ull

uint64_t kvev_seed(const char *salt, int owner)
{
    if ((!salt || !*salt) && owner == 0)
        return FNV_BASIS;
    uint64_t h = fnv_bytes(FNV_BASIS, (const uint8_t *)salt, salt ? strlen(salt) + 1 : 1);
    return fnv_le(h, (uint32_t)owner, 4);
}

uint64_t kvev_block_hash(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = fnv_le(FNV_BASIS, parent, 8);
    for (int i = 0; i < n; i++)
        h = fnv_le(h, (uint32_t)tokens[i], 4);
    return h ? h : 1;
}

/* ---- the held map ---------------------------------------------------- */

static size_t slot_of(const held_map *m, uint64_t key)
{
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int held_grow(held_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = FAULT_OR(calloc(cap, sizeof *k));
    uint32_t *c = FAULT_OR(calloc(cap, sizeof *c));
    if (!k || !c) {
        free(k);
        free(c);
        return -1;
    }
    held_map o = *m;
    m->keys = k;
    m->counts = c;
    m->cap = cap;
    for (size_t i = 0; i < o.cap; i++)
        if (o.keys[i]) {
            const size_t j = slot_of(m, o.keys[i]);
            m->keys[j] = o.keys[i];
            m->counts[j] = o.counts[i];
        }
    free(o.keys);
    free(o.counts);
    return 0;
}

static uint32_t held_count(const held_map *m, uint64_t key)
{
    if (!m->cap)
        return 0;
    const size_t i = slot_of(m, key);
    return m->keys[i] ? m->counts[i] : 0;
}

/* count + 1; -1 out of memory */
static int held_add(held_map *m, uint64_t key)
{
    if ((m->n + 1) * 2 > m->cap && held_grow(m) != 0)
        return -1;
    const size_t i = slot_of(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->counts[i] = 0;
        m->n++;
    }
    m->counts[i]++;
    return 0;
}

/* count - 1; true when it reached 0 (the key is gone) */
static bool held_drop(held_map *m, uint64_t key)
{
    if (!m->cap)
        return false;
    size_t i = slot_of(m, key);
    if (!m->keys[i] || --m->counts[i] > 0)
        return false;
    /* backward-shift deletion keeps every probe chain unbroken */
    m->keys[i] = 0;
    m->n--;
    for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        const size_t home = (size_t)(m->keys[j] * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
        /* move j into the hole at i when its home is not in (i, j] */
        const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->counts[i] = m->counts[j];
            m->keys[j] = 0;
            i = j;
        }
    }
    return true;
}

static void held_clear(held_map *m)
{
    if (m->cap) {
        memset(m->keys, 0, m->cap * sizeof *m->keys);
        memset(m->counts, 0, m->cap * sizeof *m->counts);
    }
    m->n = 0;
}

/* ---- the queue ------------------------------------------------------- */

static kv_item *item_new(int type, int n_hashes, int n_tokens)
{
    const size_t bytes = sizeof(kv_item) + (size_t)n_hashes * sizeof(uint64_t) + (size_t)n_tokens * sizeof(int32_t);
    kv_item *it = FAULT_OR(calloc(1, bytes));
    if (!it)
        return NULL;
    it->type = type;
    it->bytes = bytes;
    it->n_hashes = n_hashes;
    it->hashes = (uint64_t *)(it + 1);
    it->n_tokens = n_tokens;
    it->tokens = (int32_t *)(it->hashes + n_hashes);
    return it;
}

/* Queue it (the queue owns it then), or drop and count it. */
static void push(kvev *k, kv_item *it)
{
    if (!it) {
        atomic_fetch_add(&k->dropped, 1);
        return;
    }
    pthread_mutex_lock(&k->mu);
    const bool fits = k->count < k->p.max_queue && k->queued_bytes + it->bytes <= MAX_QUEUED_BYTES;
    if (fits) {
        k->ring[(k->head + k->count) % k->p.max_queue] = it;
        k->count++;
        k->queued_bytes += it->bytes;
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    if (!fits) {
        free(it);
        atomic_fetch_add(&k->dropped, 1);
    }
}

/* ---- the sink (scheduler thread) ------------------------------------- */

/* The chained hashes of tokens' n_blocks full blocks into k->scratch; -1 out of memory. */
static int hash_blocks(kvev *k, const char *salt, int owner, const int32_t *tokens, int n_blocks)
{
    if (n_blocks > k->n_scratch) {
        uint64_t *s = FAULT_OR(realloc(k->scratch, (size_t)n_blocks * sizeof *s));
        if (!s)
            return -1;
        k->scratch = s;
        k->n_scratch = n_blocks;
    }
    uint64_t h = kvev_seed(salt, owner);
    const int B = k->p.block_tokens;
    for (int i = 0; i < n_blocks; i++)
        k->scratch[i] = h = kvev_block_hash(h, tokens + (size_t)i * B, B);
    return 0;
}

static void sink_stored(kvev *k, const char *salt, int owner, const int32_t *tokens, int n_tokens)
{
    const int B = k->p.block_tokens, n = n_tokens / B;
    if (n <= 0)
        return;
    if (hash_blocks(k, salt, owner, tokens, n) != 0) {
        atomic_fetch_add(&k->dropped, 1);
        return;
    }
    /* Blocks chain, so the ones some entry holds are a prefix of these:
     * the new ones are blocks first.. n-1, stored as one event whose
     * parent is the block before them. */
    int first = 0;
    while (first < n && held_count(&k->held, k->scratch[first]) > 0)
        first++;
    for (int i = 0; i < n; i++)
        if (held_add(&k->held, k->scratch[i]) != 0) {
            for (int j = 0; j < i; j++)
                held_drop(&k->held, k->scratch[j]);
            atomic_fetch_add(&k->dropped, 1);
            return;
        }
    atomic_store(&k->blocks_held, (uint64_t)k->held.n);
    if (first == n)
        return;
    kv_item *it = item_new(PREFIX_EV_STORED, n - first, (n - first) * B);
    if (it) {
        it->has_parent = first > 0;
        it->parent = first > 0 ? k->scratch[first - 1] : 0;
        memcpy(it->hashes, k->scratch + first, (size_t)(n - first) * sizeof *it->hashes);
        memcpy(it->tokens, tokens + (size_t)first * B, (size_t)(n - first) * B * sizeof *it->tokens);
    }
    push(k, it);
}

static void sink_removed(kvev *k, const char *salt, int owner, const int32_t *tokens, int n_tokens)
{
    const int n = n_tokens / k->p.block_tokens;
    if (n <= 0)
        return;
    if (hash_blocks(k, salt, owner, tokens, n) != 0) {
        atomic_fetch_add(&k->dropped, 1);
        return;
    }
    int gone = 0;                       /* the blocks no entry holds now, packed in front */
    for (int i = 0; i < n; i++)
        if (held_drop(&k->held, k->scratch[i]))
            k->scratch[gone++] = k->scratch[i];
    atomic_store(&k->blocks_held, (uint64_t)k->held.n);
    if (gone == 0)
        return;
    kv_item *it = item_new(PREFIX_EV_REMOVED, gone, 0);
    if (it)
        memcpy(it->hashes, k->scratch, (size_t)gone * sizeof *it->hashes);
    push(k, it);
}

/* A recurrent state after tokens[0..n_tokens) kept or gone. Only a state
 * at a block's end has a block hash: the scheduler aligns the snapshots it
 * takes to blocks when KV events are on (sched_params.snap_align), so
 * only an entry's own end state is left unaligned, and unpublished. */
static void sink_state(kvev *k, bool stored, const char *salt, int owner, const int32_t *tokens, int n_tokens)
{
    const int B = k->p.block_tokens, n = n_tokens / B;
    if (n <= 0 || n_tokens % B != 0)
        return;
    if (hash_blocks(k, salt, owner, tokens, n) != 0) {
        atomic_fetch_add(&k->dropped, 1);
        return;
    }
    const uint64_t h = k->scratch[n - 1];
    bool changed;
    if (stored) {
        changed = held_count(&k->held_state, h) == 0;
        if (held_add(&k->held_state, h) != 0) {
            atomic_fetch_add(&k->dropped, 1);
            return;
        }
    } else {
        changed = held_drop(&k->held_state, h);
    }
    atomic_store(&k->state_blocks_held, (uint64_t)k->held_state.n);
    if (!changed)
        return;
    kv_item *it = item_new(stored ? PREFIX_EV_STORED : PREFIX_EV_REMOVED, 1, stored ? B : 0);
    if (it) {
        it->group = GROUP_STATE;
        it->hashes[0] = h;
        it->has_parent = n > 1;
        it->parent = n > 1 ? k->scratch[n - 2] : 0;
        if (stored)
            memcpy(it->tokens, tokens + (size_t)(n - 1) * B, (size_t)B * sizeof *it->tokens);
    }
    push(k, it);
}

void kvev_sink(void *ctx, int event, const char *salt, int owner, const int32_t *tokens, int n_tokens)
{
    kvev *k = ctx;
    switch (event) {
    case PREFIX_EV_STATE_STORED:
    case PREFIX_EV_STATE_REMOVED:
        sink_state(k, event == PREFIX_EV_STATE_STORED, salt, owner, tokens, n_tokens);
        break;
    case PREFIX_EV_STORED:
        sink_stored(k, salt, owner, tokens, n_tokens);
        break;
    case PREFIX_EV_REMOVED:
        sink_removed(k, salt, owner, tokens, n_tokens);
        break;
    case PREFIX_EV_CLEARED:
        held_clear(&k->held);
        held_clear(&k->held_state);
        atomic_store(&k->blocks_held, 0);
        atomic_store(&k->state_blocks_held, 0);
        push(k, item_new(PREFIX_EV_CLEARED, 0, 0));
        break;
    default:
        break;
    }
}

/* ---- the publisher thread -------------------------------------------- */

/* block_hashes: unsigned 64-bit integers (vLLM's ExternalBlockHash is int | bytes) */
static void put_hashes(mp_buf *b, const kv_item *it)
{
    mp_array(b, (uint32_t)it->n_hashes);
    for (int i = 0; i < it->n_hashes; i++)
        mp_uint(b, it->hashes[i]);
}

static void encode_event(mp_buf *b, const kvev *k, const kv_item *it)
{
    switch (it->type) {
    case PREFIX_EV_STORED:
        mp_array(b, 11);
        mp_cstr(b, "BlockStored");
        put_hashes(b, it);
        if (it->has_parent)
            mp_uint(b, it->parent);
        else
            mp_nil(b);
        mp_array(b, (uint32_t)it->n_tokens);
        for (int i = 0; i < it->n_tokens; i++)
            mp_int(b, it->tokens[i]);
        mp_int(b, k->p.block_tokens);
        mp_nil(b);                      /* lora_id */
        mp_cstr(b, MEDIUM);
        mp_nil(b);                      /* lora_name */
        mp_nil(b);                      /* extra_keys */
        mp_int(b, it->group);           /* group_idx */
        mp_cstr(b, it->group == GROUP_STATE ? STATE_KIND : k->kind);    /* kv_cache_spec_kind */
        break;
    case PREFIX_EV_REMOVED:
        mp_array(b, 4);
        mp_cstr(b, "BlockRemoved");
        put_hashes(b, it);
        mp_cstr(b, MEDIUM);
        mp_int(b, it->group);           /* group_idx */
        break;
    default:
        mp_array(b, 1);
        mp_cstr(b, "AllBlocksCleared");
        break;
    }
}

static void put_be64(uint8_t be[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        be[i] = (uint8_t)(v >> (8 * (7 - i)));
}

/* Send one message of frames topic, seq, payload; 0 when sent. */
static int send_batch(kvev *k, uint64_t seq, const mp_buf *b)
{
    uint8_t be[8];
    put_be64(be, seq);
    if (zmq_send(k->sock, k->topic, strlen(k->topic), ZMQ_SNDMORE) < 0 ||
        zmq_send(k->sock, be, sizeof be, ZMQ_SNDMORE) < 0 || zmq_send(k->sock, b->data, b->len, 0) < 0)
        return -1;
    return 0;
}

/* Keep a sent message for the replay socket, the oldest going past the count or the bytes. */
static void keep_sent(kvev *k, uint64_t seq, const mp_buf *b)
{
    const int cap = k->p.replay_batches;
    while (k->n_kept > 0 && (k->n_kept == cap || k->kept_bytes + b->len > MAX_KEPT_BYTES)) {
        replay_msg *o = &k->kept[k->kept_head];
        k->kept_bytes -= o->len;
        free(o->data);
        o->data = NULL;
        k->kept_head = (k->kept_head + 1) % cap;
        k->n_kept--;
    }
    uint8_t *d = FAULT_OR(malloc(b->len ? b->len : 1));
    if (!d || b->len > MAX_KEPT_BYTES) {
        free(d);
        return;                         /* not replayable; the live message went out */
    }
    memcpy(d, b->data, b->len);
    k->kept[(k->kept_head + k->n_kept) % cap] = (replay_msg){ .seq = seq, .data = d, .len = b->len };
    k->n_kept++;
    k->kept_bytes += b->len;
}

/* Answer the replay requests waiting: a request is [identity, "", start_seq as 8 bytes big-endian];
 * the answer one message [identity, "", seq, payload] per kept message from start_seq on, then
 * [identity, "", -1 as 8 bytes, ""] (vLLM's ZmqEventPublisher). Other requests are ignored. */
static void serve_replay(kvev *k)
{
    for (;;) {
        uint8_t id[256], delim[8], start[16];
        const int n_id = zmq_recv(k->replay, id, sizeof id, ZMQ_DONTWAIT);
        if (n_id < 0)
            return;
        int more = 0, parts = 1, n_delim = -1, n_start = -1;
        size_t ml = sizeof more;
        zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml);
        while (more) {                  /* read the request whole, whatever its shape */
            uint8_t junk[16];
            const int n = zmq_recv(k->replay, parts == 1 ? delim : parts == 2 ? start : junk,
                                   parts == 1 ? sizeof delim : parts == 2 ? sizeof start : sizeof junk, 0);
            if (parts == 1)
                n_delim = n;
            else if (parts == 2)
                n_start = n;
            parts++;
            zmq_getsockopt(k->replay, ZMQ_RCVMORE, &more, &ml);
        }
        if (parts != 3 || n_delim != 0 || n_start != 8 || n_id > (int)sizeof id)
            continue;
        uint64_t from = 0;
        for (int i = 0; i < 8; i++)
            from = from << 8 | start[i];
        uint8_t be[8];
        for (int i = 0; i < k->n_kept; i++) {
            const replay_msg *m = &k->kept[(k->kept_head + i) % k->p.replay_batches];
            if (m->seq < from)
                continue;
            put_be64(be, m->seq);
            if (zmq_send(k->replay, id, (size_t)n_id, ZMQ_SNDMORE) < 0 || zmq_send(k->replay, "", 0, ZMQ_SNDMORE) < 0 ||
                zmq_send(k->replay, be, sizeof be, ZMQ_SNDMORE) < 0 || zmq_send(k->replay, m->data, m->len, 0) < 0)
                break;
        }
        put_be64(be, UINT64_MAX);       /* -1 as a signed 64-bit number */
        if (zmq_send(k->replay, id, (size_t)n_id, ZMQ_SNDMORE) >= 0 && zmq_send(k->replay, "", 0, ZMQ_SNDMORE) >= 0 &&
            zmq_send(k->replay, be, sizeof be, ZMQ_SNDMORE) >= 0)
            zmq_send(k->replay, "", 0, 0);
    }
}

static void *publisher_main(void *arg)
{
    kvev *k = arg;
    kv_item *batch[MAX_BATCH];
    mp_buf b;
    mp_init(&b);
    for (;;) {
        pthread_mutex_lock(&k->mu);
        while (k->count == 0 && !k->stop) {
            if (!k->replay) {
                pthread_cond_wait(&k->cv, &k->mu);
                continue;
            }
            /* with a replay socket, look at it every 20 ms while idle */
            pthread_mutex_unlock(&k->mu);
            zmq_pollitem_t pi = { .socket = k->replay, .events = ZMQ_POLLIN };
            if (zmq_poll(&pi, 1, 20) > 0)
                serve_replay(k);
            pthread_mutex_lock(&k->mu);
        }
        if (k->count == 0 && k->stop) {
            pthread_mutex_unlock(&k->mu);
            break;
        }
        int n = 0;
        while (n < MAX_BATCH && k->count > 0) {
            batch[n] = k->ring[k->head];
            k->queued_bytes -= batch[n]->bytes;
            k->head = (k->head + 1) % k->p.max_queue;
            k->count--;
            n++;
        }
        pthread_mutex_unlock(&k->mu);

        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        mp_reset(&b);
        mp_array(&b, 3);
        mp_f64(&b, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
        mp_array(&b, (uint32_t)n);
        for (int i = 0; i < n; i++)
            encode_event(&b, k, batch[i]);
        mp_nil(&b);                     /* data_parallel_rank: one engine */
        const uint64_t seq = atomic_load(&k->batches);
        if (!b.failed && send_batch(k, seq, &b) == 0) {
            if (k->replay)
                keep_sent(k, seq, &b);
            atomic_store(&k->batches, seq + 1);
            atomic_fetch_add(&k->published, (uint64_t)n);
        } else {
            atomic_fetch_add(&k->dropped, (uint64_t)n);
        }
        for (int i = 0; i < n; i++)
            free(batch[i]);
        if (k->replay)
            serve_replay(k);            /* under a steady stream too */
    }
    mp_deinit(&b);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------- */

static bool binds(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

kvev *kvev_new(const kvev_params *p, char *err, size_t errlen)
{
    kvev *k = FAULT_OR(calloc(1, sizeof *k));
    if (!k) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->p = *p;
    if (k->p.max_queue <= 0)
        k->p.max_queue = DEFAULT_QUEUE;
    k->endpoint = FAULT_OR(strdup(p->endpoint));
    k->topic = FAULT_OR(strdup(p->topic));
    k->kind = FAULT_OR(strdup(p->kind));
    k->ring = FAULT_OR(calloc((size_t)k->p.max_queue, sizeof *k->ring));
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (!k->endpoint || !k->topic || !k->kind || !k->ring || p->block_tokens <= 0) {
        snprintf(err, errlen, "out of memory");
        goto out_free;
    }
    k->p.endpoint = k->endpoint;
    k->p.topic = k->topic;
    k->p.kind = k->kind;
    k->ctx = zmq_ctx_new();
    k->sock = k->ctx ? zmq_socket(k->ctx, ZMQ_PUB) : NULL;
    if (!k->sock) {
        snprintf(err, errlen, "zmq: %s", zmq_strerror(zmq_errno()));
        goto out_free;
    }
    const int linger = 500, hwm = 100000;   /* ms to flush at close; messages a slow subscriber may lag */
    zmq_setsockopt(k->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(k->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    const int rc = binds(k->endpoint) ? zmq_bind(k->sock, k->endpoint) : zmq_connect(k->sock, k->endpoint);
    if (rc != 0) {
        snprintf(err, errlen, "--kv-events %s: cannot %s: %s", k->endpoint, binds(k->endpoint) ? "bind" : "connect",
                 zmq_strerror(zmq_errno()));
        goto out_free;
    }
    if (p->replay_endpoint && p->replay_endpoint[0]) {
        if (k->p.replay_batches <= 0)
            k->p.replay_batches = DEFAULT_REPLAY;
        k->kept = FAULT_OR(calloc((size_t)k->p.replay_batches, sizeof *k->kept));
        k->replay = k->kept ? zmq_socket(k->ctx, ZMQ_ROUTER) : NULL;
        if (!k->replay) {
            snprintf(err, errlen, "--kv-events-replay: %s", k->kept ? zmq_strerror(zmq_errno()) : "out of memory");
            goto out_free;
        }
        zmq_setsockopt(k->replay, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(k->replay, p->replay_endpoint) != 0) {
            snprintf(err, errlen, "--kv-events-replay %s: cannot bind: %s", p->replay_endpoint,
                     zmq_strerror(zmq_errno()));
            goto out_free;
        }
    }
    if (pthread_create(&k->thread, NULL, publisher_main, k) != 0) {
        snprintf(err, errlen, "cannot start the KV event thread");
        goto out_free;
    }
    return k;

out_free:
    if (k->replay)
        zmq_close(k->replay);
    free(k->kept);
    if (k->sock)
        zmq_close(k->sock);
    if (k->ctx)
        zmq_ctx_term(k->ctx);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k->ring);
    free(k->kind);
    free(k->topic);
    free(k->endpoint);
    free(k);
    return NULL;
}

void kvev_free(kvev *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);      /* it sends what was queued first */
    if (k->replay)
        zmq_close(k->replay);
    for (int i = 0; i < k->n_kept; i++)
        free(k->kept[(k->kept_head + i) % k->p.replay_batches].data);
    free(k->kept);
    zmq_close(k->sock);
    zmq_ctx_term(k->ctx);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k->ring);
    free(k->held.keys);
    free(k->held.counts);
    free(k->held_state.keys);
    free(k->held_state.counts);
    free(k->scratch);
    free(k->kind);
    free(k->topic);
    free(k->endpoint);
    free(k);
}

void kvev_get_stats(kvev *k, kvev_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!k)
        return;
    st->published = atomic_load(&k->published);
    st->dropped = atomic_load(&k->dropped);
    st->batches = atomic_load(&k->batches);
    st->blocks_held = atomic_load(&k->blocks_held);
    st->state_blocks_held = atomic_load(&k->state_blocks_held);
    pthread_mutex_lock(&k->mu);
    st->queued = k->count;
    pthread_mutex_unlock(&k->mu);
}
