"""Can an order that defers requests already past a latency target lower the 512px median to
0.8x without raising p99? A single-server model of dit at 512px on the H200 with the transformer
in graphs, where batching buys nothing (linear cost curve, session 40), so one request steps at a
time: 20 steps of 12 ms (the served step under load), 70 ms outside dit (encode + decode, never
queued), Poisson arrivals at `rho` of saturation. First come, first served is what `cost` does
with identical requests (fewest remaining steps first, ties by arrival) and what request batching
does; the deadline order steps, at each step: requests in dit longer than `cap` x their time alone
first (the pass-over bound), then those that can still finish dit within `target` x their time
alone (oldest first), then the rest (oldest first).

Run:  python3 deadline_order.py 40 60     # the GPU runs' trace length (40 requests), 60 traces
      python3 deadline_order.py 5000 3    # long traces (steady state)
"""
import random
import statistics
import sys

STEPS, STEP_MS, OUTSIDE_MS = 20, 12.0, 70.0


def poisson(rho: float, n: int, seed: int) -> list[float]:
    rng, clock, arrivals = random.Random(seed), 0.0, []
    for _ in range(n):
        clock += rng.expovariate(rho / (STEPS * STEP_MS))
        arrivals.append(clock)
    return arrivals


def latencies(arrivals: list[float], target: float | None = None, cap: float | None = None) -> list[float]:
    """Per request, arrival to image (ms); FCFS when `target` is None."""
    alone = STEPS * STEP_MS
    left, done, i, now = {}, {}, 0, 0.0

    def rank(j: int) -> tuple:
        if target is None:
            return (1, arrivals[j])
        age = now - arrivals[j]
        if age > cap * alone:
            return (0, arrivals[j])
        return (1 if age + left[j] * STEP_MS <= target * alone else 2, arrivals[j])

    while len(done) < len(arrivals):
        while i < len(arrivals) and arrivals[i] <= now:
            left[i], i = STEPS, i + 1
        if not left:
            now = arrivals[i]
            continue
        j = min(left, key=rank)
        now += STEP_MS
        left[j] -= 1
        if left[j] == 0:
            del left[j]
            done[j] = now - arrivals[j] + OUTSIDE_MS
    return [done[j] for j in range(len(arrivals))]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main(n: int, traces: int) -> None:
    print(f"{n} requests per trace, {traces} traces; ratios deadline order / FCFS, median over traces "
          f"(p99's worst trace in brackets)")
    print("| load | target x alone | cap x alone | p50 | p99 (worst) | mean |")
    print("|---|---|---|---|---|---|")
    for rho in (0.5, 0.8, 0.95):
        for target in (1.25, 1.5, 2.0, 3.0):
            for cap in (3, 5, 8, 12, 20):
                p50, p99, mean = [], [], []
                for seed in range(traces):
                    arrivals = poisson(rho, n, seed)
                    fcfs, deadline = latencies(arrivals), latencies(arrivals, target, cap)
                    p50.append(quantile(deadline, 0.5) / quantile(fcfs, 0.5))
                    p99.append(quantile(deadline, 0.99) / quantile(fcfs, 0.99))
                    mean.append(statistics.mean(deadline) / statistics.mean(fcfs))
                print(f"| {rho} | {target} | {cap} | {statistics.median(p50):.2f}x | "
                      f"{statistics.median(p99):.2f}x ({max(p99):.2f}) | {statistics.median(mean):.2f}x |")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
