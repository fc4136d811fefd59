"""Triton Python-based backend `diffusion`: one TritonPythonModel for every stage.

Each model in the repository picks its stage with `parameters { key: "stage" ... }`;
the work happens in `ditserve.stages.<stage>` (business logic lives in the package).
"""
import faulthandler
import json
import signal
import sys
from pathlib import Path

try:
    import ditserve  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # running from a checkout or a container copy without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ditserve.stages import stage_class
from ditserve.stages.metrics import release_all
from ditserve.stages.specs import auto_complete
from ditserve.stages.warm_path import ExecuteClock


def _stage_of(config: dict) -> str:
    stage = config.get("parameters", {}).get("stage", {}).get("string_value")
    if not stage:
        raise ValueError(f"model '{config.get('name')}': config.pbtxt needs parameters {{ key: \"stage\" ... }}")
    return stage


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        # Triton runs this in a stub of its own, before the instances' stubs: specs.py keeps it
        # from importing torch and the pipelines there.
        return auto_complete(_stage_of(auto_complete_model_config.as_dict()), auto_complete_model_config)

    def initialize(self, args):
        # A crashing stub (SIGSEGV, SIGABRT) prints its Python stacks to the server log, and
        # `kill -USR1 <stub pid>` (TritonServer.dump_stacks) does so on demand: where a stall waits.
        faulthandler.enable(all_threads=True)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        config = json.loads(args["model_config"])
        self.stage = stage_class(_stage_of(config))(args, config)
        self.clock = ExecuteClock(args["model_instance_name"])

    def execute(self, requests):
        return self.clock.run(self.stage.execute, requests)

    def finalize(self):
        self.stage.finalize()
        del self.stage       # with it, its metrics: released now, not at stub teardown
        release_all()
