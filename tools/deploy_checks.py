#!/usr/bin/env python3
"""deploy_checks.py - the checks of `make test-deploy`, against real containers.

tools/test-deploy.sh makes sure a Docker Engine answers, builds the images
(hyserve:latest, hyserve-nginx:latest) and then runs this script, which
starts containers and the compose stack (docker/compose.yaml: three
replicas behind nginx) on loopback ports and checks, each as one line
"ok - ..." or "not ok - ...":

  1. the image runs as a non-root user with hyserve as PID 1, its
     HEALTHCHECK (`hyserve health`) reaches healthy, it serves with
     --read-only and a tmpfs, and SIGTERM drains it to exit 0;
  2. --cpus 1 --memory 1g gives one thread and a cache budget that fits
     (read from /info);
  3. 30 requests through nginx reach all three replicas;
  4. an SSE stream through nginx arrives token by token;
  5. `docker kill` of a replica in the middle of 60 concurrent requests:
     every request still gets a 200;
  6. `docker stop` of a replica while it streams: its streams finish, new
     requests go to the other two, no client sees a 5xx;
  7. with nginx-affinity.conf one X-Session-Id always reaches the same
     replica, and different ids spread;
  8. the binary runs with HYSERVE_SIMD=avx2 and HYSERVE_SIMD=0;
  9. docker/compose.model.yaml: a replica serves a GGUF file from a host
     folder mounted read-only (a copy of the image's model under another
     name), as the model named after the file, and its greedy text equals
     `hyserve generate` on the same file;
  and the image size. Every wait polls against a deadline. Whatever it
started is removed before it returns (test-deploy.sh removes it again on
any exit). Python standard library only.

usage: deploy_checks.py --project NAME --label KEY=VALUE --state DIR --compose "docker-compose"
"""
import argparse
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "hyserve:latest"
NGINX_IMAGE = "hyserve-nginx:latest"
REPLICAS = ("hyserve-1", "hyserve-2", "hyserve-3")
SIZE_LIMIT_MB = 150

report = Report()
check = report.check


def note(msg):
    print(f"# {msg}", flush=True)


# ---------------------------------------------------------------------------
# docker and HTTP helpers
# ---------------------------------------------------------------------------

def sh(args, timeout=120, env=None):
    """Run a command; (exit code, stdout + stderr as text). A timeout is exit 124."""
    try:
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env, cwd=REPO)
        return r.returncode, r.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.output or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout} s)"


def docker(*args, timeout=120):
    return sh(["docker"] + list(args), timeout=timeout)


def inspect(container, fmt):
    rc, out = docker("inspect", "-f", fmt, container, timeout=30)
    return out.strip() if rc == 0 else None


def wait_until(fn, timeout, interval=0.2):
    """Call fn until it returns something true, or timeout seconds pass; the last value."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() >= deadline:
            return v
        time.sleep(interval)


def host_port(container, port=8080):
    """The loopback port a container's port is published on, or None."""
    rc, out = docker("port", container, f"{port}/tcp", timeout=30)
    if rc != 0:
        return None
    for line in out.splitlines():
        host, _, p = line.strip().rpartition(":")
        if host in ("127.0.0.1", "0.0.0.0") and p.isdigit():
            return int(p)
    return None


