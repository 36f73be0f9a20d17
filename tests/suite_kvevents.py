"""KV events as vLLM publishes them (issue 40 item 3), run by tests/suite_kvevents.sh.

An independent subscriber, written from the format's description (docs/serving.md 7.3 and
vLLM's vllm/distributed/kv_events.py), not from our C: Debian's python3-zmq SUB socket and
python3-msgpack decode every message of a server started with --kv-events, while it serves
multi-turn conversations (each turn's prompt extends the last) in a prefix store small enough
that entries are evicted, then POST /reset_prefix_cache. Checked:
  - every message is three frames: the topic kv@<host:port>@<model>, an 8-byte big-endian
    sequence number counting from 0 without gaps, a msgpack [ts, [events], dp_rank];
  - each event is a tagged array: ["BlockStored", block_hashes, parent_block_hash, token_ids,
    block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind],
    ["BlockRemoved", block_hashes, medium, group_idx], ["AllBlocksCleared"];
  - the hashes are the documented chain (FNV-1a 64 over the parent's 8 bytes and the block's
    token ids, 4 bytes each, little-endian; seed the FNV offset basis), recomputed here; the
    parent of a BlockStored is the block before its first (held), None only at the start;
  - after each turn every full block of the prompt's ids from /v1/completions/render (equal to /tokenize's) is held, with exactly those
    token ids; a block is removed only once stored, never twice; the held set stays closed
    under "parent" (an evicted prefix takes its extensions with it);
  - the recurrent states at block ends are group 1, kind "mamba": one hash an event, the chain's,
    its attention block held, their count /stats kv_events.state_blocks_held; and each is a real
    hit: a prompt of the tokens to a state block's end and one more restores exactly that far
    (x-cached-tokens);
  - a second identical request stores nothing new (equal prefixes, equal hashes);
  - AllBlocksCleared after /reset_prefix_cache, and nothing held;
  - the replay socket (--kv-events-replay, ROUTER) sends the kept messages again, byte for
    byte, from the sequence number a DEALER asks for, then the end marker (-1, empty);
  - the counts agree with the server: /stats kv_events.blocks_held is the held set's size,
    published is the events received, dropped 0, /metrics' hyserve_kv_events_*_total; the
    prefix cache's evictions happened and BlockRemoved events are at most as many.
Skipped (the suite's last line says so) when python3-zmq or python3-msgpack is missing.
The last line is "kvevents: N passed, N failed, N skipped".
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_http as hs  # noqa: E402  (Server, check helpers)

TMP = os.path.abspath(os.path.join(os.environ.get("TEST_TMPDIR", "tests/tmp"), "kvevents"))
hs.TMP = TMP
check = hs.check
MODEL = os.path.abspath("models/default.gguf")
BLOCK = 8               # --page-tokens: the block size the events must carry
FNV_BASIS = 14695981039346656037
FNV_PRIME = 1099511628211
MASK = (1 << 64) - 1
VERBOSE = bool(os.environ.get("VERBOSE"))

try:
    import msgpack
    import zmq
except ImportError as e:     # reported as skipped
    zmq = msgpack = None
    MISSING = str(e)


def fnv(h, data):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def block_hash(parent, tokens):
    """The documented chain: FNV-1a 64 over parent (8 bytes LE), then each id (4 bytes LE); 0 taken as 1."""
    h = fnv(FNV_BASIS, parent.to_bytes(8, "little"))
    for t in tokens:
        h = fnv(h, (t & 0xffffffff).to_bytes(4, "little"))
    return h or 1


class Subscriber:
    """Decodes the stream and keeps what the pod holds: {hash: (parent, token ids)}."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sock.connect(endpoint)
        self.seqs, self.topics, self.bad = [], set(), []
        self.held, self.ever_stored, self.removed_once = {}, set(), set()
        self.held_state = {}        # group 1: {hash: (parent, the block's token ids)} of states at block ends
        self.n_state_stored = self.n_state_removed = 0
        self.n_stored_events = self.n_removed_events = self.n_cleared = self.n_events = 0
        self.events = []
        self.payloads = {}

    def close(self):
        self.sock.close(0)
        self.ctx.term()

    def drain(self, until_seq, timeout=10.0):
        """Read until the message with sequence number until_seq - 1 arrived (or timeout)."""
        deadline = time.time() + timeout
        while len(self.seqs) < until_seq and time.time() < deadline:
            if not self.sock.poll(100):
                continue
            frames = self.sock.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self.bad.append(f"frames {len(frames)}, seq bytes {len(frames[1]) if len(frames) > 1 else None}")
                continue
            self.topics.add(frames[0].decode("utf-8", "replace"))
            self.seqs.append(int.from_bytes(frames[1], "big"))
            self.payloads[self.seqs[-1]] = frames[2]
            batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
            if not (isinstance(batch, list) and len(batch) in (2, 3) and isinstance(batch[0], float)
                    and isinstance(batch[1], list) and (len(batch) == 2 or batch[2] is None or
                                                        isinstance(batch[2], int))):
                self.bad.append(f"batch {batch!r:.200}")
                continue
            if abs(batch[0] - time.time()) > 60:
                self.bad.append(f"ts {batch[0]} is not the wall clock")
            for ev in batch[1]:
                self.apply(ev)

    def apply(self, ev):
        self.n_events += 1
        self.events.append(ev)
        if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
            self.bad.append(f"event {ev!r:.200}")
            return
        tag = ev[0]
        if tag == "BlockStored":
            self.n_stored_events += 1
            if len(ev) < 5:
                self.bad.append(f"short BlockStored {ev!r:.200}")
                return
            hashes, parent, tokens, bsize = ev[1], ev[2], ev[3], ev[4]
            opt = ev[5:] + [None] * (10 - len(ev[5:]))
            lora_id, medium, lora_name, extra, group, kind = opt[:6]
            if bsize != BLOCK or len(tokens) != BLOCK * len(hashes) or not hashes:
                self.bad.append(f"BlockStored sizes: block_size {bsize}, {len(tokens)} tokens, {len(hashes)} hashes")
                return
            if lora_id is not None or lora_name is not None or extra is not None or medium != "CPU" \
                    or (group, kind) not in ((0, "full_attention"), (1, "mamba")):
                self.bad.append(f"BlockStored optional fields {opt!r}")
            if group == 1:
                self.apply_state_stored(hashes, parent, tokens)
                return
            if parent is not None and parent not in self.held:
                self.bad.append(f"BlockStored parent {parent} is not held")
            prev = FNV_BASIS if parent is None else parent
            for i, h in enumerate(hashes):
                blk = tokens[i * BLOCK:(i + 1) * BLOCK]
                want = block_hash(prev, blk)
                if h != want:
                    self.bad.append(f"block hash {h} is not the chain's {want} (block {i} of {hashes})")
                if h in self.held:
                    self.bad.append(f"block {h} stored while held")
                self.held[h] = (parent if i == 0 else hashes[i - 1], blk)
                self.ever_stored.add(h)
                prev = h
        elif tag == "BlockRemoved":
            hashes = ev[1] if len(ev) > 1 else None
            group = ev[3] if len(ev) > 3 else 0
            if not hashes or (len(ev) > 2 and ev[2] != "CPU") or group not in (0, 1):
                self.bad.append(f"BlockRemoved {ev!r:.200}")
                return
            if group == 1:
                self.n_state_removed += 1
                for h in hashes:
                    if h not in self.held_state:
                        self.bad.append(f"state block {h} removed, which is not held")
                    self.held_state.pop(h, None)
                return
            self.n_removed_events += 1
            for h in hashes:
                if h not in self.held:
                    self.bad.append(f"removed {h}, which is not held (stored before: {h in self.ever_stored})")
                self.held.pop(h, None)
        elif tag == "AllBlocksCleared":
            self.n_cleared += 1
            if len(ev) != 1:
                self.bad.append(f"AllBlocksCleared {ev!r}")
            self.held.clear()
            self.held_state.clear()
        else:
            self.bad.append(f"unknown tag {tag!r}")

    def apply_state_stored(self, hashes, parent, tokens):
        """Group 1 (kind "mamba"): one block a event, the block at whose end a recurrent state is kept;
        its hash is the chain's, the same as the attention group's hash of that block."""
        self.n_state_stored += 1
        if len(hashes) != 1:
            self.bad.append(f"a state BlockStored of {len(hashes)} blocks")
            return
        h = hashes[0]
        want = block_hash(FNV_BASIS if parent is None else parent, tokens)
        if h != want:
            self.bad.append(f"state block hash {h} is not the chain's {want}")
        if h in self.held_state:
            self.bad.append(f"state block {h} stored while held")
        self.held_state[h] = (parent, tokens)

    def state_outside_pages(self):
        """State blocks whose attention block is not held (a state needs its prefix's pages)."""
        return [h for h in self.held_state if h not in self.held]

    def prefix_of(self, h):
        """The token ids from the start to the end of held block h, following parents; None when broken."""
        out = []
        while h is not None:
            if h not in self.held:
                return None
            p, blk = self.held[h]
            out[:0] = blk
            h = p
        return out

    def closed_under_parent(self):
        return [h for h, (p, _) in self.held.items() if p is not None and p not in self.held]


