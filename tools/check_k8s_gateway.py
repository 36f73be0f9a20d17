"""check_k8s_gateway.py - docker/k8s/gateway/ (the inference gateway mode) checked against the server.

Called by tools/check_k8s.py with the parsed YAML documents. Read from the server, not assumed:
the options (server/config.c), the routes the --metrics-port listener serves (server/routes.c's
metrics_port_dispatch) and the series a running server exports on that listener (build/hyserve
started on models/default.gguf and scraped once). Checks: the kustomization's files exist with
the kinds this mode needs; the InferencePool (inference.networking.k8s.io/v1) selects the pool's
pods, targets their API port and names the EPP's Service and gRPC port; the HTTPRoute sends to
the InferencePool; the pods carry llm-d.ai/inference-serving and an llm-d.ai/engine-type that
has an engineConfigs entry; the metrics port agrees everywhere (containerPort, HYSERVE_METRICS_PORT,
the EPP's --model-server-metrics-port, the scrape annotation) and the probes ask routes that
listener serves; every metric spec of the entry names a gauge the server exports, the cache info
labels are labels of that series and its block size is the precise scorer's blockSize; the
kv-events port is the scorer's socketPort (and HYSERVE_KV_EVENTS binds it once the server has
--kv-events); the token-producer reaches the render sidecar, which serves the same model name
without a key; every HYSERVE_* name is one the server reads.
What this cannot check: that a real EPP image accepts the configuration and routes (no cluster
and no EPP image here); docs/deployment.md says how to try it on a cluster.
"""
import os
import re
import socket
import subprocess
import time
import urllib.request


