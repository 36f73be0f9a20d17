#!/usr/bin/env python3
"""check_k8s.py - the deployment files checked against the server, without a cluster.

The Kubernetes manifests (docker/k8s/), docker/Dockerfile, docker/compose.yaml
and the nginx configurations must agree with each other and with the server
they deploy. Read from the sources, not assumed:
  - the routes the server answers (server/routes.c, the ROUTES table),
  - its options and their HYSERVE_* variables (server/config.c, OPTS),
  - the other HYSERVE_* variables the code reads (getenv),
  - the metric names it exports (server/metrics.c),
  - the cache a model needs (`hyserve mem`, for the memory limit).
Checks: every YAML file parses (python3-yaml); the kustomization lists files
that exist, with the four kinds; probes ask routes the server answers
(readiness /ready, liveness /health); ports agree (containerPort, EXPOSE,
HYSERVE_PORT, the Service's targetPort, the nginx upstreams); every HYSERVE_*
name used is one the server reads, and the Dockerfile sets every option;
the grace periods exceed the drain timeout (with the preStop pause);
non-root, read-only root, a writable /tmp; selectors match the pods; the HPA
scales the Deployment on a metric the server exports and the adapter rule
serves; .dockerignore lets in every file the image's `make` uses (`make -n`);
the memory limit holds the model's default cache beside its weights; and
docker/k8s/gateway/, the inference gateway mode (tools/check_k8s_gateway.py).

Prints "ok - ..." or "not ok - ..." per check and, last,
"k8s: N passed, N failed". Exit status 1 when a check fails.
usage: check_k8s.py [ROOT]   (default: the repository holding this file);
HYSERVE names the binary for `hyserve mem` (default ROOT/build/hyserve).
"""
import fnmatch
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402
from check_k8s_gateway import check_gateway  # noqa: E402

try:
    import yaml
except ImportError:     # the suite still reports, as one failure
    yaml = None

report = Report()
check = report.check


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------
# what the server says about itself
# ---------------------------------------------------------------------------

def server_routes(root):
    """{(method, path)} from the ROUTES table of server/routes.c."""
    return set(re.findall(r'\{\s*"(GET|POST|DELETE|PUT)",\s*"([^"]+)",\s*h_\w+\s*\}', read(root, "server/routes.c")))


def server_options(root):
    """{option name: HYSERVE_* variable} from the OPTS table of server/config.c."""
    return dict(re.findall(r'\{\s*"([a-z][a-z-]*)",\s*(?:\'.\'|0),\s*"(HYSERVE_[A-Z0-9_]+)"', read(root, "server/config.c")))


def env_read_by_code(root):
    """HYSERVE_* variables any C file reads with getenv."""
    names = set()
    for path in glob.glob(os.path.join(root, "engine", "**", "*.c"), recursive=True) + \
            glob.glob(os.path.join(root, "server", "*.c")) + glob.glob(os.path.join(root, "cli", "*.c")):
        with open(path, encoding="utf-8") as f:
            names |= set(re.findall(r'getenv\("(HYSERVE_[A-Z0-9_]+)"\)', f.read()))
    return names


def server_metrics(root):
    return set(re.findall(r'"(hyserve_[a-z0-9_]+)', read(root, "server/metrics.c")))


def dockerfile(root):
    """(ENV of the last stage as a dict, EXPOSE ports, USER) of docker/Dockerfile."""
    text = read(root, "docker/Dockerfile").replace("\\\n", " ")
    stages = re.split(r"^FROM\s", text, flags=re.M)
    last = stages[-1]
    env, expose, user = {}, set(), None
    for line in last.splitlines():
        s = line.strip()
        if s.startswith("ENV "):
            for k, v in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', s[4:]):
                env[k] = v.strip('"')
        elif s.startswith("EXPOSE "):
            expose |= {int(p.split("/")[0]) for p in s.split()[1:]}
        elif s.startswith("USER "):
            user = s.split()[1]
    return env, expose, user


def dockerignore_keeps(rules, path):
    """Whether a .dockerignore (rules: its lines in order) lets path into the
    build context: the last rule that matches the path, or a folder above
    it, decides; '!' lets in."""
    keep = True
    for rule in rules:
        neg = rule.startswith("!")
        pat = rule[1:] if neg else rule
        pat = pat.rstrip("/")
        if pat.startswith("**/"):
            hit = fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(os.path.basename(path), pat[3:])
        else:
            parts = path.split("/")
            hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1))
        if hit:
            keep = neg
    return keep


