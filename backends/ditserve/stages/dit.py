"""`dit`: the denoise loop as a decoupled iterative-sequence model.

Triton's sequence batcher (`iterative_sequence: true`) hands `execute` every request
that is ready for its next step: new ones and rescheduled ones. In `step` mode each
`execute` runs one denoise step for the whole batch, sends each request the progress of
the step whose NaN/inf check just passed (mostly read one step late, so the GPU does not
wait on us; engine.py), finishes the ones that are done (final response with CPU latents) and
reschedules the rest, so requests join and leave at step boundaries. While nothing would
change the generations it holds (none done, failed, cancelled or waiting to join) it runs the
next step, the scheduler's pick among them, in the same execute, up to `[engine]
steps_per_execute`, instead of a round trip through Triton.
`serial` / `request_batch` modes run the batch start to end in one `execute` instead:
they are the controls that step batching is measured against.

Every request ends with exactly one final response: its latents, or an `error` output
(UTF-8 in UINT8; cancelled, bad state, failed step). Its state is released in the same place.
"""
from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from ..adapters import adapter_for
from ..adapters.base import instance_device
from ..cancellation import CancelRegistry
from ..engine import StepEngine
from ..faults import injector
from ..handoff import Arrivals, ConditioningStore
from ..late_queue import LateQueue
from ..schema import GenerationParams, check_params
from ..scheduler import StepScheduler
from ..scratch import sweep_dead_servers, sweep_orphan_shm_regions
from ..state import TextConditioning
from .common import (ended_if_cancelled, error_response, input_numpy, requested_outputs,
                     stage_deployment, stage_names, warm_up)
from .metrics import DitMetrics
from .specs import DIT_OUTPUT_NAMES
from .torch_io import to_pb, to_torch
from .warm_path import cost_curve_requests, warm_request_path, warm_requests

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCELLED = "cancelled by the client"
GC_EVERY_S = 1.0   # how often execute looks for abandoned states and scratch files (they live minutes)
# In step mode a live generation's request comes back at every execute (measured on CPU under 6
# concurrent streams of 3 shapes: absent from at most 1 execute in a row, while a new request
# joined). One absent from this many executes in a row and for this long has lost its request:
# Triton 2.51 drops a direct client's request that is cancelled while it waits to be rescheduled.
LOST_AFTER_EXECUTES = 50
LOST_AFTER_S = 5.0


def _progress(step: int, total: int):
    return to_pb("progress", torch.tensor([[step, total]], dtype=torch.int32))


def request_key(request) -> str:
    """The generation's identity across reschedules: the BLS request id the public model sets."""
    return request.request_id() or f"corr-{request.correlation_id()}"


