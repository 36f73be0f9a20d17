/* kvevents.h - the prefix store's blocks published as vLLM's KV events.
 *
 * Owns: the ZMQ PUB socket of --kv-events (and the ROUTER socket of
 * --kv-events-replay, with the last messages sent) and the thread that alone uses
 * them; the bounded queue between the prefix store's sink (scheduler thread)
 * and that thread; the chained block hashes and which blocks the store
 * holds (a count per hash), so BlockStored and BlockRemoved describe
 * blocks, not entries; the counters behind /metrics and /stats.
 * Does not own: the store (runtime/prefix.c), when entries come and go.
 * The wire format is vLLM's (vllm/distributed/kv_events.py): three frames
 * (topic, 8-byte big-endian sequence number, msgpack payload); the payload
 * is the msgspec array_like form of KVEventBatch, [ts, [events], dp_rank],
 * each event an array whose first item is its tag ("BlockStored", ...).
 * ref: docs/serving.md 16.1 (KV events).
 */
#ifndef HYSERVE_KVEVENTS_H
#define HYSERVE_KVEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvev kvev;

typedef struct kvev_params {
    const char *endpoint;       /* tcp://(star):5557 binds (a '*', "::", ipc:// or inproc://), anything else connects */
    const char *topic;          /* the first frame of every message */
    int block_tokens;           /* tokens per block: the KV page size */
    const char *kind;           /* kv_cache_spec_kind of group 0: "full_attention" or "mla_attention" */
    int max_queue;              /* events waiting at most (<= 0: 4096); more are dropped and counted */
    const char *replay_endpoint; /* a ROUTER socket bound here answers replay requests; NULL or "": none */
    int replay_batches;         /* the last messages it keeps (<= 0: 1000; at most 64 MiB of them) */
} kvev_params;

/* Counters, read from any thread. */
typedef struct kvev_stats {
    uint64_t published;         /* events sent */
    uint64_t dropped;           /* events dropped: the queue was full, or out of memory */
    uint64_t batches;           /* messages sent: the next sequence number */
    uint64_t blocks_held;       /* distinct blocks the store holds, as the events told (group 0) */
    uint64_t state_blocks_held; /* distinct blocks at whose end it holds the recurrent state (group 1) */
    int queued;                 /* events waiting now */
} kvev_stats;

/* Opens the socket and starts the thread; NULL and err on failure. */
kvev *kvev_new(const kvev_params *p, char *err, size_t errlen);
/* Sends what is queued, stops the thread, closes. Accepts NULL. */
void kvev_free(kvev *k);
/* The prefix store's sink (prefix_sink.fn; ctx is the kvev): hashes the
 * entry's full blocks and queues BlockStored for the ones no entry held,
 * BlockRemoved for the ones no entry holds any more, AllBlocksCleared;
 * the same, as group 1 of kind "mamba", for the recurrent states kept at
 * block ends (one block an event: they are sparse).
 * Never blocks: a full queue drops. Scheduler thread only. */
void kvev_sink(void *ctx, int event, const char *salt, int owner, const int32_t *tokens, int n_tokens);
void kvev_get_stats(kvev *k, kvev_stats *st);
/* The chained hash of a block (docs/serving.md 16.1): FNV-1a 64 over the
 * parent's 8 bytes, then each token id's 4 bytes, little-endian; the first
 * block's parent is kvev_seed(salt, owner). 0 is taken as 1. */
uint64_t kvev_block_hash(uint64_t parent, const int32_t *tokens, int n);
uint64_t kvev_seed(const char *salt, int owner);

#endif