def kv_stats(srv):
    return srv.stats()["kv_events"]


def settle(srv, sub):
    """Wait until the publisher sent what it queued, and read it all; the server's /stats."""
    deadline = time.time() + 10
    while time.time() < deadline:
        st = srv.stats()
        k = st["kv_events"]
        if k["queued"] == 0:
            sub.drain(k["next_sequence"])
            st2 = srv.stats()
            if st2["kv_events"]["next_sequence"] == len(sub.seqs):
                return st2
        time.sleep(0.02)
    return srv.stats()


def tokenize(srv, text):
    """The ids the router's tokenizer gets from the render route (POST /v1/completions/render, as
    llm-d's precise prefix scorer calls it); they must be /tokenize's too."""
    st, _, j, _ = srv.jreq("POST", "/v1/completions/render", {"prompt": text})
    ids = j[0]["token_ids"] if st == 200 and isinstance(j, list) and j else None
    st2, _, j2, _ = srv.jreq("POST", "/tokenize", {"inputs": text})
    check("/v1/completions/render's ids are /tokenize's", st2 == 200 and ids == [t["id"] for t in j2], (st, st2))
    return ids


def complete(srv, ids, max_tokens=12):
    st, _, j, b = srv.jreq("POST", "/v1/completions", {"prompt": ids, "max_tokens": max_tokens,
                                                      "temperature": 0})
    if st != 200:
        raise RuntimeError(f"/v1/completions answered {st}: {b[:200]!r}")
    return j["choices"][0]["text"]