class DitStage:
    def __init__(self, args: dict, model_config: dict):
        self.model_name = args["model_name"]
        self.collected_at = 0.0
        self.direct: set[str] = set()   # generations whose client called dit itself (the rest come by BLS)
        self.executes = 0
        self.present: dict[str, tuple[int, float]] = {}   # key -> (execute number, time) its request last came
        self.deployment = stage_deployment(model_config)
        capacity = model_config.get("max_batch_size", 0)
        if capacity != self.deployment.engine.capacity:
            raise ValueError(
                f"dit config.pbtxt max_batch_size={capacity} but deployment {self.deployment.source} has "
                f"[engine] capacity={self.deployment.engine.capacity}; render the repository with "
                f"`python scripts/render_repository.py --deployment {self.deployment.source}`"
            )
        adapter = adapter_for(self.deployment.model.family)(self.deployment, "dit", instance_device(args))
        self.engine = StepEngine(adapter, injector(self.deployment, "dit"))
        engine = self.deployment.engine
        self.scheduler = StepScheduler(engine.scheduler, engine.throughput_floor, engine.cost_ewma, engine.max_slowdown,
                                       engine.target_utilisation)
        self.accel_metrics = warm_up(adapter, args["model_name"])
        warm_request_path(args["model_name"], lambda: self._warm_request_path(adapter))
        if engine.scheduler == "cost":
            self._measure_cost_curve(args["model_name"], adapter)
        pipeline = stage_names(model_config).pipeline
        self.cancels = CancelRegistry(pipeline=pipeline)
        self.handoff = ConditioningStore(pipeline=pipeline)
        self.arrivals = Arrivals(pipeline=pipeline)
        for files in (self.cancels, self.handoff):   # what killed servers left (their dit never finalized)
            if swept := sweep_dead_servers(files.top.parent):
                pb_utils.Logger.log_info(f"{args['model_name']}: removed {len(swept)} scratch folder(s) of servers "
                                         f"that are gone from {files.top.parent}")
        if regions := sweep_orphan_shm_regions():
            pb_utils.Logger.log_info(f"{args['model_name']}: removed {len(regions)} Triton stub region(s) from /dev/shm "
                                     "that no process maps (left by servers that were killed)")
        self.metrics = DitMetrics(args["model_name"], uncounted=adapter.forward_calls)
        self.late_queue = LateQueue(engine.late_queue_ms / 1000, count=self.metrics.count_late_queue)

    def _warm_request_path(self, adapter) -> None:
        """Short generations through a private engine (no fault rules, nothing left in the
        served table), then the tensors of their final responses."""
        engine = StepEngine(adapter)
        for params in warm_requests(adapter):
            state = engine.admit("warm-up", params, adapter.example_conditioning(params))
            while not state.done:
                engine.step([state.key])
            engine.release(state.key)
            pb_utils.InferenceResponse([_progress(state.total_steps, state.total_steps),
                                        to_pb("latents", state.latents.float().cpu())])

    def _measure_cost_curve(self, model_name: str, adapter) -> None:
        """The `cost` scheduler's curve, timed before READY (StepScheduler.measure). A failure
        (an injected fault, say) leaves it to be learned from the served steps, as before."""
        start = time.monotonic()
        try:
            states = [adapter.prepare("cost-curve", params, adapter.example_conditioning(params))
                      for params in cost_curve_requests(adapter)]
            self.scheduler.measure(self.engine.time_forward, states, self.deployment.engine.capacity)
        except Exception as exc:  # the curve is an optimisation: serve without it
            pb_utils.Logger.log_warn(f"{model_name}: step scheduler cost curve not measured at load ({type(exc).__name__}: "
                                     f"{exc}); it is learned from the served steps instead")
            return
        pb_utils.Logger.log_info(f"{model_name}: step scheduler cost curve measured at load in "
                                 f"{time.monotonic() - start:.1f} s (ms per forward of N requests): "
                                 f"{self.scheduler.model.describe()}")

    def execute(self, requests):
        active = [(request_key(r), r) for r in requests]
        active = [(k, r) for k, r in active if not self._ended_by_client(r, k)]
        for key, request in list(active):
            if key not in self.engine:
                try:
                    self._admit(request, key)
                except Exception as exc:
                    self._end(request, key, f"could not start the request: {type(exc).__name__}: {exc}")
                    active.remove((key, request))
        if self.deployment.engine.mode == "step":
            self.executes += 1
            now = time.monotonic()
            for key, _ in active:
                self.present[key] = (self.executes, now)
            self._step_burst(list(active))
            for key, request in active:
                if key in self.engine:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        else:
            while active:
                self._step(active)
                active = [(k, r) for k, r in active if k in self.engine and not self._ended_by_client(r, k)]
        self._collect_garbage({key for key, _ in active})
        return None

    def _step_burst(self, active: list) -> None:
        """Step mode: one denoise step for the scheduler's pick, repeated (up to `[engine]
        steps_per_execute`) while the next execute would hold the same generations: each step
        that stays here saves the round trip through Triton's sequence batcher. The scheduler
        picks again before every step, from all of them, as it would in the next execute; the
        ones it passes over wait here instead of in Triton's queue. Before each step it may hold
        until shortly before the running step ends (`[engine] late_queue_ms`) and for a generation
        that is being encoded (`_hold_for_arrival`), returning if a newcomer can join the step;
        never before first steps that overtake the running step (`[engine] overtake`)."""
        for _ in range(self.deployment.engine.steps_per_execute):
            began = time.monotonic()
            if not self._may_overtake(active) and self._held(len(active)):
                return
            # The scheduler picks who steps; the rest keep their state and stay unstepped.
            chosen = self.scheduler.select([self.engine.table[key] for key, _ in active])
            if len(chosen) < len(active):
                self.metrics.scheduler_waits.increment(len(active) - len(chosen))
            apart = self.scheduler.apart([self.engine.table[key] for key in chosen])
            alone = self.engine.first_steps_alone(chosen, apart) if self.deployment.engine.overtake else []
            if alone and self.engine.can_overtake():
                # they step now, beside the running step; the others step next, behind it
                self._step([(k, r) for k, r in active if k in alone], overtake=True)
            else:
                self._step([(k, r) for k, r in active if k in chosen], apart, began)
            going_on = [(k, r) for k, r in active if k in self.engine and not self._ended_by_client(r, k)]
            if len(going_on) < len(active) or self._others_waiting(len(active)):
                return
            active = going_on

    def _may_overtake(self, active: list) -> bool:
        """Whether a newcomer's first step would overtake the running step now (`[engine] overtake`:
        it would run in a forward holding no running request, and the device is busy): a hold would
        only delay it. One that would join the running requests' forward is held as before."""
        if not (self.deployment.engine.overtake and self.engine.can_overtake()):
            return False
        states = [self.engine.table[key] for key, _ in active]
        return bool(self.engine.first_steps_alone([s.key for s in states], self.scheduler.apart(states)))

    def _held(self, stepping: int) -> bool:
        """Whether to return before the next step so that a newcomer joins it: the late queue's
        hold, then the hold for an announced arrival."""
        return (self.late_queue.hold(self.engine.device_busy, lambda: self._others_waiting(stepping), self._arriving)
                or self._hold_for_arrival(stepping))

    def _hold_for_arrival(self, stepping: int) -> bool:
        """Whether to return before queueing the next step, so that a generation on its way joins it.

        The host queues each step while the GPU still runs the one before (engine.py), so a
        newcomer handed over during step k would find step k+1 queued already and wait for both.
        While a public model has announced a generation (it is being encoded: handoff.Arrivals)
        and a slot is free, the next step is held until the conditioning arrives (True: return,
        Triton hands the request back with the others and it joins the next step) or until the
        device has run out of queued work (False: step now; the GPU idles a poll at most)."""
        if not self._slot_free():
            return False
        if not self.arrivals.hold(self.engine.device_busy, self.handoff.waiting):
            return False
        self.metrics.arrival_holds.increment(1)
        return self._others_waiting(stepping)

    def _slot_free(self) -> bool:
        return len(self.engine) < self.deployment.engine.capacity

    def _arriving(self) -> bool:
        """Whether a generation that could join the next step is on its way: announced (being
        encoded) or handed over, with a slot free for it."""
        return self._slot_free() and (self.arrivals.pending() or self.handoff.waiting())

    def _others_waiting(self, stepping: int) -> bool:
        """Whether a generation that is not in this execute could step next: one admitted earlier
        but not handed back by Triton this time, or a new one handed over while a slot is free
        (one past capacity could not join before a generation ends, which ends the burst anyway).
        A direct client's new request is not seen here: it waits at most steps_per_execute steps."""
        if len(self.engine) > stepping:
            return True
        return self._slot_free() and self.handoff.waiting()

    def _admit(self, request, key: str) -> None:
        start = time.monotonic()
        params = GenerationParams.from_json(input_numpy(request, "params").reshape(-1)[0])
        check_params(params, self.deployment)  # dit is reachable directly too: same limits as the public models
        names = ["embeds", "mask", *(name for name, _ in self.deployment.conditioning)]
        sent = {name: pb_utils.get_input_tensor_by_name(request, name) for name in names}
        if sent["embeds"] is None:  # from a public model: handed over out of band
            try:
                handover = self.handoff.take(key)
            except KeyError as exc:
                raise ValueError(f"inputs {names} are required: {exc.args[0]}") from None
            tensors = handover.tensors
            self.metrics.admission_wait_seconds.observe(start - handover.handed_at)
        else:  # a direct client: in the request, with a batch dim of 1
            missing = [name for name, tensor in sent.items() if tensor is None]
            if missing:
                raise ValueError(f"inputs {missing} are required for {self.deployment.task} (with {names[0]})")
            tensors = {name: to_torch(tensor)[0] for name, tensor in sent.items()}
            self.direct.add(key)
        extra = {name: tensors[name] for name in names[2:]}
        self.engine.admit(key, params, TextConditioning(tensors["embeds"], tensors["mask"], extra=extra))
        self.metrics.admission_seconds.observe(time.monotonic() - start)

    def _step(self, active: list, apart: Collection[str] = (), began: float | None = None,
              overtake: bool = False) -> None:
        """One denoise step for every active request (the first steps in `apart` in forwards of
        their own; with `overtake`, all of them first steps that overtake the running step:
        engine.StepEngine.overtake); finished ones get their final response. `began`: when the
        burst began on this step, holds included, so that with steps back to back the step
        duration observed is the time between them (the device's step), wherever the host waited."""
        if not active:
            return
        keys = [key for key, _ in active]
        try:
            report = self.engine.overtake(keys) if overtake else self.engine.step(keys, apart)
        except Exception as exc:  # the engine contains model failures; this is a bug: end them all
            for key, request in active:
                self._end(request, key, f"denoise step failed: {type(exc).__name__}: {exc}")
            active.clear()
            return
        self.scheduler.observe(report.timings)
        if overtake:   # beside the running step: nothing for the late queue to forecast
            self.metrics.overtakes.increment(len(keys))
            for seconds in report.overtake_seconds:
                self.metrics.overtake_forward_seconds.observe(seconds)
        elif self.late_queue.enabled:
            self.late_queue.queued(report, self.scheduler.step_seconds(report.timings))
        if report.isolation_retries or report.failed:
            self.metrics.isolation_retries.increment(report.isolation_retries)
            self.metrics.step_failures.increment(len(report.failed))
        for key, request in list(active):
            if key in report.failed:
                self._end(request, key, report.failed[key])
                active.remove((key, request))
        for size in report.batch_sizes:
            self.metrics.step_batch.observe(size)
        self.metrics.step_seconds.observe(report.seconds if began is None else time.monotonic() - began)
        self.metrics.count_forwards(self.engine.adapter.forward_calls)
        self.metrics.count_cache_hits(self.engine.adapter.cache_hits)
        self.metrics.active.set(len(active))
        for key, request in active:
            state = self.engine.table[key]
            wanted = requested_outputs(request, DIT_OUTPUT_NAMES)
            sender = request.get_response_sender()
            if key in report.confirmed and "progress" in wanted:  # a step whose check just passed
                sender.send(pb_utils.InferenceResponse([_progress(report.confirmed[key], state.total_steps)]))
            if state.done:
                latents = to_pb("latents", state.latents.float().cpu())
                self._release(key)
                progress = _progress(state.total_steps, state.total_steps)
                hits = to_pb("cache_hits", torch.tensor([[state.cache.hits if state.cache else 0]], dtype=torch.int32))
                sender.send(pb_utils.InferenceResponse([t for t in (progress, latents, hits) if t.name() in wanted]),
                            flags=FINAL)
        self.metrics.state_table.set(len(self.engine))

    def _ended_by_client(self, request, key: str) -> bool:
        """Cancelled directly (client of dit) or through the public model's flag. Only a direct
        client's request is asked: `is_cancelled()` is an IPC round trip to the server (~0.1 ms
        per request and step on the 2-core host), and Triton 2.51 cannot cancel the BLS requests
        of the public models, which is why they raise the flag instead (cancellation.py)."""
        admitted_by_bls = key in self.engine and key not in self.direct
        if (not admitted_by_bls and request.is_cancelled()) or self.cancels.is_cancelled(key):
            self._end(request, key, CANCELLED)
            return True
        return False

    def _end(self, request, key: str, error: str) -> None:
        """The one terminal response of a request that did not finish."""
        self._release(key)
        if ended_if_cancelled(request):
            return
        if "error" in requested_outputs(request, DIT_OUTPUT_NAMES):
            message = pb_utils.Tensor("error", np.frombuffer(error.encode("utf-8"), dtype=np.uint8)[None])
            response = pb_utils.InferenceResponse([message])
        else:
            response = error_response(error)
        request.get_response_sender().send(response, flags=FINAL)

    def _release(self, key: str) -> None:
        self.engine.release(key)
        self.present.pop(key, None)
        self.direct.discard(key)
        self.cancels.discard(key)
        self.metrics.state_table.set(len(self.engine))

    def _collect_garbage(self, live: set[str]) -> None:
        """At most once per GC_EVERY_S: it lists two scratch folders, and it would run at every step."""
        now = time.monotonic()
        if now - self.collected_at < GC_EVERY_S:
            return
        self.collected_at = now
        idle = self.deployment.engine.gc_idle_seconds
        lost = [key for key, (seen, at) in self.present.items() if key not in live and key in self.engine
                and self.executes - seen >= LOST_AFTER_EXECUTES and now - at >= LOST_AFTER_S]
        for key in lost:
            seen, at = self.present[key]
            pb_utils.Logger.log_warn(f"{self.model_name}: generation {key} has not come back for {now - at:.0f} s "
                                     f"({self.executes - seen} executes): its request is gone (a direct client's "
                                     "cancel that Triton dropped while it waited to be rescheduled); state freed")
        for key in lost + self.engine.collect_garbage(live, idle):
            self._release(key)   # the engine's own collection released its keys already: release is idempotent
            self.metrics.garbage.increment(1)
        self.cancels.collect_garbage(idle)
        self.handoff.collect_garbage(idle)
        self.arrivals.collect_garbage(idle)
        self.metrics.state_table.set(len(self.engine))

    def finalize(self) -> None:
        if self.scheduler.kind == "cost":   # what it learned: perf/matched_control.py copies this line into its report
            pb_utils.Logger.log_info(f"{self.model_name}: scheduler cost curves (ms per forward by requests): "
                                     f"{self.scheduler.model.describe()}")
        self.engine.table.clear()
        if self.engine.faults.shared is not None:   # a device emulated for several stages (faults `device`)
            self.engine.faults.shared.remove()
        self.cancels.remove_all()
        self.handoff.remove_all()
        self.arrivals.remove_all()
