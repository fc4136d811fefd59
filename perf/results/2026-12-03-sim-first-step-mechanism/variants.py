"""First-step rule variants, as CostPolicy.choose replacements (monkeypatched; no repo edits).
All variants return the policy's plan plus a subset of the new requests; `current` adds all of them."""
import sys; sys.path.insert(0, "perf/results/2026-12-03-sim-first-step-mechanism")
from harness import sch, RULE, without  # noqa: F401


def RULE_NO_FIRST(self, candidates, model, rates=None):
    """CostPolicy.choose without `chosen.update(c.key for c in candidates if c.new)`."""
    rates = rates or {}
    need = self.needed({g: steps for g, (_, steps) in rates.items()}, model) if rates else {}
    groups = {}
    for candidate in candidates:
        groups.setdefault(candidate.group, []).append(candidate)
    chosen, urgency, plans = set(), {}, {}
    for group, members in groups.items():
        cost = lambda size, group=group: model.estimate(group, size)  # noqa: E731
        ordered = self.order(members, model)
        plans[group] = ordered[:self.slots(members, cost, need.get(group, float("inf")),
                                           rates.get(group, (0.0, 0.0))[0])]
        if cost(1) is None:
            chosen.update(c.key for c in members)
            continue
        late = [-c.waited for c in members if self.overdue(c, model)]
        urgency[group] = ((0, min(late)) if late else
                          (1, min(c.remaining for c in members) * cost(len(plans[group])),
                           -max(c.waited for c in members)))
    if urgency:
        chosen.update(c.key for c in plans[min(urgency, key=urgency.get)])
    return chosen


def plan_only(self, candidates, model, rates=None):
    """No first-step rule: a new request steps only when the policy's plan picks it."""
    return RULE_NO_FIRST(self, candidates, model, rates)


def first_steps(self, candidates, model, chosen, take):
    """Add new requests (oldest first) for which take(c, size_of_its_group_now, chosen) holds."""
    for c in sorted((c for c in candidates if c.new and c.key not in chosen), key=lambda c: -c.waited):
        size = sum(1 for o in candidates if o.group == c.group and o.key in chosen)
        if not chosen or take(c, size, chosen):
            chosen.add(c.key)
    return chosen


def marginal(model, c, size):
    """What one more row adds to the execute, in forwards of one request of its group."""
    one = model.estimate(c.group, 1)
    if one is None:
        return 0.0
    return (model.estimate(c.group, size + 1) - (model.estimate(c.group, size) if size else 0.0)) / one


def cheap(threshold=0.5):
    """V1: the first step at once only where its row is cheap: adding it costs the execute at most
    `threshold` x a forward of one (512px: ~0.1; the near-linear 1024px curve: ~0.93), or dit is idle."""
    def choose(self, candidates, model, rates=None):
        chosen = RULE_NO_FIRST(self, candidates, model, rates)
        return first_steps(self, candidates, model, chosen, lambda c, size, ch: marginal(model, c, size) <= threshold)
    choose.__name__ = f"cheap({threshold})"
    return choose


def expected_wait(model, c, candidates, chosen):
    """Seconds before `c` would reach a slot: the remaining steps of every request ahead of it (all that
    stepped already, and older new ones), each at its group's best throughput."""
    ahead = [o for o in candidates if o.key != c.key and (not o.new or o.waited > c.waited or o.key in chosen)]
    wait = 0.0
    for o in ahead:
        best = model.best_throughput(o.group)
        wait += o.remaining / best if best else 0.0
    return wait


def wait_bound(alpha=0.5, threshold=0.5):
    """V2: the first step at once where its row is cheap (V1) or the request would otherwise wait more than
    `alpha` x its own time alone in dit (total steps x a forward of one)."""
    def take(self, model, candidates):
        def ok(c, size, chosen):
            if marginal(model, c, size) <= threshold:
                return True
            one = model.estimate(c.group, 1)
            return one is None or expected_wait(model, c, candidates, chosen) > alpha * c.total * one
        return ok

    def choose(self, candidates, model, rates=None):
        chosen = RULE_NO_FIRST(self, candidates, model, rates)
        return first_steps(self, candidates, model, chosen, take(self, model, candidates))
    choose.__name__ = f"wait({alpha},{threshold})"
    return choose


def gate(alpha=1.0, threshold=0.5):
    """V3: a request not stepped yet steps this round only where its row is cheap or it would otherwise wait
    more than `alpha` x its time alone: added at once if so (V2), and also taken out of the policy's plan if
    not (the plan puts new requests beside running ones when the windowed arrival rate asks for throughput:
    at 1024px the row then costs the running request ~0.93 of a step, as the first-step rule does)."""
    def choose(self, candidates, model, rates=None):
        planned = RULE_NO_FIRST(self, candidates, model, rates)
        chosen = {c.key for c in candidates if c.key in planned and not c.new}

        def ok(c, size, ch):
            if marginal(model, c, size) <= threshold:
                return True
            one = model.estimate(c.group, 1)
            return one is None or expected_wait(model, c, candidates, ch) > alpha * c.total * one
        # planned new requests first (the plan wanted them), then the others, oldest first
        for c in sorted((c for c in candidates if c.new), key=lambda c: (c.key not in planned, -c.waited)):
            size = sum(1 for o in candidates if o.group == c.group and o.key in chosen)
            if not chosen or ok(c, size, chosen):
                chosen.add(c.key)
        return chosen
    choose.__name__ = f"gate({alpha},{threshold})"
    return choose