def metric(srv, name):
    _, _, b = srv.req("GET", "/metrics")
    m = re.search(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), b.decode(), re.M)
    return float(m.group(2)) if m else None


CONVERSATIONS = [
    ["Once upon a time there was a little girl who lived in a village near the forest.",
     " Whenever she went out, she wore a red riding cloak.", " One day her mother said to her:",
     " Take this basket to your grandmother."],
    ["The quick brown fox jumps over the lazy dog while the farmer sleeps in the barn.",
     " The dog wakes up and barks at the fox.", " The farmer opens one eye."],
    ["In the beginning the universe was created. This has made a lot of people very angry.",
     " It has been widely regarded as a bad move.", " Many were increasingly of the opinion."],
    ["Once upon a time there was a little girl who lived in a village near the sea.",
     " She liked to watch the boats.", " Every morning she counted them."],
]


def test_conversations(srv, sub):
    n_turn_checks = 0
    topic_ok = True
    for conv in CONVERSATIONS:
        text = ""
        for turn in conv:
            text += turn
            ids = tokenize(srv, text)
            out = complete(srv, ids)
            st = settle(srv, sub)
            n_full = len(ids) // BLOCK
            prev, missing = FNV_BASIS, []
            for i in range(n_full):
                blk = ids[i * BLOCK:(i + 1) * BLOCK]
                h = block_hash(prev, blk)
                if h not in sub.held or sub.held[h][1] != blk:
                    missing.append(i)
                prev = h
            n_turn_checks += 1
            check(f"after a turn ({len(ids)} prompt tokens) each of its {n_full} full blocks is held with the "
                  "prompt's ids from /v1/completions/render", not missing, f"missing blocks {missing}")
            check("the held set agrees with /stats kv_events.blocks_held and is closed under parent",
                  len(sub.held) == st["kv_events"]["blocks_held"] and not sub.closed_under_parent(),
                  (len(sub.held), st["kv_events"], sub.closed_under_parent()[:3]))
            check("the state group (1) agrees with /stats kv_events.state_blocks_held, each state block's "
                  "attention block held", len(sub.held_state) == st["kv_events"]["state_blocks_held"]
                  and not sub.state_outside_pages(), (len(sub.held_state), st["kv_events"]))
            pcs = st["pools"]["prefix_cache"]
            if VERBOSE:
                print(f"  turn: {len(ids)} tokens, store {pcs['entries']} entries {pcs['bytes']} bytes, "
                      f"{pcs['evictions']} evictions, {len(sub.held)} blocks held")
            text += out
    for t in sub.topics:
        topic_ok = topic_ok and t == f"kv@127.0.0.1:{srv.port}@default"
    check("every message's topic is kv@<host:port>@<model>", sub.topics and topic_ok, sub.topics)
    return n_turn_checks