def build_inputs(root):
    """The tracked files the image's build stage uses: those `make -n`
    names for build/hyserve (as docker/Dockerfile runs it), and everything
    under the folders it passes with -I (the headers)."""
    # the image's plain build, whatever make runs this suite: under `make test
    # SANITIZE=1` the parent's MAKEFLAGS would carry SANITIZE=1 down
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    out = subprocess.run(["make", "-n", "-B", "-C", root, "DEPS=build", "OPT=-O2", "SANITIZE=0", "build/hyserve"],
                         capture_output=True, text=True, timeout=120, env=env).stdout
    tracked = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             timeout=60).stdout.split()
    tracked_set = set(tracked)
    used = set()
    for tok in out.split():
        if tok.startswith("-I") and not tok.startswith("-I/"):
            d = tok[2:].rstrip("/") + "/"
            used |= {f for f in tracked if f.startswith(d)}
        elif tok in tracked_set:
            used.add(tok)
    return used


def seconds(v):
    """'45s', '1m30s', 75, '60' -> seconds."""
    if isinstance(v, (int, float)):
        return float(v)
    total, s = 0.0, str(v).strip()
    for num, unit in re.findall(r"([0-9.]+)\s*(h|m|s|ms|us)?", s):
        total += float(num) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "": 1}[unit or ""]
    return total


def quantity_bytes(q):
    """Kubernetes memory quantity -> bytes."""
    m = re.fullmatch(r"([0-9.]+)([KMGTE]i?|k)?", str(q).strip())
    if not m:
        return None
    mul = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}.get(m.group(2), 1)
    return int(float(m.group(1)) * mul)


# ---------------------------------------------------------------------------

