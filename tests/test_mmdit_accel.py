"""[accel] with the MMDiT families (FLUX.1, SD3): the transformer compiled per row bucket and
warmed at load (ditserve/accel.py) from each family's example conditioning (its pooled CLIP
vector, FLUX.1-dev's guidance), on CPU with torch.compile's `aot_eager` backend as
tests/test_accel.py does for PixArt, and with `eager_graphs` (on a CPU its warm buckets run eager).
A warm-size request runs through the buckets and is within 1 uint8 level of eager (its one row
runs padded to a 2-row bucket).
"""
from __future__ import annotations

import pytest

from ditserve.deployment import write_variant
from ditserve.schema import GenerationParams
from helpers import assert_matches
from wan_helpers import run_steps, stage_adapters

@pytest.mark.parametrize("transformer", ["compile", "eager_graphs"])   # eager_graphs: its buckets run eager on a CPU
@pytest.mark.parametrize("config, cfg", [("configs/tiny-flux.toml", False), ("configs/tiny-sd3.toml", True)],
                         ids=["flux", "sd3"])
def test_warm_size_runs_compiled_and_equals_eager(tmp_path, config, cfg, transformer):
    accel = {"transformer": transformer, "compile_backend": "aot_eager", "warm_sizes": ["64x64"]}
    deployment = write_variant(config, tmp_path / "accel.toml", {}, "tests/test_mmdit_accel.py", accel=accel)
    compiled = stage_adapters(deployment)
    report = compiled["dit"].warm_up()
    assert len(report.variants) == 1 and report.variants[0].startswith("64x64 (8 rows")  # every row bucket
    eager = {**compiled, "dit": stage_adapters(write_variant(config, tmp_path / "eager.toml", {}, "test"),
                                               ("dit",))["dit"]}
    params = GenerationParams("a red cat", "", 64, 64, 3, 3.5, 5, cfg=cfg)
    texts = [params.negative_prompt, params.prompt] if params.do_cfg else [params.prompt]
    images = [run_steps(stages, [stages["dit"].prepare("k", params, stages["text_encoder"].encode_prompts(texts))],
                        [0])[0] for stages in (compiled, eager)]
    assert compiled["dit"].run_forward.calls == {"compiled": 3, "eager": 0}
    assert_matches(*images)  # a lone row runs padded to 2 rows: the last float bit may move