def request(port, method, path, body=None, headers=None, timeout=30):
    """(status, headers with lower-case names, body bytes); status 0 on a connection error."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, {}, repr(e).encode()
    finally:
        c.close()


def jget(port, path, timeout=10):
    st, _, b = request(port, "GET", path, timeout=timeout)
    try:
        return st, json.loads(b) if st == 200 else None
    except ValueError:
        return st, None


def generate(port, text, n, headers=None, timeout=120):
    """POST /generate greedy; (status, replica, body)."""
    st, h, b = request(port, "POST", "/generate", {"inputs": text, "parameters": {"max_new_tokens": n}},
                       headers, timeout)
    return st, h.get("x-hyserve-replica"), b


def ready(port):
    return port is not None and request(port, "GET", "/ready", timeout=3)[0] == 200


def metric(port, name):
    st, _, b = request(port, "GET", "/metrics", timeout=3)
    if st != 200:
        return None
    # every series carries a model_name label: name{model_name="..."} value
    for line in b.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(None, 1)[1])
    return None


def open_stream(port, text, n, rid, timeout=120):
    """Start POST /generate_stream; (connection, response) once the headers are in."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/generate_stream", body=json.dumps({"inputs": text, "parameters": {
        "max_new_tokens": n, "details": True}}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": rid})
    return c, c.getresponse()


def sse_data(resp, on_event=None):
    """The JSON payloads of an SSE response's data events, in order; on_event(t)
    is called at the arrival of each one."""
    out, data = [], []
    while True:
        line = resp.readline()
        if not line:
            return out
        line = line.rstrip(b"\r\n")
        if line == b"":
            if data:
                out.append(json.loads("\n".join(data)))
                if on_event:
                    on_event(time.monotonic())
                data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].decode("utf-8").strip())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# the deployment under test
# ---------------------------------------------------------------------------

class Stack:
    """docker/compose.yaml under a test project name, with the replicas also
    published on loopback (a test override) so the checks can watch them."""

    def __init__(self, compose, project, state):
        self.compose = shlex.split(compose)
        self.project = project
        self.lb_port = free_port()
        self.override = os.path.join(state, "compose.test.yaml")
        with open(self.override, "w") as f:
            f.write("# written by tools/deploy_checks.py: the replicas on loopback, for the checks to watch\n"
                    "services:\n")
            for r in REPLICAS:
                f.write(f"  {r}:\n    ports:\n      - \"127.0.0.1::8080\"\n")
        self.files = ["-f", "docker/compose.yaml", "-f", self.override]
        self.env = dict(os.environ, HYSERVE_LB_PORT=str(self.lb_port))

    def run(self, *args, extra_files=(), timeout=300):
        files = list(self.files)
        for f in extra_files:
            files += ["-f", f]
        return sh(self.compose + ["-p", self.project] + files + list(args), timeout=timeout, env=self.env)

    def cid(self, service):
        rc, out = self.run("ps", "-q", service, timeout=60)
        ids = out.split()
        return ids[-1] if rc == 0 and ids else None

    def replica_port(self, service):
        c = self.cid(service)
        return host_port(c) if c else None

    def down(self):
        return self.run("down", "-v", "--remove-orphans", "-t", "5", timeout=180)

    def all_ready(self, timeout=120):
        """Every replica answers /ready 200 on its published port."""
        return wait_until(lambda: all(ready(self.replica_port(r)) for r in REPLICAS), timeout, 0.5)

    def reload_nginx(self):
        """nginx resolves the replica names at (re)load: after a replica is
        started again, send HUP, then wait until nginx reaches all three."""
        docker("kill", "-s", "HUP", self.cid("nginx"), timeout=30)
        seen = set()

        def spread():
            st, rep, _ = generate(self.lb_port, "Warm up", 1, timeout=30)
            if st == 200 and rep:
                seen.add(rep)
            return len(seen) == len(REPLICAS)
        return wait_until(spread, 60, 0.05)


# ---------------------------------------------------------------------------
# 1, 2, 8: one container at a time
# ---------------------------------------------------------------------------

def run_container(name, label, *opts, env=()):
    args = ["run", "-d", "--name", name, "--label", label, "-p", "127.0.0.1::8080"]
    for e in env:
        args += ["-e", e]
    rc, out = docker(*(args + list(opts) + [IMAGE]), timeout=60)
    return rc == 0, out.strip()


