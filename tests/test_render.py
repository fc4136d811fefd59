"""The committed model repository is the render of the default deployment."""
from __future__ import annotations

import filecmp
import subprocess
import sys

import pytest

from conftest import ROOT


def test_committed_repository_matches_the_default_deployment(tmp_path):
    out = tmp_path / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/tiny-pixart-sigma.toml", "--out", str(out)], check=True)
    for model in ("dit", "txt2img", "txt2img_stream", "text_encoder", "vae_decode", "cancel"):
        assert filecmp.cmp(out / model / "config.pbtxt", ROOT / "model_repository" / model / "config.pbtxt",
                           shallow=False), model


def test_render_writes_capacity_into_dit_and_unary_instances(tmp_path):
    out = tmp_path / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/pixart-sigma-1024.toml", "--out", str(out)], check=True)
    dit = (out / "dit" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in dit and "max_candidate_sequences: 8" in dit
    assert "count: 8" in (out / "txt2img" / "config.pbtxt").read_text()


def test_render_gpus_places_one_device_stage_instance_per_gpu(tmp_path):
    out = tmp_path / "repo"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/pixart-sigma-1024.toml", "--gpus", "2", "--out", str(out)], check=True)
    for model in ("text_encoder", "dit", "vae_decode"):
        groups = [line for line in (out / model / "config.pbtxt").read_text().splitlines()
                  if line.startswith("instance_group")]
        assert len(groups) == 1, model
        assert "{ count: 1, kind: KIND_GPU, gpus: [0] }, { count: 1, kind: KIND_GPU, gpus: [1] }" in groups[0], model
        assert "KIND_CPU" not in groups[0], model
    dit = (out / "dit" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in dit and "max_candidate_sequences: 8" in dit  # per instance
    for model in ("txt2img", "txt2img_stream"):  # 2 GPUs x capacity 8 generations in flight
        assert "instance_group [{ count: 16, kind: KIND_CPU }]" in (out / model / "config.pbtxt").read_text()


def test_gpu_instances_load_onto_their_own_device():
    from ditserve.adapters.base import instance_device

    assert instance_device({"model_instance_kind": "GPU", "model_instance_device_id": "1"}) == "cuda:1"
    assert instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) is None


def test_render_names_public_models_for_the_task_and_adds_vae_encode_for_img2vid(tmp_path):
    for deployment, task, vae_encode in (("configs/tiny-wan-t2v.toml", "txt2vid", False),
                                         ("configs/tiny-wan-i2v.toml", "img2vid", True)):
        out = tmp_path / task
        subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", deployment,
                        "--gpus", "2", "--out", str(out)], check=True)
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["dit", "text_encoder", "vae_decode", "cancel", task, f"{task}_stream"]
            + (["vae_encode"] if vae_encode else []))
        for config in out.glob("*/config.pbtxt"):
            assert f'string_value: "{deployment}"' in config.read_text(), config   # serves its deployment
        if vae_encode:
            assert "KIND_GPU, gpus: [1]" in (out / "vae_encode" / "config.pbtxt").read_text()


def test_stages_around_dit_are_sized_from_its_capacity(tmp_path):
    """text_encoder and vae_decode batch a full dit batch in one execute, and get a second
    instance (per GPU) past 8 requests per batch, so neither queues at dit's saturation."""
    from ditserve.deployment import write_variant

    deployment = tmp_path / "big.toml"
    write_variant(ROOT / "configs" / "pixart-sigma-1024.toml", deployment, {"capacity": 16}, "tests/test_render.py")
    for gpus, group in ((0, "{ count: 2, kind: KIND_CPU }"), (2, "{ count: 2, kind: KIND_GPU, gpus: [1] }")):
        out = tmp_path / f"repo{gpus}"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                        str(deployment), "--gpus", str(gpus), "--out", str(out)], check=True)
        for model in ("text_encoder", "vae_decode"):
            config = (out / model / "config.pbtxt").read_text()
            assert "max_batch_size: 16" in config and group in config, (gpus, model)
        assert "{ count: 1, kind: KIND_GPU, gpus: [1] }" in (out / "dit" / "config.pbtxt").read_text() or not gpus
    out = tmp_path / "repo8"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                    "configs/pixart-sigma-1024.toml", "--out", str(out)], check=True)
    assert "max_batch_size: 8" in (out / "vae_decode" / "config.pbtxt").read_text()  # was 4: 2 decodes per batch
    assert "count: 1," in (out / "vae_decode" / "config.pbtxt").read_text()
    fixed = tmp_path / "one-instance.toml"
    write_variant(ROOT / "configs" / "pixart-sigma-1024.toml", fixed, {"capacity": 16, "stage_instances": 1},
                  "tests/test_render.py")
    out = tmp_path / "repo-fixed"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment", str(fixed),
                    "--gpus", "1", "--out", str(out)], check=True)
    for model in ("text_encoder", "vae_decode"):   # [engine] stage_instances overrides the count, not the batch
        config = (out / model / "config.pbtxt").read_text()
        assert "max_batch_size: 16" in config and "{ count: 1, kind: KIND_GPU, gpus: [0] }" in config, model
    with pytest.raises(ValueError, match=r"stage_instances=-1; allowed: 0 \(from capacity\)"):
        write_variant(ROOT / "configs" / "pixart-sigma-1024.toml", tmp_path / "bad.toml", {"stage_instances": -1},
                      "tests/test_render.py")


def test_in_flight_sets_the_public_instance_count_and_is_checked(tmp_path):
    """`[engine] in_flight` (default: capacity) is the public models' instance count per GPU;
    fewer than capacity would leave dit's slots unfillable, so it is refused at load."""
    from ditserve.deployment import write_variant

    deployment = tmp_path / "in-flight.toml"
    write_variant(ROOT / "configs" / "pixart-sigma-1024.toml", deployment, {"capacity": 8, "in_flight": 12},
                  "tests/test_render.py")
    for gpus, count in ((0, 12), (2, 24)):
        out = tmp_path / f"repo{gpus}"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "render_repository.py"), "--deployment",
                        str(deployment), "--gpus", str(gpus), "--out", str(out)], check=True)
        for model in ("txt2img", "txt2img_stream"):
            assert f"instance_group [{{ count: {count}, kind: KIND_CPU }}]" in (out / model / "config.pbtxt").read_text()
        assert "max_candidate_sequences: 8" in (out / "dit" / "config.pbtxt").read_text()
    with pytest.raises(ValueError, match=r"in_flight=4; allowed: 0 \(= capacity\) or an integer >= capacity \(8\)"):
        write_variant(ROOT / "configs" / "pixart-sigma-1024.toml", tmp_path / "bad.toml", {"capacity": 8, "in_flight": 4},
                      "tests/test_render.py")


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_steps_per_execute_is_checked(tmp_path, value):
    """`[engine] steps_per_execute` is a count of denoise steps per dit execute: an integer >= 1."""
    from ditserve.deployment import write_variant

    with pytest.raises(ValueError, match=r"steps_per_execute=.*; allowed: an integer >= 1"):
        write_variant(ROOT / "configs" / "tiny-pixart-sigma.toml", tmp_path / "bad.toml", {"steps_per_execute": value},
                      "tests/test_render.py")
