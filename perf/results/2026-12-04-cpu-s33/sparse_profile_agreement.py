"""Does `cost` decide the same with its profile timed at some sizes only (linear between them) as
with every size 1..16? Real H200 at-load curves from the step servers' logs (in the recorded
control_server_logs.tgz); random ready sets drawn from the mixed trace's kinds of request.

    .venv/bin/python THIS [sizes=1,2,4,8,16] perf/results/2026-12-04-h200-s3*/*/control_server_logs.tgz
"""
import ast
import random
import re
import sys
import tarfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "backends"))
from ditserve.scheduler import Candidate, CostModel, CostPolicy, _interpolate  # noqa: E402

def curves_from(log_text):
    line = [l for l in log_text.splitlines() if "cost curve measured at load" in l][-1]
    body = line.split("(ms per forward of N requests):", 1)[1]
    out = {}
    for m in re.finditer(r"(\(\(.*?'transformer'\)): (\{[^}]*\})", body):
        out[m.group(1)] = {int(k): v / 1000 for k, v in ast.literal_eval(m.group(2)).items()}
    return out

def model(curves, sizes):
    m = CostModel()
    for g, c in curves.items():
        m.profile(g, {s: c[s] for s in sizes if s in c})
    return m


full_sizes = range(1, 17)
sparse_sizes = tuple(int(s) for s in (sys.argv.pop(1) if sys.argv[1].startswith("sizes=") else "sizes=1,2,4,8,16")[6:].split(","))
rng = random.Random(0)
def step_log(tgz):
    with tarfile.open(tgz) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("server-step-cost.log"))
        return tar.extractfile(member).read().decode(errors="replace")


for log in sys.argv[1:]:
    text = step_log(log)
    if "cost curve measured at load" not in text:
        continue
    curves = curves_from(text)
    full, sparse = model(curves, full_sizes), model(curves, sparse_sizes)
    worst = max(abs(_interpolate(sparse.profiles[g], n) / _interpolate(full.profiles[g], n) - 1)
                for g in curves for n in full_sizes)
    groups = list(curves)
    same = total = 0
    for trial in range(3000):
        n = rng.randint(2, 16)
        k = rng.randint(1, len(groups))
        pick = rng.sample(groups, k)
        cands = []
        for i in range(n):
            total_steps = rng.choice((4, 30))
            cands.append(Candidate(f"r{i}", rng.choice(pick), rng.randint(1, total_steps), total_steps, rng.uniform(0, 3)))
        rates = {g: (rng.uniform(0, 0.3), rng.uniform(0, 5)) for g in pick}
        a = CostPolicy().choose(cands, full, rates)
        b = CostPolicy().choose(cands, sparse, rates)
        same += a == b
        total += 1
    print(f"{log}: {len(groups)} groups; sparse profile off the full one by at most {100 * worst:.1f} %; "
          f"same choice in {same}/{total} ready sets ({100 * same / total:.1f} %)")