def check_1(name):
    health = wait_until(lambda: inspect(name, "{{.State.Health.Status}}") in ("healthy", "unhealthy"), 150, 0.5)
    status = inspect(name, "{{.State.Health.Status}}")
    _, uid = docker("exec", name, "id", "-u", timeout=30)
    _, exe = docker("exec", name, "readlink", "/proc/1/exe", timeout=30)
    ro = inspect(name, "{{.HostConfig.ReadonlyRootfs}}")
    rc_root, _ = docker("exec", name, "touch", "/opt/hyserve/probe", timeout=30)
    rc_tmp, _ = docker("exec", name, "touch", "/tmp/probe", timeout=30)
    port = host_port(name)
    st, _, body = generate(port, "It was a cold night in", 8) if port else (0, None, b"")
    t0 = time.time()
    docker("stop", "-t", "30", name, timeout=60)
    took = time.time() - t0
    code = inspect(name, "{{.State.ExitCode}}")
    _, logs = docker("logs", name, timeout=30)
    uid = uid.strip()
    ok = (health and status == "healthy" and uid.isdigit() and int(uid) != 0 and exe.strip() == "/usr/local/bin/hyserve"
          and ro == "true" and rc_root != 0 and rc_tmp == 0 and st == 200 and code == "0" and took < 20
          and "SIGTERM received" in logs and "drained, exiting" in logs)
    check("1. non-root (uid %s), hyserve is PID 1, HEALTHCHECK %s, serves with --read-only + tmpfs, "
          "SIGTERM drains to exit %s in %.1f s" % (uid, status, code, took), ok,
          f"exe={exe.strip()} ro={ro} write / rc={rc_root} write /tmp rc={rc_tmp} generate={st} {body[:120]!r}")


def check_2(name):
    port = host_port(name)
    ok_ready = wait_until(lambda: ready(port), 60, 0.2)
    st, j = jget(port, "/info") if ok_ready else (0, None)
    k = (j or {}).get("container") or {}
    limit = 1 << 30
    budget = k.get("cache_budget_bytes") or 0
    used = budget + (k.get("model_file_bytes") or 0) + (k.get("headroom_bytes") or 0)
    _, logs = docker("logs", name, timeout=30)
    line = next((l for l in logs.splitlines() if "hyserve: ready:" in l), "")
    ok = (st == 200 and k.get("threads") == 1 and k.get("cpu_limit") == 1 and k.get("memory_limit_bytes") == limit
          and 0 < budget <= (k.get("cache_fit_bytes") or 0) and used <= limit and "1 threads" in line
          and "container limits" in line)
    check("2. --cpus 1 --memory 1g: %s thread(s), cache budget %.1f MiB fits beside %.1f MiB of weights in 1 GiB "
          "(cgroup v%s)" % (k.get("threads"), budget / 2**20, (k.get("model_file_bytes") or 0) / 2**20,
                            k.get("cgroup_version")), ok, f"/info container={k} ready line: {line[-240:]}")


def check_8(names):
    """names: {level: container}. Returns (ok, detail) for printing later."""
    details, ok = [], True
    for level, name in names.items():
        port = host_port(name)
        up = wait_until(lambda: ready(port), 60, 0.2)
        st, j = jget(port, "/info") if up else (0, None)
        kern = ((j or {}).get("container") or {}).get("kernels")
        gst, _, body = generate(port, "It was a cold night in", 16) if up else (0, None, b"")
        try:
            text = json.loads(body)["generated_text"] if gst == 200 else ""
        except (ValueError, KeyError):
            text = ""
        want = "avx2" if level == "avx2" else "scalar"
        good = kern == want and gst == 200 and len(text) > 0
        ok &= good
        details.append(f"HYSERVE_SIMD={level}: {kern} kernels, generate {gst}" + ("" if good else f" {body[:100]!r}"))
    return ok, "; ".join(details)


# ---------------------------------------------------------------------------
# 3-7: the stack
# ---------------------------------------------------------------------------

def check_3(stack):
    seen, statuses = {}, []
    for i in range(30):
        st, rep, _ = generate(stack.lb_port, f"Request {i}", 4)
        statuses.append(st)
        if st == 200:
            seen[rep] = seen.get(rep, 0) + 1
    check("3. 30 requests through nginx reach all three replicas (%s)" %
          ", ".join(f"{k} {v}" for k, v in sorted(seen.items(), key=lambda kv: str(kv[0]))),
          all(s == 200 for s in statuses) and set(seen) == set(REPLICAS), f"statuses {sorted(set(statuses))}")


