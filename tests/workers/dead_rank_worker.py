"""A long training run (the torch backend unless the spec names another) that checkpoints every few iterations;
each rank writes its pid to <out>/pid<rank> once training runs (tests/test_dead_rank.py kills one of them)."""
import json
import os
import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

import hpc_jabas  # noqa: E402, F401
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.hooks import Callback  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402


class Pid(Callback):
    def __init__(self, out: Path):
        self.out, self.done = out, False

    def on_step_end(self, trainer, rec):
        if not self.done and trainer.iteration >= 12:
            (self.out / f"pid{trainer.rank}").write_text(str(os.getpid()))
            self.done = True


spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(spec["out_dir"])
cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=1, run_dir=str(out / "run"),
                backend=spec.get("backend", "torch"), checkpoint_every=5, epochs=100000)
cfg.batch = 4 * len(spec["plan"].split("n=")[1].split(","))
cfg.validate()
model = make_model()
tr = Trainer(model, make_optimizer("momentum", model.parameters(), 0.05), make_data(4096), nn.CrossEntropyLoss(),
             config=cfg, callbacks=[Pid(out)])
tr.fit(max_iterations=10**7)