def test_state_blocks_are_hits(srv, sub):
    """What the state group tells a router is true: for each held state block (up to 6), a prompt of
    the tokens up to that block's end and one more restores exactly that far (x-cached-tokens), so
    a router that counts attention blocks and state blocks apart can tell a full hit of a hybrid
    from an attention-only one."""
    settle(srv, sub)
    check("the conversations left recurrent states at block ends (group 1, kind mamba)",
          sub.n_state_stored > 0 and sub.held_state, (sub.n_state_stored, len(sub.held_state)))
    tried = []
    for h in list(sub.held_state)[:6]:
        if h not in sub.held_state:     # a request before evicted it
            continue
        ids = sub.prefix_of(h)
        if ids is None:
            continue
        st, hd, j, b = srv.jreq("POST", "/v1/completions", {"prompt": ids + [ids[-1]], "max_tokens": 1,
                                                            "temperature": 0})
        tried.append((len(ids), hd.get("x-cached-tokens")))
        settle(srv, sub)
    print(f"  state blocks tried: (tokens to the block end, x-cached-tokens) {tried}")
    check("a prompt through a state block's end restores exactly there (x-cached-tokens)",
          tried and all(c == str(n) for n, c in tried), tried)


def test_repeat_stores_nothing(srv, sub):
    ids = tokenize(srv, CONVERSATIONS[1][0])
    complete(srv, ids, 4)
    settle(srv, sub)
    before = sub.n_stored_events
    complete(srv, ids, 4)
    settle(srv, sub)
    check("the same request again stores no block (equal prefixes give equal hashes)",
          sub.n_stored_events == before, (before, sub.n_stored_events))


def test_counts(srv, sub):
    st = settle(srv, sub)
    k, pc = st["kv_events"], st["pools"]["prefix_cache"]
    check("sequence numbers run from 0 without a gap", sub.seqs == list(range(len(sub.seqs))) and sub.seqs,
          sub.seqs[:20])
    check("/stats kv_events: published is every event received, none dropped",
          k["published"] == sub.n_events and k["dropped"] == 0, (k, sub.n_events))
    check("/metrics: hyserve_kv_events_published_total and _dropped_total say the same",
          metric(srv, "hyserve_kv_events_published_total") == sub.n_events
          and metric(srv, "hyserve_kv_events_dropped_total") == 0)
    check("the small store evicted entries, and BlockRemoved came for them (at most one per eviction)",
          pc["evictions"] > 0 and 0 < sub.n_removed_events <= pc["evictions"],
          (pc["evictions"], sub.n_removed_events))
    check("entries are held iff blocks are", (pc["entries"] > 0) == (len(sub.held) > 0), (pc["entries"], len(sub.held)))


def test_reset(srv, sub):
    st, _, j, b = srv.jreq("POST", "/reset_prefix_cache")
    check("POST /reset_prefix_cache answered 200", st == 200, b[:200])
    settle(srv, sub)
    last = sub.events[-1] if sub.events else None
    check("AllBlocksCleared follows the reset and nothing is held",
          last == ["AllBlocksCleared"] and not sub.held and not sub.held_state and kv_stats(srv)["blocks_held"] == 0
          and kv_stats(srv)["state_blocks_held"] == 0, (last, len(sub.held)))
    # after the clear the next turn stores its blocks from the start again
    ids = tokenize(srv, CONVERSATIONS[0][0])
    complete(srv, ids, 4)
    settle(srv, sub)
    first = next((e for e in reversed(sub.events) if e[0] == "BlockStored" and e[9] == 0), None)
    check("after the clear, a prompt's blocks are stored again from the first (parent None)",
          first is not None and first[2] is None and first[3][:BLOCK] == ids[:BLOCK], first and first[:3])


def replay(endpoint, start):
    """[(seq, payload)] a DEALER gets from the replay socket for start, up to the end marker (seq -1)."""
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.connect(endpoint)
    got, end = [], False
    try:
        d.send_multipart([b"", start.to_bytes(8, "big")])
        while d.poll(3000):
            f = d.recv_multipart()
            if len(f) != 3 or f[0] != b"" or len(f[1]) != 8:
                got.append(("bad", f))
                break
            seq = int.from_bytes(f[1], "big", signed=True)
            if seq == -1:
                end = f[2] == b""
                break
            got.append((seq, f[2]))
    finally:
        d.close(0)
        ctx.term()
    return got, end


