#!/usr/bin/env python
"""What one in-flight generation costs the host: memory and start-up of the public-model stubs.

Every in-flight generation holds one instance of the public model it came through, and the
render script gives `<task>` and `<task>_stream` `capacity` instances each, so a deployment
of capacity N starts 2N public-model stub processes beside its stages. For each capacity this
renders the deployment's repository, starts tritonserver, times READY, and reads from /proc
for every stub: RSS, PSS (shared pages split among the processes that map them) and USS
(pages only it maps), and the CPU seconds it spent getting there (its start-up cost; CPU time
rather than wall time, which on a shared host mostly measures the neighbours). Then it runs
one generation through every public-model instance (N concurrent unary and N concurrent
streaming requests) and reads the stubs again: what a stub imports or allocates on the
request path shows there.

    .venv/bin/python perf/inflight_cost.py --capacities 1,8,32 --out /tmp/inflight.json

Prints one table per capacity (per model: instances, mean RSS/PSS/USS, mean start-up CPU)
and writes every reading as JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backends"))

from ditserve.client import DitClient, GenerationRequest  # noqa: E402
from ditserve.deployment import load_deployment  # noqa: E402
from ditserve.launcher import ServerOptions, TritonServer, free_ports  # noqa: E402
from resources import process_name, process_tree  # noqa: E402  (perf/resources.py)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of one process in MiB, from /proc/<pid>/smaps_rollup."""
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        kb[key] = int(value.split()[0])
    uss = kb["Private_Clean"] + kb["Private_Dirty"]
    return {"rss_mb": kb["Rss"] / 1024, "pss_mb": kb["Pss"] / 1024, "uss_mb": uss / 1024}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def read_stubs(server_pid: int) -> list[dict]:
    """One reading per stub process: its model (instance name without the group/index suffix)."""
    rows = []
    for pid in process_tree(server_pid):
        if pid == server_pid:
            continue
        try:
            instance = process_name(pid)
            rows.append({"pid": pid, "instance": instance, "model": instance.rsplit("_", 2)[0],
                         "cpu_s": cpu_seconds(pid), **memory_mb(pid)})
        except OSError:  # gone meanwhile
            continue
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per model: instance count and the mean of each figure."""
    out: dict[str, dict] = {}
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        out[model] = {"instances": len(mine), **{key: round(mean(r[key] for r in mine), 1)
                                                 for key in ("rss_mb", "pss_mb", "uss_mb", "cpu_s")}}
    return out


def deployment_with_capacity(source: Path, capacity: int, out: Path) -> Path:
    """A copy of the deployment file with [engine] capacity replaced."""
    text, n = re.subn(r"^capacity = \d+", f"capacity = {capacity}", source.read_text(), flags=re.M)
    if n != 1:
        raise ValueError(f"{source}: expected one `capacity = N` line in [engine], found {n}")
    out.write_text(text)
    return out


def generate_through_every_instance(server: TritonServer, task: str, capacity: int) -> None:
    """N concurrent unary and N concurrent streaming generations: each instance serves one."""
    def one(protocol: str, seed: int) -> None:
        with DitClient(server.grpc_url, protocol=protocol, task=task) as client:
            client.generate(GenerationRequest(f"in-flight {seed}", seed=seed, num_inference_steps=4))

    with ThreadPoolExecutor(2 * capacity) as pool:
        jobs = [pool.submit(one, protocol, i) for protocol in ("grpc", "grpc-stream") for i in range(capacity)]
        for job in jobs:
            job.result()


def measure(deployment: Path, capacity: int, work: Path, ready_timeout_s: float) -> dict:
    dep_file = deployment_with_capacity(deployment, capacity, work / f"capacity-{capacity}.toml")
    dep = load_deployment(dep_file)
    repo = work / f"repo-{capacity}"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(dep_file),
                    "--out", str(repo)], check=True)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                        deployment=str(dep_file)), log_path=work / f"server-{capacity}.log")
    print(f"capacity {capacity}: starting tritonserver ({2 * capacity} public-model stubs)", file=sys.stderr)
    start = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_s=ready_timeout_s, progress=True)
        ready_s = time.monotonic() - start
        print(f"\ncapacity {capacity}: READY after {ready_s:.1f} s; one generation per instance", file=sys.stderr)
        at_ready = read_stubs(server.process.pid)
        generate_through_every_instance(server, dep.task, capacity)
        after = read_stubs(server.process.pid)
    finally:
        server.stop()
    return {"capacity": capacity, "ready_s": round(ready_s, 2), "at_ready": summary(at_ready),
            "after_generation": summary(after), "stubs_at_ready": at_ready, "stubs_after_generation": after}


def print_table(result: dict) -> None:
    print(f"\ncapacity {result['capacity']}: READY {result['ready_s']} s")
    print("| model | instances | RSS MiB | PSS MiB | USS MiB | start-up CPU s | RSS after a generation |")
    print("|---|---|---|---|---|---|---|")
    for model, s in result["at_ready"].items():
        after = result["after_generation"].get(model, {}).get("rss_mb", "-")
        print(f"| {model} | {s['instances']} | {s['rss_mb']} | {s['pss_mb']} | {s['uss_mb']} | {s['cpu_s']} | {after} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", type=Path, default=ROOT / "configs" / "tiny-pixart-sigma.toml")
    parser.add_argument("--capacities", default="1,8,32", help="comma-separated dit capacities to start")
    parser.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for READY per capacity")
    parser.add_argument("--out", type=Path, help="write every reading here as JSON (after each capacity)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="inflight-") as tmp:
        for capacity in (int(c) for c in args.capacities.split(",")):
            try:
                results.append(measure(args.deployment.resolve(), capacity, Path(tmp), args.ready_timeout))
                print_table(results[-1])
            except (RuntimeError, TimeoutError) as exc:   # record it and go on with the next capacity
                failed = True
                results.append({"capacity": capacity, "error": str(exc)})
                print(f"\ncapacity {capacity}: FAILED: {exc}", file=sys.stderr)
            if args.out:
                args.out.write_text(json.dumps({"deployment": str(args.deployment), "results": results},
                                               indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