def check_dashboard(stack):
    """The dashboard (GET /) through the load balancer: the page, its
    script and the /stats it polls all come through nginx."""
    st, h, page = request(stack.lb_port, "GET", "/")
    st_js, h_js, _ = request(stack.lb_port, "GET", "/web/app.js")
    st_stats, stats = jget(stack.lb_port, "/stats")
    check("the dashboard page, its script and the /stats it polls pass through nginx",
          st == 200 and h.get("content-type", "").startswith("text/html") and b"app.js" in page
          and st_js == 200 and "javascript" in h_js.get("content-type", "")
          and st_stats == 200 and isinstance(stats, dict) and "model" in stats,
          f"/ {st} {h.get('content-type')}, /web/app.js {st_js} {h_js.get('content-type')}, /stats {st_stats}")


def check_4(stack):
    times = []
    t_sent = time.monotonic()
    try:
        c, r = open_stream(stack.lb_port, "It was a cold night in", 1500, "deploy-sse")
        ctype, rep = r.getheader("Content-Type"), r.getheader("X-Hyserve-Replica")
        events = sse_data(r, times.append) if r.status == 200 else []
        c.close()
        status = r.status
    except (OSError, http.client.HTTPException, ValueError) as e:
        status, ctype, rep, events = 0, None, None, []
        note(f"stream failed: {e!r}")
    tokens = [e for e in events if "token" in e]
    last = events[-1] if events else {}
    n_gen = ((last.get("details") or {}).get("generated_tokens"))
    # Streamed, the events arrive over the whole generation and nearly each
    # at its own moment; through a buffering proxy they come in bursts of a
    # buffer's worth (8 KiB: some 50 events), or all at the end. So: the
    # first event well before the last, and the distinct milliseconds they
    # arrive in at least a quarter of what the events and the span allow.
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    total = times[-1] - t_sent if times else 0.0
    moments = len({int((t - t_sent) * 1000) for t in times})
    possible = min(len(times), int(span * 1000) + 1)
    ok = (status == 200 and (ctype or "").startswith("text/event-stream") and len(tokens) >= 100
          and n_gen == len(tokens) and total > 0 and span >= 0.5 * total and moments >= 0.25 * possible)
    check("4. SSE through nginx arrives token by token: %d events over %.2f s of %.2f s, at %d distinct "
          "milliseconds of %d possible (from %s)" % (len(tokens), span, total, moments, possible, rep), ok,
          f"status {status} content-type {ctype} generated_tokens {n_gen}")


def check_5(stack):
    victim = "hyserve-2"
    vport = stack.replica_port(victim)
    vid = stack.cid(victim)
    n = 60
    results = [None] * n
    go = threading.Barrier(n + 1)

    def worker(i):
        try:
            go.wait(30)
        except threading.BrokenBarrierError:
            pass
        results[i] = generate(stack.lb_port, f"Concurrent request {i}", 300, timeout=180)[:2]

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    go.wait(30)
    # kill once the victim is busy with some of them
    running = wait_until(lambda: (metric(vport, "hyserve_requests_running") or 0) >= 3, 20, 0.02)
    running = metric(vport, "hyserve_requests_running") if running else running
    t_kill = time.time()
    rc, out = docker("kill", vid, timeout=30)
    took = time.time() - t_kill
    for t in ts:
        t.join(240)
    statuses = [r[0] if r else None for r in results]
    by = {}
    for r in results:
        if r and r[0] == 200:
            by[r[1]] = by.get(r[1], 0) + 1
    ok = rc == 0 and bool(running) and all(s == 200 for s in statuses)
    check("5. docker kill of %s (%.1f s) with %s of 60 concurrent requests running on it: %d/60 got 200 "
          "(answered by %s), the last %.1f s after the kill began" %
          (victim, took, int(running or 0), statuses.count(200),
           ", ".join(f"{k} {v}" for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))),
           time.time() - t_kill), ok,
          f"kill rc={rc} {out.strip()[:100]} statuses {sorted(set(map(str, statuses)))}")
    # back to three replicas for what follows
    docker("start", vid, timeout=60)
    if not (stack.all_ready(90) and stack.reload_nginx()):
        note("could not bring the stack back to three replicas after check 5")