def test_replay(srv, sub):
    settle(srv, sub)
    n = len(sub.seqs)
    got, end = replay(sub.replay_endpoint, 0)
    check(f"the replay socket sends every message from sequence 0 again ({n}), byte for byte, then the end marker",
          n > 0 and end and [s for s, _ in got] == list(range(n)) and all(p == sub.payloads[s] for s, p in got),
          ([s for s, _ in got][:10], n, end))
    got, end = replay(sub.replay_endpoint, n - 2)
    check("asked from a later sequence number it sends only those from there",
          end and [s for s, _ in got] == [n - 2, n - 1], [s for s, _ in got])
    got, end = replay(sub.replay_endpoint, n + 100)
    check("asked past the last it sends only the end marker", end and got == [], got[:3])


def test_connect_and_bad_endpoint():
    """--kv-events tcp://HOST:PORT connects to a collector (as vLLM's publisher does): a plain TCP
    listener sees the server connect and greet in ZMTP 3 (the 10-byte signature, 0xFF ... 0x7F,
    from the ZMTP spec; a message check needs a SUB that binds, which this machine's libzmq 4.3.4
    does not deliver to even between two Python sockets); an endpoint ZMQ cannot use, or a replay
    socket without --kv-events, stops the server at start with a message, not later."""
    import socket
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(10)
    srv = None
    try:
        srv = hs.Server("kvevents-connect", MODEL, "--kv-events", f"tcp://127.0.0.1:{lst.getsockname()[1]}",
                        "-t", "2")
        conn, _ = lst.accept()
        conn.settimeout(5)
        sig = b""
        while len(sig) < 10:
            b = conn.recv(10 - len(sig))
            if not b:
                break
            sig += b
        conn.close()
        check("--kv-events tcp://HOST:PORT connects there and greets in ZMTP 3",
              len(sig) == 10 and sig[0] == 0xFF and sig[9] == 0x7F, sig)
    finally:
        lst.close()
        if srv:
            srv.stop()
            hs.check_server_logs([srv])
    for args, what in ((["--kv-events", "nonsense://x"], "--kv-events nonsense://x"),
                       (["--kv-events-replay", f"tcp://127.0.0.1:{hs.free_port()}"], "needs --kv-events")):
        r = hs.run([hs.HYSERVE, "serve", "--config", "/dev/null", "-m", MODEL, "--host", "127.0.0.1", "--port",
                    str(hs.free_port())] + args)
        out = (r.stdout + r.stderr).decode("utf-8", "replace")
        check(f"{' '.join(args)}: the server exits non-zero at start, saying {what!r}",
              r.returncode != 0 and what in out, (r.returncode, out[-300:]))


def main():
    os.makedirs(TMP, exist_ok=True)
    names = ["test_conversations", "test_state_blocks_are_hits", "test_repeat_stores_nothing", "test_counts", "test_reset", "test_replay",
             "test_connect_and_bad_endpoint"]
    chosen = hs.select(sys.argv[1:], names, "kvevents")
    if zmq is None:
        print(f"skip - kvevents: python3-zmq or python3-msgpack is missing ({MISSING})")
        print("kvevents: 0 passed, 0 failed, 1 skipped")
        return 0
    zport, rport = hs.free_port(), hs.free_port()
    srv = sub = None
    try:
        # a store of a few entries: the conversations evict one another
        srv = hs.Server("kvevents", MODEL, "--kv-events", f"tcp://*:{zport}", "--page-tokens", str(BLOCK),
                        "--kv-events-replay", f"tcp://127.0.0.1:{rport}",
                        "--prefix-cache", "on", "--prefix-cache-mem", "2000K", "-t", "2")
        sub = Subscriber(f"tcp://127.0.0.1:{zport}")
        sub.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        time.sleep(0.5)     # the subscription reaches the publisher before the first event
        for n in names:
            if n not in chosen or n == "test_connect_and_bad_endpoint":
                continue
            try:
                globals()[n](srv, sub)
            except Exception as e:   # noqa: BLE001 - a crash in a test is a failure, keep going
                check(f"{n} ran without an exception", False, repr(e))
        check("every message and event decoded as the format says", not sub.bad, "\n".join(sub.bad[:8]))
    except Exception as e:   # noqa: BLE001
        check("the kvevents server started", False, repr(e))
    finally:
        if sub:
            sub.close()
        if srv:
            srv.stop()
            hs.check_server_logs([srv])
    if "test_connect_and_bad_endpoint" in chosen:
        try:
            test_connect_and_bad_endpoint()
        except Exception as e:   # noqa: BLE001
            check("test_connect_and_bad_endpoint ran without an exception", False, repr(e))
    print(f"kvevents: {hs.passed} passed, {hs.failed} failed, 0 skipped")
    return 1 if hs.failed else 0


if __name__ == "__main__":
    sys.exit(main())