def scrape_server(hyserve, model):
    """The text of GET /metrics on the --metrics-port listener of a server started here, or an error."""
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    port, mport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYSERVE_")}
    p = subprocess.Popen([hyserve, "serve", "--config", "/dev/null", "-m", model, "--host", "127.0.0.1", "--port",
                          str(port), "--metrics-port", str(mport), "-t", "1", "--api-key", "k8s-check"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/ready", timeout=2) as r:
                    if r.status == 200:
                        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as m:
                            return m.read().decode()
            except OSError:
                pass
            if p.poll() is not None:
                return f"error: the server exited with {p.returncode}"
            time.sleep(0.1)
        return "error: the server did not become ready"
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def exported_series(txt):
    """{name: (type, [label dicts])} from the Prometheus text format."""
    types, series = {}, {}
    for line in txt.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$", line)
        if m:
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            series.setdefault(m.group(1), []).append(labels)
    return {n: (types.get(n), ls) for n, ls in series.items()}


def spec_name(spec):
    """The metric name of an EPP metric spec: "name" or "name{label=value}"."""
    return spec.split("{", 1)[0].strip()


def check_gateway(root, docs, check, server_options, server_env_known):
    rel = "docker/k8s/gateway"
    gdocs = {r: ds for r, ds in docs.items() if r.startswith(rel + "/")}
    kust = (gdocs.get(f"{rel}/kustomization.yaml") or [{}])[0]
    res = kust.get("resources", [])
    missing = [r for r in res if not os.path.exists(os.path.join(root, rel, r))]

    def kind(k):
        return [d for r in res for d in gdocs.get(f"{rel}/{r}", []) if isinstance(d, dict) and d.get("kind") == k]
    kinds = sorted({d.get("kind") for r in res for d in gdocs.get(f"{rel}/{r}", []) if isinstance(d, dict)})
    need = {"Deployment", "InferencePool", "ConfigMap", "HTTPRoute", "Service", "ServiceAccount", "Role",
            "RoleBinding"}
    if not check("gateway: the kustomization lists files that exist, with a pool, an InferencePool, the EPP "
                 "(Deployment, Service, ServiceAccount, Role, RoleBinding, ConfigMap) and an HTTPRoute",
                 not missing and need <= set(kinds), f"missing {missing}, kinds {kinds}"):
        return
    deps = {d["metadata"]["name"]: d for d in kind("Deployment")}
    pool = next((d for d in deps.values() if "llm-d.ai/inference-serving" in
                 d["spec"]["template"]["metadata"].get("labels", {})), None)
    epp = next((d for d in deps.values() if any(c["name"] == "epp" for c in d["spec"]["template"]["spec"]["containers"])),
               None)
    if not check("gateway: one pool Deployment (pods labelled llm-d.ai/inference-serving) and one EPP Deployment",
                 pool is not None and epp is not None, sorted(deps)):
        return
    ppod = pool["spec"]["template"]
    plabels = ppod["metadata"].get("labels", {})
    ctr = ppod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
    ip = kind("InferencePool")[0]
    esvc = next((s for s in kind("Service") if s["metadata"]["name"] == ip["spec"]["endpointPickerRef"]["name"]), None)
    ectr = next(c for c in epp["spec"]["template"]["spec"]["containers"] if c["name"] == "epp")
    eports = {p["name"]: p["containerPort"] for p in ectr.get("ports", [])}
    eargs = dict(a.lstrip("-").split("=", 1) for a in ectr.get("args", []) if "=" in a)
    ref = ip["spec"]["endpointPickerRef"]
    sel = ip["spec"]["selector"]["matchLabels"]
    check("gateway: the InferencePool (inference.networking.k8s.io/v1) selects the pool's pods, targets their API "
          "port (%s) and names the EPP's Service and gRPC port (%s)" % (ports.get("http"), ref.get("port")),
          ip.get("apiVersion") == "inference.networking.k8s.io/v1" and sel.items() <= plabels.items()
          and [t["number"] for t in ip["spec"]["targetPorts"]] == [ports.get("http")]
          and str(ports.get("http")) == env.get("HYSERVE_PORT")
          and esvc is not None and ref.get("kind", "Service") == "Service"
          and any(p["port"] == ref["port"]["number"] and p.get("targetPort") == eports.get("grpc")
                  == int(eargs.get("grpc-port", 0)) for p in esvc["spec"]["ports"])
          and esvc["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items(),
          f"selector {sel}, pod labels {plabels}, ref {ref}")
    routes = kind("HTTPRoute")
    brefs = [b for r in routes for rule in r["spec"]["rules"] for b in rule.get("backendRefs", [])]
    check("gateway: the HTTPRoute sends to the InferencePool", routes and brefs and all(
        b.get("group") == "inference.networking.k8s.io" and b.get("kind") == "InferencePool"
        and b.get("name") == ip["metadata"]["name"] for b in brefs), brefs)

    # the EPP's configuration
    cm = next((c for c in kind("ConfigMap")), {})
    import yaml
    cfg_name = os.path.basename(eargs.get("config-file", ""))
    mounts = {v["name"]: v["mountPath"] for v in ectr.get("volumeMounts", [])}
    vols = {v["name"]: v for v in epp["spec"]["template"]["spec"].get("volumes", [])}
    cm_vol = next((n for n, v in vols.items() if (v.get("configMap") or {}).get("name") == cm["metadata"]["name"]),
                  None)
    check("gateway: the EPP reads its EndpointPickerConfig from the ConfigMap (--config-file in the mount)",
          cm_vol and cfg_name in cm.get("data", {})
          and eargs.get("config-file") == os.path.join(mounts.get(cm_vol, "?"), cfg_name), eargs)
    epc = yaml.safe_load(cm["data"][cfg_name])
    plugins = {p["type"]: p.get("parameters") or {} for p in epc.get("plugins", [])}
    cme = plugins.get("core-metrics-extractor", {})
    engines = {e["name"]: e for e in cme.get("engineConfigs", [])}
    etype = plabels.get("llm-d.ai/engine-type")
    check("gateway: the pods carry llm-d.ai/inference-serving \"true\" and llm-d.ai/engine-type %r, which has an "
          "engineConfigs entry (also the default engine)" % etype,
          plabels.get("llm-d.ai/inference-serving") == "true" and etype in engines
          and cme.get("engineLabelKey", "llm-d.ai/engine-type") == "llm-d.ai/engine-type"
          and cme.get("defaultEngine") == etype, sorted(engines))

    # the metrics listener
    mport = ports.get("metrics")
    opts = server_options
    probes = {n: ((ctr.get(n) or {}).get("httpGet") or {}) for n in ("startupProbe", "readinessProbe", "livenessProbe")}
    src = open(os.path.join(root, "server", "routes.c"), encoding="utf-8").read()
    body = src[src.index("static int metrics_port_dispatch"):]
    body = body[:body.index("\n}\n")]
    open_paths = set(re.findall(r'\{"GET", "(/[a-z]+)", h_\w+\}', body))
    check("gateway: the metrics port agrees: containerPort %s = HYSERVE_METRICS_PORT = the EPP's "
          "--model-server-metrics-port = the scrape annotation, bound on all addresses; the probes ask it routes "
          "its listener serves (%s)" % (mport, sorted(open_paths)),
          "metrics-port" in opts and "metrics-host" in opts and mport
          and str(mport) == env.get("HYSERVE_METRICS_PORT") == eargs.get("model-server-metrics-port")
          == ppod["metadata"].get("annotations", {}).get("prometheus.io/port")
          and env.get("HYSERVE_METRICS_HOST") == "0.0.0.0"
          and "/metrics" in open_paths and (plugins.get("metrics-data-source") or {}).get("path", "/metrics") == "/metrics"
          and all(p.get("port") in ("metrics", mport) and p.get("path") in open_paths for p in probes.values()),
          f"probes {probes}, env {env}")

    hyserve = os.environ.get("HYSERVE") or os.path.join(root, "build", "hyserve")
    txt = scrape_server(hyserve, os.path.join(root, "models", "default.gguf"))
    series = exported_series(txt) if not txt.startswith("error:") else {}
    eng = engines.get(etype, {})
    specs = {k: eng.get(k) for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec")}
    bad = {k: v for k, v in specs.items() if not v or (series.get(spec_name(v)) or (None,))[0] != "gauge"}
    check("gateway: the %r entry's metric specs name gauges the server exports on its metrics listener (%s)" %
          (etype, ", ".join(f"{spec_name(v)}" for v in specs.values() if v)), series and not bad,
          txt[:200] if not series else f"not exported as gauges: {bad}")
    info = (series.get(spec_name(specs.get("cacheInfoSpec") or "")) or (None, [{}]))[1][0]
    bl, nl = eng.get("cacheBlockSizeLabelName", "block_size"), eng.get("cacheNumBlocksLabelName", "num_gpu_blocks")
    pps = plugins.get("precise-prefix-cache-scorer", {})
    bsize = (pps.get("tokenProcessorConfig") or {}).get("blockSize")
    check("gateway: the cache info series carries the block-size label %r (%s tokens, the precise scorer's "
          "blockSize %s and the vllm:cache_config_info block_size) and the block-count label %r" %
          (bl, info.get(bl), bsize, nl),
          info.get(bl) and info.get(bl) == str(bsize) and (info.get(nl) or "").isdigit()
          and ((series.get("vllm:cache_config_info") or (None, [{}]))[1][0]).get("block_size") == info.get(bl)
          and not env.get("HYSERVE_PAGE_TOKENS"), info)
    check("gateway: vLLM's names are exported too (the EPP's default vllm engine reads them)",
          all((series.get(n) or (None,))[0] == "gauge" for n in
              ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
               "vllm:cache_config_info")), sorted(n for n in series if n.startswith("vllm:")))

    # KV events
    kv = pps.get("kvEventsConfig") or {}
    sport = (kv.get("podDiscoveryConfig") or {}).get("socketPort")
    has_kv = "kv-events" in opts
    kv_env = env.get("HYSERVE_KV_EVENTS")
    check("gateway: the kv-events port %s is the precise scorer's socketPort (pods discovered, topic filter kv@)%s" %
          (ports.get("kv-events"), "; HYSERVE_KV_EVENTS binds it" if has_kv else
           " (the server has no --kv-events yet: HYSERVE_KV_EVENTS stays commented out in pool.yaml)"),
          ports.get("kv-events") == sport and kv.get("discoverPods") is True and kv.get("topicFilter") == "kv@"
          and (kv_env == f"tcp://*:{sport}" if has_kv else kv_env is None), f"env {kv_env}, kvEventsConfig {kv}")

    # the render sidecar
    tp = plugins.get("token-producer", {})
    url = ((tp.get("vllm") or {}).get("http") or "")
    rctr = next((c for c in epp["spec"]["template"]["spec"]["containers"] if c["name"] != "epp"), {})
    renv = {e["name"]: e.get("value") for e in rctr.get("env", [])}
    check("gateway: the token-producer (%s, model %r) reaches the render sidecar in the EPP pod: loopback, no "
          "key, the pool's served model name" % (url, tp.get("modelName")),
          url == f"http://{renv.get('HYSERVE_HOST')}:{renv.get('HYSERVE_PORT')}" and renv.get("HYSERVE_HOST") == "127.0.0.1"
          and rctr.get("image") == ctr.get("image") and not any(k.startswith("HYSERVE_API_KEY") for k in renv)
          and tp.get("modelName") == renv.get("HYSERVE_SERVED_MODEL_NAME") == env.get("HYSERVE_SERVED_MODEL_NAME")
          and ("POST", "/v1/completions/render") in server_routes_of(root)
          and ("POST", "/v1/chat/completions/render") in server_routes_of(root), renv)

    used = {k for k in list(env) + list(renv) if k.startswith("HYSERVE_")}
    check(f"gateway: every HYSERVE_* variable the pool and the sidecar set is one the server reads ({len(used)} names)",
          used and used <= server_env_known, f"unknown: {sorted(used - server_env_known)}")


def server_routes_of(root):
    src = open(os.path.join(root, "server", "routes.c"), encoding="utf-8").read()
    return set(re.findall(r'\{\s*"(GET|POST|DELETE|PUT)",\s*"([^"]+)",\s*h_\w+\s*\}', src))
