"""Fault injection (`[faults]` in the deployment, ditserve/faults.py): every fault ends each
affected request with exactly one error naming the stage, frees its state, leaves peers
correct and the server ready.

Unit tests first (rules, the engine's containment); then one server whose deployment
enables every fault, each selected by its own prompt marker (or image height where the
stage never sees the prompt), so one start covers them all.
"""
from __future__ import annotations

import time

import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, serve, start_server
from ditserve.cancellation import default_root as cancel_root
from ditserve.client import DitClient, GenerationRequest
from ditserve.deployment import load_deployment
from ditserve.faults import FaultInjector, FaultRule, InjectedFault, Subject, parse_rules
from ditserve.handoff import default_root as handoff_root
from helpers import StreamCall, assert_matches, delta_of, grpc_inputs, scrape, settled_scrape, wait_for_metric
from test_modes import write_deployment

# dit faults fire at step 2 or 3: a request joining a running batch takes its first step alone
# (Triton dispatches it before the peer's rescheduled request is back), so a step-1 fault
# would never hit a shared forward.
FAULTS_TOML = """
[faults]
rules = [
  { point = "encode", action = "raise", marker = "#encode-raise" },
  { point = "encode", action = "nan", marker = "#encode-nan" },
  { point = "encode", action = "sleep", marker = "#encode-sleep", seconds = 1.5 },
  { point = "denoise", action = "raise", marker = "#denoise-raise", step = 2 },
  { point = "denoise", action = "nan", marker = "#denoise-nan", step = 2 },
  { point = "denoise", action = "sleep", marker = "#denoise-sleep", seconds = 0.4 },
  { point = "denoise", action = "sleep", marker = "#slow-peer", seconds = 0.02 },
  { point = "denoise", action = "raise", height = 112 },
  { point = "scheduler_step", action = "raise", marker = "#sched-raise", step = 2 },
  { point = "scheduler_step", action = "nan", marker = "#sched-nan", step = 3 },
  { point = "decode", action = "raise", height = 48 },
  { point = "decode", action = "nan", height = 80 },
  { point = "output", action = "raise", marker = "#output-raise" },
]

# The stages warm their request paths at 48x48, the height whose decode raises: the warm-up injects
# no faults, or vae_decode would fail to load.
[accel]
warm_sizes = ["48x48"]
"""


# ---- unit: rules and the injector ------------------------------------------------------
def test_shipped_deployments_enable_no_fault():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        assert load_deployment(path).faults.rules == (), f"{path.name} must not inject faults"


@pytest.mark.parametrize("rule, words", [
    ({"point": "vae", "action": "raise"}, ["point='vae'", "decode"]),
    ({"point": "output", "action": "nan"}, ["action='nan'", "raise"]),
    ({"point": "decode", "action": "raise", "marker": "x"}, ["never sees the prompt", "height"]),
    ({"point": "denoise", "action": "sleep"}, ["seconds > 0"]),
    ({"point": "denoise", "action": "sleep", "seconds": 0.1, "seconds_per_row": -0.05}, ["neither negative"]),
    ({"point": "denoise", "action": "raise", "when": "always"}, ["unknown keys", "when"]),
])
def test_bad_rules_are_rejected_at_load(rule, words):
    with pytest.raises(ValueError) as err:
        parse_rules({"rules": [rule]})
    for word in words:
        assert word in str(err.value)


def test_a_misspelt_section_is_rejected(tmp_path):
    base = (ROOT / "configs" / "tiny-pixart-sigma.toml").read_text()
    (tmp_path / "typo.toml").write_text(base + '\n[fault]\nrules = [{ point = "denoise", action = "raise" }]\n')
    with pytest.raises(ValueError, match=r"unknown sections \['fault'\]"):
        load_deployment(tmp_path / "typo.toml")


