#!/usr/bin/env python3
"""Checks that the deployment files only use what the project's binaries really offer.

    python deploy/check_deploy.py [--bin-dir target/debug]

What is checked, against the real binaries' `--help` (clap lists every flag and its
`[env: NAME]` fallback) and `cargo metadata`:

- Dockerfile: every binary copied out of target/release and the ENTRYPOINT is a bin target of
  the workspace; the default CMD is a subcommand of `outbox-relay`; every ENV is read by one of
  the binaries.
- deploy/compose/compose.yaml: for every container of our image, its binary (entrypoint) and
  subcommand exist, every `--flag` of its command is one of that (sub)command's flags, every
  environment variable is one that binary reads; every mounted file exists; Prometheus scrapes
  exactly the compose services and ports our processes listen on.
- deploy/k8s/*.yaml: the same for every container of our image (command, args, env, envFrom
  ConfigMap keys); referenced ConfigMaps, Secrets and their keys exist; probe ports are named
  ports of the container.
- no shipped secrets (a deployment must not start with a secret anyone can read here): compose
  gives every secret (`*SECRET*`, `*PASSWORD*`, the database URLs) as a required `${NAME:?...}`
  without a default; no manifest holds a Secret's values (the operator creates them with the
  `kubectl create secret` commands documented in deploy/k8s/00-config.yaml, and every
  `secretKeyRef` names a key those commands create); nothing sets the development flag
  ALLOW_WEAK_SECRETS; Prometheus runs without `--web.enable-lifecycle`; published ports are
  bound to 127.0.0.1 and the broker's port is published only by the
  deploy/compose/broker-port.yaml override.
- deploy/grafana/outbox-relay.json: every panel uses the provisioned datasource and every query
  parses (promtool check rules on the queries as recording rules).

Needs PyYAML (in the project venv with check-jsonschema) and, for the queries, promtool.
Exits 1 with one line per problem.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PREFIX = "outbox-relay:"
RELAY = "outbox-relay"

# Variables read by every binary outside clap, with the source file that reads them (checked).
PROCESS_ENV = {
    "RUST_LOG": ["services/outbox-process/src/lib.rs"],
    "LOG_FORMAT": ["services/outbox-process/src/lib.rs"],
}

problems = []


def problem(msg):
    problems.append(msg)


class Binaries:
    """Flags and environment variables of the built binaries, from their `--help`."""

    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.cache = {}
        meta = json.loads(
            subprocess.run(
                ["cargo", "metadata", "--no-deps", "--format-version", "1"],
                cwd=ROOT, check=True, capture_output=True, text=True,
            ).stdout
        )
        self.bins = {
            t["name"]
            for p in meta["packages"]
            for t in p["targets"]
            if "bin" in t["kind"]
        }

    def help(self, binary, sub=None):
        key = (binary, sub)
        if key not in self.cache:
            exe = self.bin_dir / binary
            if not exe.exists():
                raise SystemExit(
                    f"{exe} is missing: run `cargo build --workspace --bins` first (make test does)"
                )
            argv = [str(exe)] + ([sub] if sub else []) + ["--help"]
            # A clean environment: values of set variables would show up in the help text.
            out = subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
            if out.returncode != 0:
                self.cache[key] = None
            else:
                text = out.stdout
                self.cache[key] = {
                    "flags": set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)),
                    "env": set(re.findall(r"\[env: ([A-Z][A-Z0-9_]*)", text)),
                    "subcommands": set(
                        re.findall(r"^  ([a-z][a-z0-9-]*)  ", text.split("Commands:")[1], re.M)
                    ) if "Commands:" in text else set(),
                    # `Usage: x [OPTIONS] [COMMAND]`: runs without one too (the services).
                    "subcommand_optional": bool(re.search(r"^Usage: .*\[COMMAND\]", text, re.M)),
                }
        return self.cache[key]

    def check_invocation(self, where, binary, args, env_names):
        """`binary args...` with environment `env_names`: all must exist."""
        if binary not in self.bins:
            problem(f"{where}: {binary} is not a binary of the workspace ({sorted(self.bins)})")
            return
        sub = None
        top = self.help(binary)
        if top["subcommands"] and (not args or args[0].startswith("-")) and top["subcommand_optional"]:
            pass
        elif top["subcommands"]:
            if not args or args[0].startswith("-"):
                problem(f"{where}: {binary} needs a subcommand, got {args}")
                return
            sub = args[0]
            if sub not in top["subcommands"]:
                problem(f"{where}: {binary} has no subcommand {sub!r} ({sorted(top['subcommands'])})")
                return
            args = args[1:]
        h = self.help(binary, sub)
        name = f"{binary} {sub}" if sub else binary
        for a in args:
            if a.startswith("--"):
                flag = a.split("=", 1)[0]
                if flag not in h["flags"]:
                    problem(f"{where}: `{name}` has no flag {flag}")
        for e in env_names:
            if e in h["env"]:
                continue
            if e in PROCESS_ENV:
                continue
            problem(f"{where}: `{name}` reads no environment variable {e}")
        return name


def check_process_env():
    for name, files in PROCESS_ENV.items():
        for f in files:
            src = (ROOT / f).read_text()
            if name not in src and name != "RUST_LOG":
                problem(f"{f} no longer reads {name}")
            if name == "RUST_LOG" and "EnvFilter::try_from_default_env" not in src:
                problem(f"{f} no longer reads RUST_LOG (EnvFilter::try_from_default_env)")


def check_dockerfile(b):
    text = (ROOT / "Dockerfile").read_text()
    copied = re.findall(r"target/release/([a-z0-9-]+)", text)
    if not copied:
        problem("Dockerfile: copies no binary out of target/release")
    for name in copied:
        if name not in b.bins:
            problem(f"Dockerfile: copies target/release/{name}, not a binary of the workspace")
    # Tools, not services: the benchmark, the marketplace simulator (tests and the demo) and the
    # chaos run (it starts its own servers and the whole system; `make chaos`).
    for name in b.bins - set(copied) - {"relay-bench", "marketplace-sim", "chaos"}:
        problem(f"Dockerfile: binary {name} is not in the image")
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    env_block = re.search(r"^ENV ((?:.*\\\n)*.*)$", text, re.M).group(1)
    env_names = re.findall(r"([A-Z][A-Z0-9_]*)=", env_block)
    if DEV_FLAG in env_names:
        problem(f"Dockerfile: ENV sets the development flag {DEV_FLAG}")
    # ENV applies to every binary of the image: each variable must be read by some binary.
    readers = {bn: b.help(bn, "run" if bn == RELAY else None) for bn in b.bins - {"relay-bench"}}
    for e in env_names:
        if e not in PROCESS_ENV and not any(e in h["env"] for h in readers.values()):
            problem(f"Dockerfile: ENV {e} is read by none of the binaries")
    b.check_invocation("Dockerfile ENTRYPOINT/CMD", entry[0], entry[1:] + cmd, [])
    # The builder needs the whole workspace (every member) and migrations/ (sqlx::migrate!).
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ["Cargo.toml", "Cargo.lock", "migrations/", "relay/", "services/", "tests/"]:
        if needed in ignored or not (ROOT / needed).exists():
            problem(f"Dockerfile: the build needs {needed} in the context")
    if "HEALTHCHECK" not in text or "/healthz" not in text:
        problem("Dockerfile: no HEALTHCHECK on /healthz")
    for path in re.findall(r"(?:mount=type=cache,target=|WORKDIR )(\S+)", text):
        if not path.startswith("/"):
            problem(f"Dockerfile: relative path {path}")
    return len(copied)


SECRET_NAME = re.compile(r"SECRET|PASSWORD|DATABASE_URL")
DEV_FLAG = "ALLOW_WEAK_SECRETS"


def check_compose_secrets(name, env):
    """Secrets are required interpolations without defaults, and the dev flag is never set."""
    for k, v in env.items():
        if k == DEV_FLAG:
            problem(f"compose {name}: sets the development flag {DEV_FLAG}")
        if not SECRET_NAME.search(k):
            continue
        v = str(v)
        refs = re.findall(r"\$\{([A-Z0-9_]+)(:?[-?+])?([^}]*)\}", v)
        if not refs:
            problem(f"compose {name}: {k} is a literal; require it with ${{{k}:?...}}")
        for var, op, _ in refs:
            if op not in (":?", "?"):
                problem(f"compose {name}: {k} takes ${{{var}}} with a default or optional; require it with ${{{var}:?...}}")


def check_published_ports(where, svc):
    for p in svc.get("ports", []):
        if not str(p).startswith("127.0.0.1:"):
            problem(f"{where}: publishes {p} on every interface; bind it to 127.0.0.1")


def listen_port(env):
    for key in ("METRICS_ADDR", "LISTEN_ADDR"):
        if key in env:
            return key, str(env[key]).rsplit(":", 1)[1]
    return None, None


def check_compose(b):
    path = ROOT / "deploy/compose/compose.yaml"
    doc = yaml.safe_load(path.read_text())
    ours = 0
    ports = {}
    for name, svc in doc["services"].items():
        env_any = svc.get("environment") or {}
        if isinstance(env_any, list):
            env_any = dict(e.split("=", 1) for e in env_any)
        check_compose_secrets(name, env_any)
        check_published_ports(f"compose {name}", svc)
        if "kafka" in str(svc.get("image", "")) and svc.get("ports"):
            problem(f"compose {name}: publishes the unauthenticated broker; leave it to broker-port.yaml")
        if any("--web.enable-lifecycle" in str(c) for c in (svc.get("command") or [])):
            problem(f"compose {name}: Prometheus with --web.enable-lifecycle (unauthenticated reload and quit)")
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                if not (path.parent / src).exists():
                    problem(f"compose {name}: mounts {src}, which does not exist")
        if not str(svc.get("image", "")).startswith(IMAGE_PREFIX):
            continue
        ours += 1
        build = svc.get("build")
        if build:
            ctx = (path.parent / build["context"]).resolve()
            if not (ctx / build.get("dockerfile", "Dockerfile")).is_file():
                problem(f"compose {name}: no {build.get('dockerfile', 'Dockerfile')} in build context {ctx}")
        entry = svc.get("entrypoint") or [RELAY]
        if isinstance(entry, str):
            entry = entry.split()
        command = svc.get("command") or []
        if isinstance(command, str):
            command = command.split()
        if entry[0] == RELAY and not command:
            command = ["run"]  # the image's CMD
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        b.check_invocation(f"compose {name}", entry[0], entry[1:] + command, env.keys())
        key, port = listen_port(env)
        if port is None:
            problem(f"compose {name}: neither METRICS_ADDR nor LISTEN_ADDR set (the binaries default to 127.0.0.1)")
        else:
            ports[name] = port
            for h in [svc.get("healthcheck", {}).get("test", [])]:
                url = next((t for t in h if "/healthz" in t), None)
                if url and f":{port}/" not in url:
                    problem(f"compose {name}: health check {url} is not on port {port} ({key})")
    override = yaml.safe_load((path.parent / "broker-port.yaml").read_text())
    for name, svc in override["services"].items():
        check_published_ports(f"compose broker-port.yaml {name}", svc)
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    scraped = {}
    for job in prom["scrape_configs"]:
        for sc in job.get("static_configs", []):
            for t in sc["targets"]:
                host, port = t.rsplit(":", 1)
                scraped[host] = port
    for host, port in scraped.items():
        if host not in ports:
            problem(f"prometheus.yml scrapes {host}, which is no process of ours in compose")
        elif ports[host] != port:
            problem(f"prometheus.yml scrapes {host}:{port}, but it listens on {ports[host]}")
    for host in set(ports) - set(scraped):
        problem(f"prometheus.yml does not scrape {host}")
    return ours


def check_k8s(b):
    docs = []
    for f in sorted((ROOT / "deploy/k8s").glob("*.yaml")):
        docs += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for _, d in docs if d["kind"] == "ConfigMap"}
    for fname, d in docs:
        if d["kind"] == "Secret" and (d.get("data") or d.get("stringData")):
            problem(f"k8s {fname}: Secret {d['metadata']['name']} holds values; the operator creates it")
    # The Secrets the operator creates: `kubectl create secret generic NAME --from-literal=KEY=...`
    # in the comments of 00-config.yaml.
    secrets = {}
    current = None
    for line in (ROOT / "deploy/k8s/00-config.yaml").read_text().splitlines():
        m = re.search(r"kubectl create secret generic ([a-z0-9-]+)", line)
        if m:
            current = secrets.setdefault(m.group(1), set())
        for key in re.findall(r"--from-literal=([a-z0-9-]+)=", line):
            if current is None:
                problem("k8s 00-config.yaml: --from-literal outside a `kubectl create secret` command")
            else:
                current.add(key)
    if not secrets:
        problem("k8s 00-config.yaml: no documented `kubectl create secret generic` command")
    containers = 0
    for fname, d in docs:
        if d["kind"] != "Deployment":
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []):
            where = f"k8s {fname} {d['metadata']['name']}/init {c['name']}"
            if not c["image"].startswith(IMAGE_PREFIX):
                continue
            env = [e["name"] for e in c.get("env", [])]
            if DEV_FLAG in env:
                problem(f"{where}: sets the development flag {DEV_FLAG}")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    problem(f"{where}: secret {ref['name']} has no documented key {ref['key']}")
            for ef in c.get("envFrom", []):
                env += list(configmaps.get(ef.get("configMapRef", {}).get("name"), {}))
            b.check_invocation(where, c["command"][0], c["command"][1:] + (c.get("args") or []), env)
        for c in pod["containers"]:
            where = f"k8s {fname} {d['metadata']['name']}/{c['name']}"
            if not c["image"].startswith(IMAGE_PREFIX):
                continue
            containers += 1
            if DEV_FLAG in [e["name"] for e in c.get("env", [])]:
                problem(f"{where}: sets the development flag {DEV_FLAG}")
            entry = c.get("command") or [RELAY]
            args = c.get("args") or (["run"] if entry[0] == RELAY else [])
            env = [e["name"] for e in c.get("env", [])]
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    problem(f"{where}: secret {ref['name']} has no documented key {ref['key']}")
            for ef in c.get("envFrom", []):
                cm = ef.get("configMapRef", {}).get("name")
                if cm:
                    if cm not in configmaps:
                        problem(f"{where}: no ConfigMap {cm}")
                    env += list(configmaps.get(cm, {}))
                    if DEV_FLAG in configmaps.get(cm, {}):
                        problem(f"{where}: ConfigMap {cm} sets the development flag {DEV_FLAG}")
            b.check_invocation(where, entry[0], entry[1:] + args, env)
            port_names = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not p:
                    problem(f"{where}: no {probe}")
                    continue
                action = p.get("httpGet") or p.get("tcpSocket")
                if action["port"] not in port_names:
                    problem(f"{where}: {probe} port {action['port']} is not a named port")
            addr = next((e.get("value") for e in c.get("env", []) if e["name"] in ("METRICS_ADDR", "LISTEN_ADDR")), None)
            if addr is None or int(addr.rsplit(":", 1)[1]) not in port_names.values():
                problem(f"{where}: listen address {addr} is not a container port")
            if "resources" not in c or "requests" not in c["resources"]:
                problem(f"{where}: no resource requests")
    return containers


def check_dashboard():
    dash = json.loads((ROOT / "deploy/grafana/outbox-relay.json").read_text())
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    uid = ds["datasources"][0]["uid"]
    # Panels use the dashboard's `datasource` variable (so the file imports into any Grafana);
    # its default is the datasource compose provisions.
    var = next((v for v in dash.get("templating", {}).get("list", []) if v.get("name") == "datasource"), None)
    if var is None or var.get("type") != "datasource" or var.get("current", {}).get("value") != uid:
        problem(f"dashboard: no `datasource` variable defaulting to the provisioned uid {uid!r}")
    exprs = []
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"dashboard panel {p['title']!r}: datasource is not the `datasource` variable")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problem(f"dashboard panel {p['title']!r}: a query's datasource is not the `datasource` variable")
        if not p.get("targets"):
            problem(f"dashboard panel {p['title']!r}: no query")
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    promtool = shutil.which("promtool")
    if not promtool:
        problem("promtool not found: run deploy/local/install-deps.sh")
        return len(exprs)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, (_, e) in enumerate(exprs)
    ]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        out = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
        if out.returncode != 0:
            problem(f"dashboard queries do not parse:\n{out.stdout}{out.stderr}")
    return len(exprs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    ap.add_argument("--bin-dir", type=Path, default=target / "debug")
    args = ap.parse_args()
    b = Binaries(args.bin_dir)
    check_process_env()
    n_docker = check_dockerfile(b)
    n_compose = check_compose(b)
    n_k8s = check_k8s(b)
    n_queries = check_dashboard()
    if problems:
        for p in problems:
            print(f"check_deploy: {p}", file=sys.stderr)
        print(f"check_deploy: {len(problems)} problems", file=sys.stderr)
        return 1
    print(
        f"check_deploy: ok: Dockerfile ({n_docker} binaries), compose ({n_compose} containers of our image), "
        f"k8s ({n_k8s} containers), dashboard ({n_queries} queries parse); "
        f"checked against {len(b.cache)} --help outputs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
