"""Is Python slower inside a Triton Python-backend stub than in a plain process?

    python perf/stub_probe.py --deployment configs/pixart-sigma-1024-random.toml --size 512x512 --out FILE

Why: on the H200 the served dit timed a lone 512px forward at 24-39 ms (its cost curve at load,
and the steps of lone requests), while perf/step_profile.py times the same forward at 18.5 ms in
a plain process. That forward is launch-bound (the host queues its kernels more slowly than the
GPU runs them), so anything that slows the host's Python slows it by as much.

What runs, the same code in both places, one after the other on one GPU:
  standalone   this process
  stub         `execute` of a one-model Python-backend server (launcher.TritonServer), and with
               --idle-stubs N again beside N idle stubs that hold a CUDA context each
  standalone   this process again, to bracket drift
  --busy N     this process while N other processes spin on the CPU (busy neighbours)
  --stub-runs R  R fresh servers per stub variant (one stub's speed against the next one's)
Each place measures:
  python_loop_ms   a pure-Python loop (interpreter speed)
  launch_ms        2000 tiny CUDA kernels queued by the host (launch cost; host time, synced)
  forward_ms_cfg / forward_ms_nocfg   the deployment's dit forward of one request, as the cost
                   scheduler times it (StepEngine.time_forward, CUDA events), median of --iters
  forward_ms_cfg_ipc  (stub only) the same with three metric increments after each forward, the
                   IPC round trips a served step makes besides its progress response
plus the facts that could differ: the libpython mapped, CPU affinity, nice, threads, the GIL's
switch interval, gc thresholds, torch's threads, and the environment variables that matter.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

from step_profile import timed   # perf/ is this script's own folder (and the stub adds it)

ROOT = Path(__file__).resolve().parents[1]
ENV_KEYS = ("OMP_NUM_THREADS", "LD_PRELOAD", "PYTHONMALLOC", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF",
            "CUDA_MODULE_LOADING", "MALLOC_ARENA_MAX", "PYTHONDEVMODE")


def facts() -> dict:
    """What about this process could make its Python or its kernel launches slower."""
    import torch
    with open("/proc/self/maps") as f:
        libpython = sorted({line.split()[-1] for line in f if "libpython" in line})
    with open("/proc/self/stat") as f:
        last_cpu = int(f.read().rsplit(")", 1)[1].split()[36])   # field 39, `processor`
    return {"executable": sys.executable, "libpython": libpython, "cpus": len(os.sched_getaffinity(0)),
            "last_cpu": last_cpu, "load_average": os.getloadavg(),
            "nice": os.nice(0), "threads": len(os.listdir("/proc/self/task")),
            "switch_interval_s": sys.getswitchinterval(), "gc_threshold": gc.get_threshold(),
            "torch_threads": torch.get_num_threads(), "env": {k: os.environ.get(k) for k in ENV_KEYS}}


class Probe:
    """The deployment's dit adapter and an engine with one request of each CFG setting admitted."""

    def __init__(self, deployment: str, size: str):
        import torch
        sys.path.insert(0, str(ROOT / "backends"))
        from ditserve.adapters import adapter_for
        from ditserve.deployment import load_deployment
        from ditserve.engine import StepEngine
        from ditserve.schema import GenerationParams
        self.torch = torch
        dep = load_deployment(deployment)
        self.adapter = adapter_for(dep.model.family)(dep, "dit")
        self.engine = StepEngine(self.adapter)
        height, width = (int(v) for v in size.split("x"))
        self.states = {}
        for name, guidance in (("cfg", 4.5), ("nocfg", 1.0)):
            params = GenerationParams("p", "", height, width, 1000, guidance, 0)
            self.states[name] = self.engine.admit(name, params, self.adapter.example_conditioning(params))
        self.device = self.states["cfg"].latents.device

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def launches(self) -> None:
        x = self.torch.zeros(16, device=self.device)
        self._sync()
        for _ in range(2000):
            x.add_(1)
        self._sync()

    def run(self, iters: int, between=None) -> dict:
        """Every measurement, in one place; `between` runs after each forward (stub: metric calls)."""
        def forwards(state) -> float:
            times = []
            for _ in range(iters):
                times.append(self.engine.time_forward([state]) * 1000)
                if between is not None:
                    between()
            return round(statistics.median(times), 3)
        for state in self.states.values():   # warm: first calls allocate and pick kernels
            forwards(state)
        out = {"python_loop_ms": timed(lambda: sum(i * i for i in range(200_000)), 5),
               "launch_ms": timed(self.launches, 5),
               "forward_ms_cfg": forwards(self.states["cfg"]),
               "forward_ms_nocfg": forwards(self.states["nocfg"])}
        return {**out, "facts": facts()}