def test_sleep_scales_with_the_selected_rows(monkeypatch):
    slept = []
    monkeypatch.setattr("ditserve.faults.time.sleep", slept.append)
    faults = FaultInjector([FaultRule("denoise", "sleep", seconds=0.015, seconds_per_row=0.021),
                            FaultRule("decode", "sleep", height=64, seconds_per_row=0.087)])
    faults.at("denoise", [Subject("a"), Subject("b"), Subject("c")])
    faults.at("decode", [Subject(height=64), Subject(height=32), Subject(height=64)])
    assert slept == [pytest.approx(0.015 + 3 * 0.021), pytest.approx(2 * 0.087)]


def test_injector_selects_by_marker_and_height_and_poisons_only_those_rows():
    faults = FaultInjector([FaultRule("denoise", "nan", marker="#bad"), FaultRule("decode", "raise", height=48)])
    rows = [Subject("ok"), Subject("a #bad one"), Subject("ok too")]
    values = faults.at("denoise", rows, torch.zeros(3, 2))
    assert torch.isnan(values[1]).all() and torch.isfinite(values[[0, 2]]).all()
    listed = faults.at("denoise", rows, [torch.zeros(2)] * 3)
    assert [bool(torch.isnan(v).any()) for v in listed] == [False, True, False]
    assert faults.at("decode", [Subject(height=64)], "untouched") == "untouched"
    with pytest.raises(InjectedFault, match="height=48"):
        faults.at("decode", [Subject(height=64), Subject(height=48)])
    unused = object()
    assert FaultInjector().at("denoise", rows, unused) is unused, "no rules: values come back as they are"


# ---- unit: the engine contains a failure to its request ----------------------------------
@pytest.fixture(scope="module")
def tiny_dit_adapter():
    from ditserve.adapters import adapter_for

    deployment = load_deployment("configs/tiny-pixart-sigma.toml")
    return adapter_for(deployment.model.family)(deployment, "dit")


def _run(engine, prompts: dict[str, str], steps: int = 3) -> dict[str, str]:
    """Admit one request per prompt (same shape: one compat group), step them all to the end."""
    from ditserve.schema import GenerationParams
    from ditserve.state import TextConditioning

    for seed, (key, prompt) in enumerate(prompts.items()):
        torch.manual_seed(seed)
        cond = TextConditioning(torch.randn(2, 300, 32), torch.ones(2, 300, dtype=torch.int64))
        engine.admit(key, GenerationParams(prompt, "", 64, 64, steps, 4.5, seed), cond)
    failed: dict[str, str] = {}
    while live := [k for k in prompts if not engine.table[k].done and k not in failed]:
        report = engine.step(live)
        failed.update(report.failed)
    return failed


@pytest.mark.parametrize("point, action, words", [
    ("denoise", "raise", ["step 2/3", "transformer forward", "InjectedFault"]),
    ("denoise", "nan", ["step 2/3", "non-finite", "transformer output", "in a forward of 3 requests"]),
    ("scheduler_step", "raise", ["step 2/3", "scheduler step", "InjectedFault", "in a forward of 3 requests"]),
    ("scheduler_step", "nan", ["step 2/3", "non-finite latents", "in a forward of 3 requests"]),
])
def test_engine_fails_only_the_poisoned_request_of_a_batch(tiny_dit_adapter, point, action, words):
    from ditserve.engine import StepEngine

    prompts = {"a": "peer one", "bad": "the #bad one", "b": "peer two"}
    clean = StepEngine(tiny_dit_adapter)
    assert _run(clean, prompts) == {}
    faulty = StepEngine(tiny_dit_adapter, FaultInjector([FaultRule(point, action, marker="#bad", step=2)]))
    failed = _run(faulty, prompts)
    assert list(failed) == ["bad"]
    for word in words:
        assert word in failed["bad"]
    # The peers shared forwards with the bad one and match the fault-free run within float noise
    # (once it is gone, or retried alone, the batch size differs: measured up to 2e-4 on CPU).
    for key in ("a", "b"):
        assert faulty.table[key].done
        torch.testing.assert_close(faulty.table[key].latents, clean.table[key].latents, rtol=0, atol=1e-3)


