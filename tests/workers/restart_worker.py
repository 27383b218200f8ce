"""A 2-epoch run (tests/reference.py's float64 model and data, Adam, fixed plan b=4 n=1,1, a checkpoint every 5
iterations) under torchrun --max-restarts: in attempt a (TORCHELASTIC_RESTART_COUNT) below ``kills``, rank a % 2
kills itself (SIGKILL) at iteration 12 + 10 a, two iterations after a checkpoint. Every process writes its pid to
<out>/pid-<attempt>-<rank> (tests/test_restarts.py checks that none outlives torchrun) and the final attempt's
rank 0 writes <out>/final.pt (the parameters, compared with the uninterrupted run)."""
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

import hpc_jabas  # noqa: E402
from hpc_jabas.runtime.hooks import Callback  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(spec["out_dir"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ.get("RANK", "0"))
(out / f"pid-{attempt}-{rank}").write_text(str(os.getpid()))


class Kill(Callback):
    def on_step_end(self, trainer, rec):
        if attempt < spec["kills"] and trainer.rank == attempt % 2 and trainer.iteration >= 12 + 10 * attempt:
            os.kill(os.getpid(), signal.SIGKILL)


cfg = hpc_jabas.JobConfig(planner="fixed", plan="b=4 n=1,1", batch=8, run_dir=str(out / "run"), backend="torch",
                          checkpoint_every=5, epochs=2, seed=0)
model = make_model()
tr = hpc_jabas.Trainer(model, make_optimizer("adam", model.parameters(), 0.01), make_data(240), nn.CrossEntropyLoss(),
                       config=cfg, callbacks=[Kill()])
tr.fit()
if tr.rank == 0:
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "final.pt")
    (out / "done").write_text(json.dumps({"attempt": attempt, "iteration": tr.iteration}))