MODEL_PY = '''
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        sys.path.insert(0, params["perf_dir"])
        from stub_probe import Probe
        self.probe = Probe(params["deployment"], params["size"])
        self.family = pb_utils.MetricFamily(name="stub_probe_calls_total", description="probe",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"model": "probe"})

    def execute(self, requests):
        responses = []
        for request in requests:
            iters = int(pb_utils.get_input_tensor_by_name(request, "iters").as_numpy().reshape(-1)[0])
            result = self.probe.run(iters)
            def metric_calls():
                for _ in range(3):
                    self.metric.increment(1)
            with_ipc = self.probe.run(iters, metric_calls)
            result["forward_ms_cfg_ipc"] = with_ipc["forward_ms_cfg"]
            result["forward_ms_nocfg_ipc"] = with_ipc["forward_ms_nocfg"]
            out = np.array([json.dumps(result).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("result", out)]))
        return responses

    def finalize(self):
        self.metric = None   # before its family (triton-inference-server/server#8662)
        self.family = None
'''

IDLE_PY = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.x = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.zeros([1], np.float32))]) for _ in requests]
'''

def write_model(repo: Path, name: str, code: str, io: str, instances: str, parameters: dict[str, str]) -> None:
    """One Python-backend model: `io` the input/output lines, `instances` its instance_group entry."""
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(textwrap.dedent(code))
    params = "".join(f'parameters {{ key: "{k}", value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    (model / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{io}\n'
                                        f"instance_group [ {{ {instances} }} ]\n{params}")


def in_stub(deployment: str, size: str, iters: int, idle_stubs: int, workdir: Path) -> dict:
    """The probe run by a one-model server's stub, in `execute`, beside `idle_stubs` others."""
    import numpy as np
    import tritonclient.grpc as grpc
    sys.path.insert(0, str(ROOT / "backends"))
    from ditserve.launcher import ServerOptions, TritonServer, free_ports
    repo = workdir / "repo"
    write_model(repo, "probe", MODEL_PY,
                'input [ { name: "iters", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
                'output [ { name: "result", data_type: TYPE_STRING, dims: [ 1 ] } ]', "kind: KIND_MODEL, count: 1",
                {"perf_dir": str(ROOT / "perf"), "deployment": str(Path(deployment).resolve()), "size": size})
    if idle_stubs:
        write_model(repo, "idle", IDLE_PY, 'input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                    'output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]', f"kind: KIND_CPU, count: {idle_stubs}", {})
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(ServerOptions(model_repository=repo, http_port=http_port, grpc_port=grpc_port,
                                        metrics_port=metrics_port), log_path=workdir / "server.log")
    with server:   # __enter__ starts it
        server.wait_ready(timeout_s=600, progress=True)
        client = grpc.InferenceServerClient(server.grpc_url)
        value = grpc.InferInput("iters", [1], "INT32")
        value.set_data_from_numpy(np.array([iters], dtype=np.int32))
        result = client.infer("probe", [value], client_timeout=600).as_numpy("result").reshape(-1)[0]
    return json.loads(result)


@contextlib.contextmanager
def spinning(processes: int) -> Iterator[None]:
    """`processes` Python processes busy-looping on the CPU for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(1.0)   # started and spinning
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--size", default="512x512")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--idle-stubs", type=int, default=0,
                    help="also run the probe beside this many idle stubs that hold a CUDA context, as a "
                         "served deployment's other stages and public models do")
    ap.add_argument("--stub-runs", type=int, default=1,
                    help="fresh servers per stub variant: how much one server's stub differs from the next")
    ap.add_argument("--busy", default="",
                    help="comma-separated counts of processes that spin on the CPU while the standalone probe "
                         "runs again (e.g. 8,15): what busy neighbours (a served deployment's other "
                         "processes) cost a launch-bound forward")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    probe = Probe(args.deployment, args.size)
    runs = {"standalone_before": probe.run(args.iters)}
    print("[stub_probe] standalone:", json.dumps(runs["standalone_before"]), flush=True)
    places = []
    for busy in (int(n) for n in args.busy.split(",") if n):
        place = f"standalone_with_{busy}_busy"
        with spinning(busy):
            runs[place] = probe.run(args.iters)
        print(f"[stub_probe] {place}:", json.dumps(runs[place]), flush=True)
        places.append(place)
    for idle in sorted({0, args.idle_stubs}):
        for run in range(args.stub_runs):
            place = f"stub_with_{idle}_idle_stubs" + (f"_run{run + 1}" if args.stub_runs > 1 else "")
            runs[place] = in_stub(args.deployment, args.size, args.iters, idle,
                                  Path(tempfile.mkdtemp(prefix="stub_probe.")))
            print(f"[stub_probe] {place}:", json.dumps(runs[place]), flush=True)
            places.append(place)
    runs["standalone_after"] = probe.run(args.iters)
    print("[stub_probe] standalone again:", json.dumps(runs["standalone_after"]), flush=True)
    ratios = {}
    for place in places:   # against the mean of the two standalone runs that bracket them
        ratios[place] = {k: round(v / statistics.mean([runs["standalone_before"][k], runs["standalone_after"][k]]), 3)
                         for k, v in runs[place].items() if "_ms" in k and k in runs["standalone_before"]}
    report = {"command": " ".join(sys.argv), "size": args.size, "deployment": args.deployment,
              "over_standalone": ratios, "runs": runs}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("[stub_probe] over standalone:", json.dumps(ratios), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