def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not check("python3-yaml is installed (tools/install-deps.sh)", yaml is not None):
        return report.close("k8s")
    k8s = os.path.join(root, "docker", "k8s")
    files = sorted(glob.glob(os.path.join(k8s, "**", "*.yaml"), recursive=True)) + \
        sorted(glob.glob(os.path.join(root, "docker", "compose*.yaml")))
    docs, bad = {}, []
    for path in files:
        rel = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as f:
                docs[rel] = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            bad.append(f"{rel}: {e}")
    check(f"every YAML file parses ({len(files)} files under docker/)", files and not bad, "; ".join(bad))

    def kind(k):        # the plain path's manifests (docker/k8s/gateway/ is checked by check_k8s_gateway)
        return [(rel, d) for rel, ds in docs.items() if rel.startswith("docker/k8s/")
                and not rel.startswith("docker/k8s/gateway/") for d in ds
                if isinstance(d, dict) and d.get("kind") == k]

    kust = docs.get("docker/k8s/kustomization.yaml", [{}])[0]
    res = kust.get("resources", [])
    missing = [r for r in res if not os.path.exists(os.path.join(k8s, r))]
    kinds = {d.get("kind") for r in res for d in docs.get(f"docker/k8s/{r}", []) if isinstance(d, dict)}
    check("the kustomization lists files that exist: a Deployment, Service, PodDisruptionBudget and "
          "HorizontalPodAutoscaler", not missing and
          {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds,
          f"missing {missing}, kinds {sorted(map(str, kinds))}")
    comp = docs.get("docker/k8s/session-affinity/kustomization.yaml", [{}])[0]
    ing = kind("Ingress")
    check("session affinity by X-Session-Id is an optional component (an Ingress hashing the header)",
          comp.get("kind") == "Component" and ing and "$http_x_session_id" in
          json.dumps(ing[0][1].get("metadata", {}).get("annotations", {})))

    deps = kind("Deployment")
    if not check("one Deployment", len(deps) == 1, str([r for r, _ in deps])):
        return report.close("k8s")
    dep = deps[0][1]
    pod = dep["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    spec = pod["spec"]
    ctr = spec["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in ctr.get("ports", [])}
    env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
    d_env, d_expose, d_user = dockerfile(root)
    routes = server_routes(root)
    gets = {p for m, p in routes if m == "GET"}

    # probes
    def probe(name):
        p = ctr.get(name) or {}
        return (p.get("httpGet") or {}).get("path"), (p.get("httpGet") or {}).get("port")
    r_path, r_port = probe("readinessProbe")
    l_path, l_port = probe("livenessProbe")
    s_path, s_port = probe("startupProbe")
    check("probes ask GET routes the server answers: readiness and startup /ready, liveness /health",
          r_path == "/ready" and s_path == "/ready" and l_path == "/health" and {r_path, l_path, s_path} <= gets,
          f"readiness {r_path}, startup {s_path}, liveness {l_path}; server GET routes {sorted(gets)}")

    def port_of(p):
        return ports.get(p) if isinstance(p, str) else p
    cport = next(iter(ports.values()), None)
    svc = kind("Service")
    svc_ports = [p for _, s in svc for p in s["spec"].get("ports", [])]
    check("ports agree: containerPort %s = EXPOSE %s = HYSERVE_PORT (Dockerfile %s, Deployment %s) = probes' and "
          "the Service's target" % (cport, sorted(d_expose), d_env.get("HYSERVE_PORT"), env.get("HYSERVE_PORT")),
          cport is not None and d_expose == {cport} and str(cport) == d_env.get("HYSERVE_PORT")
          and env.get("HYSERVE_PORT", str(cport)) == str(cport)
          and all(port_of(p) == cport for p in (r_port, l_port, s_port))
          and svc_ports and all(port_of(p.get("targetPort")) == cport for p in svc_ports)
          and str(cport) == pod["metadata"].get("annotations", {}).get("prometheus.io/port"))

    # environment names
    opts = server_options(root)
    known = set(opts.values()) | env_read_by_code(root)
    compose = docs.get("docker/compose.yaml", [{}])[0]
    c_env = {}
    for name, s in (compose.get("services") or {}).items():
        e = s.get("environment") or {}
        c_env.update(e if isinstance(e, dict) else dict(x.split("=", 1) for x in e))
    used = {k for k in list(env) + list(d_env) + list(c_env) if k.startswith("HYSERVE_")}
    check(f"every HYSERVE_* variable set in the Deployment, Dockerfile and compose.yaml is one the server reads "
          f"({len(used)} names)", used and used <= known, f"unknown: {sorted(used - known)}")
    check(f"the Dockerfile sets every server option's variable ({len(opts)} options)",
          set(opts.values()) <= set(d_env), f"missing: {sorted(set(opts.values()) - set(d_env))}")
    check("the image binds all addresses, and its idle OpenMP threads sleep",
          d_env.get("HYSERVE_HOST") == "0.0.0.0" and d_env.get("OMP_WAIT_POLICY", "").lower() == "passive")

    # drain and grace periods
    drain = seconds(env.get("HYSERVE_DRAIN_TIMEOUT") or d_env.get("HYSERVE_DRAIN_TIMEOUT") or 60)
    pre = ((ctr.get("lifecycle") or {}).get("preStop") or {})
    pre_cmd = (pre.get("exec") or {}).get("command") or []
    pause = seconds(pre_cmd[1]) if len(pre_cmd) == 2 and pre_cmd[0] == "sleep" else \
        seconds((pre.get("sleep") or {}).get("seconds", 0))
    grace = seconds(spec.get("terminationGracePeriodSeconds", 30))
    check(f"terminationGracePeriodSeconds {grace:.0f} exceeds the preStop pause {pause:.0f} s + drain timeout "
          f"{drain:.0f} s", pause > 0 and grace > pause + drain)
    c_ok, c_detail = True, []
    for name, s in (compose.get("services") or {}).items():
        if "hyserve" not in str(s.get("image", "")) or "nginx" in str(s.get("image", "")):
            continue
        e = s.get("environment") or {}
        d = seconds(e.get("HYSERVE_DRAIN_TIMEOUT") or d_env.get("HYSERVE_DRAIN_TIMEOUT") or 60)
        g = seconds(s.get("stop_grace_period", "10s"))
        c_ok &= g > d
        c_detail.append(f"{name}: {g:.0f} s > {d:.0f} s")
    check("compose.yaml: each replica's stop_grace_period exceeds its drain timeout (%s)" % ", ".join(c_detail),
          c_ok and c_detail)

    # security
    psc, csc = spec.get("securityContext") or {}, ctr.get("securityContext") or {}
    mounts = {m["mountPath"]: m["name"] for m in ctr.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    uid = str(psc.get("runAsUser", csc.get("runAsUser", "")))
    check("runAsNonRoot, readOnlyRootFilesystem, no privilege escalation, a writable emptyDir at /tmp, "
          "runAsUser = the image's USER (%s)" % d_user,
          (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")) is True and csc.get("readOnlyRootFilesystem") is True
          and csc.get("allowPrivilegeEscalation") is False and "/tmp" in mounts
          and "emptyDir" in vols.get(mounts.get("/tmp"), {}) and d_user and uid == d_user.split(":")[0])

    # selectors and targets
    def matches(sel):
        return bool(sel) and all(pod_labels.get(k) == v for k, v in sel.items())
    pdb = kind("PodDisruptionBudget")
    check("the Deployment's, Service's and PodDisruptionBudget's selectors match the pod labels",
          matches(dep["spec"]["selector"].get("matchLabels")) and svc and all(matches(s["spec"].get("selector"))
                                                                               for _, s in svc)
          and pdb and all(matches(p["spec"]["selector"].get("matchLabels")) for _, p in pdb))
    hpa = kind("HorizontalPodAutoscaler")
    h = hpa[0][1] if hpa else {}
    tgt = (h.get("spec") or {}).get("scaleTargetRef") or {}
    mnames = [((m.get("pods") or {}).get("metric") or {}).get("name") for m in (h.get("spec") or {}).get("metrics", [])]
    adapter = json.dumps(docs.get("docker/k8s/prometheus-adapter-values.yaml", [{}]))
    exported = server_metrics(root)
    check("the HPA scales the Deployment on %s, which the server exports and the adapter rule serves" % mnames,
          tgt.get("kind") == "Deployment" and tgt.get("name") == dep["metadata"]["name"] and mnames
          and all(n in exported and n in adapter for n in mnames)
          and (h["spec"].get("minReplicas", 1) <= dep["spec"].get("replicas", 1) <= h["spec"]["maxReplicas"]),
          f"target {tgt}, metrics {mnames}")

    # nginx upstreams = compose services, on the container port
    ups_ok, seen = True, []
    svc_names = set((compose.get("services") or {}))
    for conf in ("docker/nginx.conf", "docker/nginx-affinity.conf"):
        ups = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", read(root, conf), flags=re.M)
        seen.append(f"{conf}: {len(ups)}")
        ups_ok &= len(ups) >= 2 and all(n in svc_names and int(p) == cport for n, p in ups)
    check("nginx's upstreams are the compose replicas on port %s (%s)" % (cport, ", ".join(seen)), ups_ok)

    # the build context: every file the build stage's make uses gets in
    rules = [l.strip() for l in read(root, ".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    try:
        used = build_inputs(root)
    except (OSError, subprocess.TimeoutExpired) as e:
        used = set()
        print(f"# make -n failed: {e!r}")
    left_out = sorted(f for f in used if not dockerignore_keeps(rules, f))
    check(f"the Docker build context (.dockerignore) holds the {len(used)} files `make build/hyserve` uses",
          len(used) > 10 and not left_out, f"left out: {left_out}")

    # memory: the default cache of the image's model beside its weights, under the limit
    hyserve = os.environ.get("HYSERVE") or os.path.join(root, "build", "hyserve")
    model = os.path.join(root, "models", "default.gguf")
    limit = quantity_bytes(((ctr.get("resources") or {}).get("limits") or {}).get("memory", ""))
    need, detail = None, ""
    try:
        info = subprocess.run([hyserve, "info", "-m", model], capture_output=True, text=True, timeout=60).stdout
        ctx = int(re.search(r"context \(train\) (\d+)", info).group(1))
        ctx = min(ctx, int(env.get("HYSERVE_CTX") or 0) or 4096)
        seqs = int(env.get("HYSERVE_MAX_SEQS") or 0) or 64
        mem = subprocess.run([hyserve, "mem", "-m", model, "--context", str(ctx), "--batch", str(seqs), "--json"],
                             capture_output=True, text=True, timeout=60)
        need = json.loads(mem.stdout)["total"]["bytes_reserved"]
        detail = f"hyserve mem: {need / 2**20:.1f} MiB for {seqs} x {ctx} tokens"
    except (OSError, ValueError, AttributeError, KeyError, subprocess.TimeoutExpired) as e:
        detail = f"hyserve mem failed: {e!r}"
    weights = os.path.getsize(model) if os.path.exists(model) else 0
    # the server's rule (server/cgroup.c): 64 MiB + 1/8 of the limit stay out of the cache
    room = limit - (64 << 20) - limit // 8 - weights if limit else 0
    check("the memory limit (%s) holds the default cache beside the weights (%s; room %.1f MiB)" %
          (((ctr.get("resources") or {}).get("limits") or {}).get("memory"), detail, room / 2**20),
          need is not None and limit and room >= need, detail)

    # the inference gateway mode (docker/k8s/gateway/)
    check_gateway(root, docs, check, opts, known)

    return report.close("k8s")


if __name__ == "__main__":
    sys.exit(main())
