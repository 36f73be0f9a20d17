#!/usr/bin/env python3
"""soak.py - many streaming clients against one server for a set time.

Starts `hyserve serve` on a synthesized model (or uses --url), then runs N
client threads until the time is up. Each request is one of: a stream read
to its end (prompt 1..1500 tokens), a stream the client drops mid-prefill, one
it drops mid-decode, a slow reader (sleeps between reads), garbage bytes, a
non-streamed /v1/completions, or a slow-reader stream: a long stream (1500
tokens with details) on a small receive window that its client stops reading
for 3-15 s ("stalled") or reads a few bytes every half second ("trickle"),
then reads to the end. The server must cut those at --max-stream-buffer (64K
here): they end with the "cancelled" error event naming the unread bytes, or
with their final event when the client came back before the limit. They are
counted apart (slow_* kinds), and so are the ordinary streams that finished
while some slow reader was stalled: slow readers must not stall the others.
It reports requests served, errors by kind, TTFT and inter-token
percentiles, resident memory over time (the server's VmRSS), and the cache
pools once the load stops: first with the prefix store's entries, then
after POST /reset_prefix_cache, when they must be back at their idle figure
exactly.

"Lost" is a request that was neither dropped by its client nor ended with its
final event or a documented error status (4xx, 429/503 with Retry-After): a
stream that stopped without a final event or an error event, a reset, a 5xx.
Exit status 1 when anything was lost, a 5xx was seen, the pools did not
return to idle (or, after the reset, to their idle bytes exactly), or slow readers were stalled while no other stream finished; --rss-tolerance also checks the last RSS against the one
after warm-up (the first tenth of the run).
usage: soak.py --hyserve build/hyserve --seconds 30 --clients 8 [--rss-tolerance 0.05]
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time


def held_idle(st, idle):
    """Nothing runs, waits or holds cache: the pools hold what they held at
    the start plus, with the prefix cache on, only the store's entries (which
    count pages shared between entries in each, so they may exceed what the
    pool holds for them)."""
    store = st["pools"].get("prefix_cache", {}).get("bytes", 0)
    return (st["scheduler"]["running"] == 0 and st["scheduler"]["waiting"] == 0 and not st.get("requests")
            and st["totals"]["all_requests_bytes"] == 0 and st["pools"]["reserved_bytes"] <= idle + store)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


class Soak:
    def __init__(self, port, seconds, clients, seed):
        self.port, self.seconds, self.clients = port, seconds, clients
        self.mu = threading.Lock()
        self.kinds = {}
        self.ttft, self.itl = [], []
        self.served = 0
        self.lost = []
        self.rng = random.Random(seed)
        self.stalled = 0                # slow readers not reading right now
        self.served_during_stall = 0    # ordinary streams finished meanwhile

    def book(self, kind, detail=None):
        with self.mu:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            if kind.startswith("lost") or kind.startswith("5"):
                self.lost.append(f"{kind}: {detail}")

    def stream(self, rng, mode):
        n_prompt = rng.randint(1, 1500)
        body = json.dumps({"inputs": "".join(rng.choice("abcdefgh ") for _ in range(n_prompt)),
                           "parameters": {"max_new_tokens": rng.randint(1, 64)}}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        try:
            s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            if mode == "drop_prefill":
                time.sleep(rng.random() * 0.05)
                self.book("dropped_prefill")
                return
            f = s.makefile("rb")
            status = f.readline().split()
            if len(status) < 2:
                self.book("lost_no_status")
                return
            code = int(status[1])
            while f.readline() not in (b"\r\n", b""):
                pass
            if code != 200:
                self.book(str(code), "stream")
                return
            t0, last, n_tok = time.time(), None, 0
            while True:
                line = f.readline()
                if not line:
                    self.book("lost_stream_cut", f"after {n_tok} tokens")
                    return
                if not line.startswith(b"data:"):
                    continue
                ev = json.loads(line[5:])
                now = time.time()
                if "error" in ev:
                    self.book("error_event_" + str(ev.get("error_type")))
                    return
                n_tok += 1
                with self.mu:
                    if last is None:
                        self.ttft.append(now - t0)
                    else:
                        self.itl.append(now - last)
                last = now
                if ev.get("generated_text") is not None:
                    with self.mu:
                        self.served += 1
                        self.served_during_stall += self.stalled > 0
                    self.book("ok_stream")
                    return
                if mode == "drop_decode" and n_tok >= 2:
                    self.book("dropped_decode")
                    return
                if mode == "slow":
                    time.sleep(0.05)
        finally:
            s.close()

    def slow_reader(self, rng, mode):
        """A long stream on a 2 KiB receive window, read by a client that
        stops ("stalled") or trickles ("trickle"); see the module text."""
        body = json.dumps({"inputs": "slow " * rng.randint(1, 20),
                           "parameters": {"max_new_tokens": 1500, "details": True}}).encode()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        s.settimeout(120)
        stalled = False
        try:
            s.connect(("127.0.0.1", self.port))
            s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            with self.mu:
                self.stalled += 1
            stalled = True
            got = b""
            if mode == "stalled":
                time.sleep(rng.uniform(3, 15))
            else:
                for _ in range(rng.randint(6, 30)):
                    got += s.recv(64)
                    time.sleep(0.5)
            with self.mu:
                self.stalled -= 1
            stalled = False
            lines = socket_lines(s, got)
            status = next(lines, b"").split()
            code = int(status[1]) if len(status) >= 2 and status[1].isdigit() else 0
            if code != 200:
                self.book(str(code) if code else f"lost_slow_{mode}", f"slow_{mode}: {status}")
                return
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                ev = json.loads(line[5:])
                if "error" in ev:
                    unread = ev.get("error_type") == "cancelled" and "unread" in str(ev.get("error"))
                    self.book(f"slow_{mode}_cut" if unread else f"error_event_{ev.get('error_type')}")
                    return
                if ev.get("generated_text") is not None:
                    with self.mu:
                        self.served += 1
                    self.book(f"slow_{mode}_done")
                    return
            self.book(f"lost_slow_{mode}", "stream cut without a final or error event")
        finally:
            if stalled:
                with self.mu:
                    self.stalled -= 1
            s.close()

    def garbage(self, rng):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2000))) + b"\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            data = s.recv(64)
            code = data.split()[1].decode() if data.startswith(b"HTTP/") else "closed"
            self.book("garbage_" + (code if not code.startswith("5") else "5xx"))
            if code.startswith("5"):
                self.lost.append(f"garbage got {code}")
        except OSError:
            self.book("garbage_closed")
        finally:
            s.close()

    def completion(self, rng):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            c.request("POST", "/v1/completions", body=json.dumps({"prompt": "soak " * rng.randint(1, 300),
                                                                  "max_tokens": rng.randint(1, 16)}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            b = r.read()
            if r.status == 200 and json.loads(b)["choices"]:
                with self.mu:
                    self.served += 1
                self.book("ok_completion")
            elif r.status in (429, 503) and r.getheader("Retry-After"):
                self.book(f"{r.status}_retry_after")
            else:
                self.book(str(r.status), b[:200])
        except (OSError, http.client.HTTPException) as e:
            self.book("lost_completion", repr(e))
        finally:
            c.close()

    def client(self, i, end):
        rng = random.Random(self.rng.random() + i)
        modes = ["full"] * 5 + ["drop_prefill", "drop_decode", "slow", "garbage", "completion", "completion",
                                "slow_stalled", "slow_trickle"]
        while time.time() < end:
            m = rng.choice(modes)
            try:
                if m == "garbage":
                    self.garbage(rng)
                elif m == "completion":
                    self.completion(rng)
                elif m.startswith("slow_"):
                    self.slow_reader(rng, m[5:])
                else:
                    self.stream(rng, m)
            except (OSError, ValueError) as e:
                self.book("lost_exception", repr(e))


def socket_lines(s, got=b""):
    """The lines of what s sends from now on, after the bytes got already
    read, until it closes."""
    buf = got
    while True:
        i = buf.find(b"\n")
        if i >= 0:
            yield buf[:i + 1]
            buf = buf[i + 1:]
            continue
        data = s.recv(65536)
        if not data:
            if buf:
                yield buf
            return
        buf += data


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/stats")
    return json.loads(c.getresponse().read())


def reset_prefix_cache(port):
    """POST /reset_prefix_cache: the store gives back every entry no request
    holds, so the pools can be checked against their idle figure exactly."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/reset_prefix_cache", body=b"{}", headers={"Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read() or b"{}")
    c.close()
    return r.status, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyserve", default="build/hyserve")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-tolerance", type=float, default=None)
    ap.add_argument("--max-stream-buffer", default="64K", help="the server's --max-stream-buffer")
    ap.add_argument("--tmp", default=os.environ.get("TEST_TMPDIR", "tests/tmp"))
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    model = os.path.join(a.tmp, "soak.gguf")
    subprocess.run([a.hyserve, "synth", "-o", model, "--layers", "4", "--attn-every", "2", "--embd", "64",
                    "--vocab", "300", "--seed", "3", "--ctx", "2048"], check=True, stdout=subprocess.DEVNULL)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = open(os.path.join(a.tmp, "soak-server.log"), "wb")
    srv = subprocess.Popen([a.hyserve, "serve", "-m", model, "--config", "/dev/null", "--port", str(port), "-t", "2",
                            "--max-seqs", "16", "--ctx", "2048", "--max-connections-per-client", "0",
                            "--queue-timeout", "60", "--max-stream-buffer", a.max_stream_buffer], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if "pools" in stats(port):      # not the 503 of a server still loading
                    break
            except OSError:
                pass
            time.sleep(0.1)
        idle = stats(port)["pools"]["reserved_bytes"]
        soak = Soak(port, a.seconds, a.clients, a.seed)
        end = time.time() + a.seconds
        threads = [threading.Thread(target=soak.client, args=(i, end)) for i in range(a.clients)]
        for t in threads:
            t.start()
        rss, t0 = [], time.time()
        while any(t.is_alive() for t in threads):
            rss.append((time.time() - t0, rss_kb(srv.pid)))
            time.sleep(max(0.5, a.seconds / 20))
        for t in threads:
            t.join()
        deadline, st = time.time() + 30, None
        while time.time() < deadline:
            st = stats(port)
            if held_idle(st, idle):
                break
            time.sleep(0.1)
        # then empty the prefix store: every page and slot must come back
        # (the figure the issue asks for, "pools back to zero")
        reset = reset_prefix_cache(port)
        deadline, st_reset = time.time() + 30, None
        while time.time() < deadline:
            st_reset = stats(port)
            if held_idle(st_reset, idle) and st_reset["pools"]["reserved_bytes"] == idle:
                break
            time.sleep(0.1)
        rss.append((time.time() - t0, rss_kb(srv.pid)))
    finally:
        srv.terminate()
        rc = srv.wait(60)
    warm = next((kb for t, kb in rss if t >= a.seconds / 10), rss[0][1])
    print(f"soak: {a.clients} clients, {a.seconds:.0f} s, {sum(soak.kinds.values())} requests, "
          f"{soak.served} served to their end")
    print("soak: by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.kinds.items())))
    ms = lambda x: f"{x * 1e3:.1f}"
    print(f"soak: TTFT ms p50 {ms(pct(soak.ttft, 50))} p90 {ms(pct(soak.ttft, 90))} p99 {ms(pct(soak.ttft, 99))}; "
          f"inter-token ms p50 {ms(pct(soak.itl, 50))} p90 {ms(pct(soak.itl, 90))} p99 {ms(pct(soak.itl, 99))}")
    slow = {k: v for k, v in soak.kinds.items() if k.startswith("slow_") or k.startswith("lost_slow")}
    print(f"soak: slow readers {sum(slow.values())}: cut at --max-stream-buffer {a.max_stream_buffer} "
          f"{sum(v for k, v in slow.items() if k.endswith('_cut'))}, read to their end "
          f"{sum(v for k, v in slow.items() if k.endswith('_done'))}, lost "
          f"{sum(v for k, v in slow.items() if k.startswith('lost'))}; ordinary streams finished while one "
          f"was stalled: {soak.served_during_stall}")
    print("soak: RSS MiB over time: " + " ".join(f"{t:.0f}s:{kb / 1024:.1f}" for t, kb in rss))
    print(f"soak: pools at the end: reserved {st['pools']['reserved_bytes']} (idle {idle}; prefix store "
          f"{st['pools'].get('prefix_cache', {}).get('bytes', 0)} in {st['pools'].get('prefix_cache', {}).get('entries', 0)} "
          f"entries), requests holding {st['totals']['all_requests_bytes']}, running "
          f"{st['scheduler']['running']}, waiting {st['scheduler']['waiting']}; server exit {rc}")
    print(f"soak: after POST /reset_prefix_cache (HTTP {reset[0]}, freed {reset[1].get('freed_entries')} entries, "
          f"{reset[1].get('freed_pool_bytes')} pool bytes): reserved {st_reset['pools']['reserved_bytes']} "
          f"(idle {idle}), prefix store {st_reset['pools'].get('prefix_cache', {}).get('bytes', 0)} bytes")
    bad = list(soak.lost)
    if not held_idle(st, idle):
        bad.append("pools not back to idle")
    if reset[0] != 200 or st_reset["pools"]["reserved_bytes"] != idle:
        bad.append(f"pools not back to their idle {idle} bytes after /reset_prefix_cache")
    if rc != 0:
        bad.append(f"server exited {rc}")
    if sum(v for k, v in slow.items() if k.endswith("_cut")) and soak.served_during_stall == 0:
        bad.append("slow readers were cut, but no other stream finished while one was stalled")
    if a.rss_tolerance is not None and rss[-1][1] > warm * (1 + a.rss_tolerance):
        bad.append(f"RSS {rss[-1][1]} KiB at the end, more than {a.rss_tolerance:.0%} over {warm} KiB after warm-up")
    for b in bad[:10]:
        print("soak: FAIL " + b)
    print(f"soak: {0 if bad else 1} passed, {1 if bad else 0} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