def check_6(stack):
    target = "hyserve-1"
    tid = stack.cid(target)
    tport = stack.replica_port(target)
    # slowed down, so that its streams are surely still running when SIGTERM comes
    docker("update", "--cpus", "0.2", tid, timeout=30)
    n_tokens = 800
    streams = []        # [conn, resp, replica, rid, events, error]
    lock = threading.Lock()

    def reader(s):
        try:
            s[4] = sse_data(s[1])
        except (OSError, http.client.HTTPException, ValueError) as e:
            s[5] = repr(e)
        finally:
            s[0].close()

    threads = []
    # least_conn gives the target about one stream in three; open more until it has two
    for i in range(12):
        rid = f"deploy-drain-{i}"
        try:
            c, r = open_stream(stack.lb_port, f"Drain test {i}", n_tokens, rid)
        except (OSError, http.client.HTTPException) as e:
            streams.append([None, None, None, rid, [], repr(e)])
            continue
        s = [c, r, r.getheader("X-Hyserve-Replica"), rid, [], None if r.status == 200 else f"status {r.status}"]
        with lock:
            streams.append(s)
        if r.status == 200:
            t = threading.Thread(target=reader, args=(s,))
            t.start()
            threads.append(t)
        if sum(1 for x in streams if x[2] == target) >= 2 and len(streams) >= 4:
            break
    on_target = [s for s in streams if s[2] == target]
    running_before = metric(tport, "hyserve_requests_running")
    stopper = subprocess.Popen(["docker", "stop", "-t", "60", tid], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    draining = wait_until(lambda: request(tport, "GET", "/ready", timeout=2)[0] == 503, 15, 0.05)
    # new work while the target drains: short requests, a few at a time, and two streams
    new = []

    def newreq(i):
        new.append(generate(stack.lb_port, f"During the drain {i}", 8, timeout=60)[:2])

    for batch in range(5):
        ws = [threading.Thread(target=newreq, args=(batch * 4 + k,)) for k in range(4)]
        for w in ws:
            w.start()
        for w in ws:
            w.join(90)
    late = []
    for i in range(2):
        try:
            c, r = open_stream(stack.lb_port, f"After the stop {i}", 16, f"deploy-late-{i}")
            evs = sse_data(r) if r.status == 200 else []
            late.append((r.status, r.getheader("X-Hyserve-Replica"), len([e for e in evs if "token" in e])))
            c.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            late.append((0, None, repr(e)))
    for t in threads:
        t.join(120)
    try:
        stopper.wait(90)
    except subprocess.TimeoutExpired:
        stopper.kill()
    code = inspect(tid, "{{.State.ExitCode}}")
    _, logs = docker("logs", tid, timeout=30)
    # the target's streams: every token, then the final event; and none of
    # them ended before the SIGTERM line in its log
    done_ok = all(s[5] is None and s[4] and (s[4][-1].get("details") or {}).get("generated_tokens") == n_tokens
                  and (s[4][-1].get("details") or {}).get("finish_reason") == "length" for s in on_target)
    lines = logs.splitlines()
    sig_at = next((i for i, l in enumerate(lines) if "SIGTERM received" in l), None)
    finished_after = sig_at is not None and all(
        any(f"id={s[3]} " in l for l in lines[sig_at:]) for s in on_target)
    others_ok = all(s[5] is None for s in streams)
    new_ok = all(st == 200 and rep != target for st, rep in new) and len(new) == 20
    late_ok = all(st == 200 and rep not in (target, None) and n == 16 for st, rep, n in late)
    statuses = sorted({str(st) for st, _ in new} | {str(s[0]) for s in late})
    ok = (len(on_target) >= 1 and draining and done_ok and finished_after and others_ok and new_ok and late_ok
          and code == "0" and "drained, exiting" in logs)
    check("6. docker stop of %s during %d of its streams (%s running): they finished (%d tokens each) while it "
          "drained; %d new requests and %d streams went to the other two, statuses %s; exit %s" %
          (target, len(on_target), running_before, n_tokens, len(new), len(late), ",".join(statuses), code), ok,
          f"draining seen {bool(draining)}, target streams complete {done_ok}, ended after SIGTERM {finished_after}, "
          f"other streams ok {others_ok}, new {new}, late {late}, errors {[s[5] for s in streams if s[5]]}")
    docker("update", "--cpus", "1", tid, timeout=30)
    docker("start", tid, timeout=60)
    if not (stack.all_ready(90) and stack.reload_nginx()):
        note("could not bring the stack back to three replicas after check 6")


def check_7(stack):
    affinity = os.path.join(REPO, "docker", "compose.affinity.yaml")
    rc, out = stack.run("up", "-d", "--no-deps", "--no-build", "nginx", extra_files=[affinity], timeout=180)
    cmd = inspect(stack.cid("nginx"), "{{json .Config.Cmd}}") or ""
    up = wait_until(lambda: request(stack.lb_port, "GET", "/nginx-health", timeout=2)[0] == 200, 60, 0.2)
    sessions = {}
    bad = []
    for round_ in range(4):
        for s in range(12):
            sid = f"session-{s:02d}"
            st, rep, _ = generate(stack.lb_port, f"Turn {round_} of {sid}", 2, headers={"X-Session-Id": sid})
            if st != 200:
                bad.append(st)
                continue
            sessions.setdefault(sid, set()).add(rep)
    sticky = len(sessions) == 12 and all(len(v) == 1 for v in sessions.values())
    spread = {next(iter(v)) for v in sessions.values() if v}
    ok = rc == 0 and "nginx-affinity.conf" in cmd and up and not bad and sticky and len(spread) >= 2
    check("7. with nginx-affinity.conf each of 12 X-Session-Id values stays on one replica over 4 turns, "
          "and they spread over %d replicas" % len(spread), ok,
          f"compose rc={rc} cmd={cmd} statuses {bad} map {dict((k, sorted(map(str, v))) for k, v in sessions.items())}"
          + ("" if rc == 0 else f" {out[-300:]}"))


def check_9(stack, state):
    """A model from a host folder (docker/compose.model.yaml), on one replica;
    the replica goes back to the image's model afterwards."""
    mdir = os.path.join(state, "models")
    os.makedirs(mdir, exist_ok=True)
    os.chmod(mdir, 0o777)   # the image's user (not root) writes the file
    fname = "story-copy.gguf"
    rc_s, out_s = docker("run", "--rm", "-v", f"{mdir}:/out", "--entrypoint", "cp", IMAGE,
                         "/opt/hyserve/models/default.gguf", f"/out/{fname}", timeout=120)
    prompt, n = "It was a cold night in", 24
    try:
        r = subprocess.run(["docker", "run", "--rm", "-v", f"{mdir}:/models:ro", IMAGE, "generate", "-m",
                            f"/models/{fname}", "-p", prompt, "-n", str(n), "--temp", "0", "--ignore-eos", "-t", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120)
        rc_g, cli_text = r.returncode, r.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        rc_g, cli_text = 124, ""
    model_file = os.path.join(REPO, "docker", "compose.model.yaml")
    stack.env.update(MODEL_DIR=mdir, MODEL_FILE=fname, MODEL_MEM_LIMIT="1g")
    rc, out = stack.run("up", "-d", "--no-deps", "--no-build", "hyserve-1", extra_files=[model_file], timeout=180)
    port = stack.replica_port("hyserve-1") if rc == 0 else None
    up = bool(port) and wait_until(lambda: ready(port), 90, 0.3)
    st_m, models = jget(port, "/v1/models") if up else (0, None)
    ids = [m.get("id") for m in (models or {}).get("data", [])]
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    st_c, _, raw = request(port, "POST", "/v1/completions", body) if up else (0, None, b"")
    try:
        text = json.loads(raw)["choices"][0]["text"] if st_c == 200 else None
    except (ValueError, KeyError, IndexError):
        text = None
    _, mounts = docker("inspect", "-f", "{{json .Mounts}}", stack.cid("hyserve-1") or "-", timeout=30)
    ro = '"RW":false' in mounts.replace(" ", "")
    ok = (rc_s == 0 and rc_g == 0 and rc == 0 and up and ids == [fname[:-5]] and text is not None
          and text == cli_text and ro)
    check("9. compose.model.yaml: a replica serves %s from a read-only host folder as model %s, its greedy "
          "completion equal to `hyserve generate` on the file (%d chars)" % (fname, ids, len(text or "")), ok,
          f"synth rc={rc_s} {out_s[-200:]!r} generate rc={rc_g} compose rc={rc} {out[-300:]!r} up={up} "
          f"mounts read-only={ro} server={text!r} cli={cli_text!r}")
    for k in ("MODEL_DIR", "MODEL_FILE", "MODEL_MEM_LIMIT"):
        stack.env.pop(k, None)
    stack.run("up", "-d", "--no-deps", "--no-build", "--force-recreate", "hyserve-1", timeout=180)
    if not (stack.all_ready(90) and stack.reload_nginx()):
        note("could not bring hyserve-1 back to the image's model after check 9")


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--compose", required=True)
    a = ap.parse_args()

    p = a.project
    single = {"c1": f"{p}-readonly", "c2": f"{p}-limits", "avx2": f"{p}-simd-avx2", "0": f"{p}-simd-0"}
    stack = Stack(a.compose, p, a.state)
    try:
        # the single containers start together; their checks run one by one
        started = {
            "c1": run_container(single["c1"], a.label, "--read-only", "--tmpfs", "/tmp:rw,size=16m"),
            "c2": run_container(single["c2"], a.label, "--cpus", "1", "--memory", "1g"),
            "avx2": run_container(single["avx2"], a.label, env=["HYSERVE_SIMD=avx2"]),
            "0": run_container(single["0"], a.label, env=["HYSERVE_SIMD=0"]),
        }
        for k, (ok, out) in started.items():
            if not ok:
                note(f"docker run for {k} failed: {out[-300:]}")
        check_1(single["c1"])
        check_2(single["c2"])
        simd = check_8({"avx2": single["avx2"], "0": single["0"]})
        for k in single.values():
            docker("rm", "-f", k, timeout=60)

        t0 = time.time()
        rc, out = stack.run("up", "-d", "--no-build", timeout=300)
        if rc != 0 or not stack.all_ready(120) or not stack.reload_nginx():
            check("the compose stack starts (three replicas healthy, nginx reaching them)", False, out[-800:])
        else:
            note(f"compose stack up in {time.time() - t0:.1f} s, nginx on 127.0.0.1:{stack.lb_port}")
            check_3(stack)
            check_dashboard(stack)
            check_4(stack)
            check_5(stack)
            check_6(stack)
            check_7(stack)
            check_9(stack, a.state)
        check("8. the image's binary runs with the AVX2 and the baseline x86-64 kernels", simd[0], simd[1])
        rc, size = docker("image", "inspect", "-f", "{{.Size}}", IMAGE, timeout=30)
        _, nsize = docker("image", "inspect", "-f", "{{.Size}}", NGINX_IMAGE, timeout=30)
        mb = int(size.strip()) / 1e6 if rc == 0 and size.strip().isdigit() else 0
        nmb = int(nsize.strip()) / 1e6 if nsize.strip().isdigit() else 0
        check(f"image size: {IMAGE} {mb:.1f} MB (under {SIZE_LIMIT_MB} MB), {NGINX_IMAGE} {nmb:.1f} MB",
              0 < mb < SIZE_LIMIT_MB)
    except Exception as e:   # noqa: BLE001 - a crash is a failure; the report still comes
        import traceback
        traceback.print_exc()
        check("the checks ran to the end", False, repr(e))
    finally:
        if report.failed:
            for svc in REPLICAS + ("nginx",):
                c = stack.cid(svc)
                if c:
                    _, logs = docker("logs", "--tail", "15", c, timeout=30)
                    note(f"last lines of {svc}:\n" + "\n".join("#   " + l for l in logs.splitlines()))
        stack.down()
        for k in single.values():
            docker("rm", "-f", k, timeout=60)
    sys.exit(report.close("checks"))


if __name__ == "__main__":
    main()