# ---- end to end: one server with every fault ---------------------------------------------
@pytest.fixture(scope="module")
def fault_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    deployment, repo = write_deployment(tmp, "step", 4)
    deployment.write_text(deployment.read_text() + FAULTS_TOML)
    # With the committed max_queue_delay_microseconds: 0, Triton often dispatches a sequence
    # alone while its peer's rescheduled request is not yet back in the queue, so two live
    # sequences may alternate instead of sharing a forward. A 20 ms delay, longer than the
    # peer's round trip through its public stub on a busy 2-core machine (3 ms missed it in all
    # 4 attempts in one of session 23's full runs), makes sharing likely (not certain: cases
    # that need it retry), which these tests need to prove that a fault in a shared forward
    # stays with its request.
    dit = repo / "dit" / "config.pbtxt"
    dit.write_text(dit.read_text().replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 20000"))
    yield from serve(start_server(tmp, "server", model_repository=repo, deployment=str(deployment)))


# Slowed (>= 0.8 s in dit) by a sleep rule, so each faulty request surely joins its batch.
PEER = GenerationRequest("#slow-peer a healthy peer", seed=7, num_inference_steps=40)


@pytest.fixture(scope="module")
def peer_reference(fault_server):
    with DitClient(fault_server.grpc_url, "grpc") as client:
        return client.generate(PEER).media


def _unary_outcome(server, request: GenerationRequest, timeout_us: int | None) -> tuple[str, object]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        try:
            result = client.infer("txt2img", grpc_inputs(request), timeout=timeout_us, client_timeout=120)
        except InferenceServerException as exc:
            return "error", exc.message()
    return "image", result.as_numpy("image")


# (case id, prompt, height, protocol, request timeout in us, affected requests, words in the error,
#  proof wanted that the fault hit a forward dit shared with the peer: "batch" = the error says so,
#  "retry" = the shared forward failed and was retried one request at a time)
CASES = [
    ("encode-raise", "#encode-raise a cat", 64, "stream", None, 1, ["text_encoder", "InjectedFault"], None),
    ("encode-nan", "#encode-nan a cat", 64, "unary", None, 1, ["text_encoder", "non-finite embeddings"], None),
    ("encode-sleep-timeout", "#encode-sleep a cat", 64, "unary", 500_000, 1, ["text_encoder", "timeout of 0.5 s"],
     None),
    ("denoise-raise-one-of-batch", "#denoise-raise a cat", 64, "stream", None, 1,
     ["dit", "step 2/4", "transformer forward"], "retry"),
    ("denoise-nan-one-of-batch", "#denoise-nan a cat", 64, "unary", None, 1,
     ["dit", "step 2/4", "non-finite", "transformer output"], "batch"),
    ("denoise-sleep-timeout", "#denoise-sleep a cat", 64, "stream", 600_000, 1, ["dit", "timeout of 0.6 s"], None),
    ("denoise-raise-whole-forward", "a cat", 112, "stream", None, 2, ["dit", "transformer forward", "height=112"],
     None),
    ("scheduler-raise", "#sched-raise a cat", 64, "unary", None, 1, ["dit", "step 2/4", "scheduler step"], "batch"),
    ("scheduler-nan", "#sched-nan a cat", 64, "stream", None, 1, ["dit", "step 3/4", "non-finite latents"], "batch"),
    ("decode-raise", "a cat", 48, "stream", None, 1, ["vae_decode", "InjectedFault"], None),
    ("decode-nan", "a cat", 80, "unary", None, 1, ["vae_decode", "non-finite pixels"], None),
    ("output-raise", "#output-raise a cat", 64, "stream", None, 1, ["output", "final response"], None),
]
ATTEMPTS = 4   # Triton does not always put two live sequences in one forward (see fault_server)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fault_fails_only_its_requests_with_one_error_naming_the_stage(fault_server, peer_reference, case):
    shared = case[-1]
    for _ in range(ATTEMPTS if shared else 1):
        if _run_fault_case(fault_server, peer_reference, *case[1:-1], shared) or not shared:
            return
    pytest.fail(f"in {ATTEMPTS} attempts the fault never hit a forward shared with the peer")


def _run_fault_case(server, peer_reference, prompt, height, protocol, timeout_us, affected, words, shared) -> bool:
    """One faulty run beside a healthy peer; checks every invariant, returns whether the fault
    hit a forward shared with the peer."""
    before = scrape(server.metrics_url)
    peer = StreamCall(server.grpc_url, PEER).start()
    peer.wait_progress(1)   # the faulty requests arrive while the peer is mid-loop
    faulty = [GenerationRequest(prompt, seed=i, num_inference_steps=4, height=height) for i in range(affected)]
    if protocol == "stream":
        calls = [StreamCall(server.grpc_url, r, timeout_us=timeout_us).start() for r in faulty]
        outcomes = [call.outcome() for call in calls]
    else:
        outcomes = [_unary_outcome(server, r, timeout_us) for r in faulty]
    for kind, message in outcomes:
        assert kind == "error", "a faulty request must not return an image"
        for word in words:
            assert word in message, message
    kind, image = peer.outcome()
    assert kind == "image", image
    assert_matches(image, peer_reference)

    assert wait_for_metric(server.metrics_url, "ditserve_state_table_size", "dit", 0.0) == 0.0, "state released"
    model = "txt2img_stream" if protocol == "stream" else "txt2img"
    after = scrape(server.metrics_url)
    delta = delta_of(before, after, model)
    assert delta("ditserve_requests_failed_total") == affected, "exactly one failure per affected request"
    assert delta("ditserve_requests_completed_total", "txt2img_stream") == 1, "the peer, and only the peer"
    assert delta("ditserve_requests_completed_total", "txt2img") == 0
    assert not list(cancel_root(server.process.pid).glob("*")), "no cancellation flag left behind"
    assert not list(handoff_root(server.process.pid).glob("*")), "no handed-over conditioning left behind"
    assert not list(handoff_root(server.process.pid, kind="incoming").glob("*")), "no arrival announcement left"
    with grpcclient.InferenceServerClient(server.grpc_url) as health:
        assert health.is_server_ready() and all(health.is_model_ready(m) for m in
                                                  ("txt2img", "txt2img_stream", "text_encoder", "dit", "vae_decode"))
    with DitClient(server.grpc_url, "grpc") as client:   # the next request succeeds
        assert client.generate(GenerationRequest("next", seed=1, num_inference_steps=2)).media.shape == (64, 64, 3)
    if shared == "batch":
        return all("in a forward of 2 requests" in message for _, message in outcomes)
    if shared == "retry":
        return delta("ditserve_step_isolation_retries_total", "dit") >= 1
    return True


def test_no_decode_runs_for_a_request_that_failed_in_dit(fault_server):
    before = settled_scrape(fault_server.metrics_url)   # the previous test's decodes are counted by now
    kind, _ = _unary_outcome(fault_server, GenerationRequest("#sched-nan x", seed=1, num_inference_steps=3), None)
    assert kind == "error"
    after = scrape(fault_server.metrics_url)
    assert after[("nv_inference_count", "vae_decode")] == before[("nv_inference_count", "vae_decode")]
    assert after.get(("nv_inference_request_failure", "vae_decode"), 0) == \
        before.get(("nv_inference_request_failure", "vae_decode"), 0)


def test_a_generation_is_announced_to_dit_while_it_is_encoded(fault_server):
    """The public model announces a generation before its encode (dit may hold a step for it:
    handoff.Arrivals) and withdraws it once the conditioning is handed over: a 1.5 s encode is
    seen announced, and nothing is left once the image is back."""
    incoming = handoff_root(fault_server.process.pid, kind="incoming")
    call = StreamCall(fault_server.grpc_url, GenerationRequest("#encode-sleep a cat", seed=2,
                                                               num_inference_steps=2)).start()
    deadline = time.monotonic() + 1.2   # inside the encode's 1.5 s sleep
    announced = []
    while not announced and time.monotonic() < deadline:
        announced = list(incoming.glob("*"))
        time.sleep(0.01)
    kind, _ = call.outcome()
    assert len(announced) == 1, "the encoding generation was not announced"
    assert kind == "image"
    assert not list(incoming.glob("*")), "the announcement outlived the hand-over"
