"""Issue 58, finding 7: the smaller gaps, as a DDP user meets them.

* docs/training.md's TensorBoard recipe, run as written on 2 ranks under torchrun: rank 0's event file holds one
  point per iteration, each the global loss (the mean over both ranks' samples: metrics.jsonl's, and the per-rank
  sums of ``on_step_end`` records added up independently); no other rank writes one;
* the start-up log of a CPU run without ``--emulate`` names no GPU type;
* SyncBatchNorm is one line, not torch's traceback.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mpi_util import mpi_env
from support.need import need

import hpc_jabas as hj
from hpc_jabas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

def recipe() -> str:
    doc = (ROOT / "docs/training.md").read_text()
    section = doc.split("## Logging to TensorBoard or Weights & Biases", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.S)[0]


@pytest.mark.mpi
def test_the_tensorboard_recipe_logs_the_global_loss_on_rank_0(tmp_path):
    need("tensorboard")                     # set-up installs it: in CI a missing one fails
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    script = tmp_path / "tb_logging.py"
    # the recipe as written, plus a record of every rank's own loss sums (an independent reference for the global
    # loss: sum over ranks of loss_sum / sum over ranks of the samples)
    extra = ("\nclass _Own(hpc_jabas.Callback):\n"
             "    def __init__(self):\n        self.rows = []\n"
             "    def on_step_end(self, trainer, rec):\n"
             "        self.rows.append([rec['it'], rec['loss_sum'], rec['samples']])\n")
    text = recipe().replace("class TensorBoard(", extra + "\n\nclass TensorBoard(", 1)
    text = text.replace("callbacks=[tb])", "callbacks=[tb, own := _Own()])")
    text += ("import json, os\nopen(os.path.join(args.logdir, f'own{trainer.rank}.json'), 'w')"
             ".write(json.dumps(own.rows))\n")
    script.write_text(text)
    logdir, run = tmp_path / "tb", tmp_path / "run"
    logdir.mkdir()
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    p = subprocess.run([str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2", str(script),
                        "--batch", "64", "--epochs", "2", "--logdir", str(logdir), "--run-dir", str(run),
                        "--metrics-period", "3"], env=env, capture_output=True, text=True, timeout=240,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    # a CPU run without --emulate: the start-up lines name no GPU type
    starts = [ln for ln in p.stderr.splitlines() if re.search(r"rank \d/2 node=", ln)]
    assert len(starts) == 2 and all("device=cpu" in ln and "gpu=" not in ln for ln in starts), p.stderr[-3000:]
    events = list(logdir.rglob("events.out.tfevents.*"))
    assert len(events) == 1, events                               # rank 0 only
    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    logged = {e.step: e.value for e in acc.Scalars("train/loss")}
    iters = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"iteration"' in ln]
    assert sorted(logged) == [r["it"] for r in iters] == list(range(2 * 512 // 64))
    own = [json.loads((logdir / f"own{r}.json").read_text()) for r in range(2)]
    for it, value in logged.items():
        rows = [row for rank_rows in own for row in rank_rows if row[0] == it]
        assert len(rows) == 2
        reference = sum(r[1] for r in rows) / 64                  # both ranks' loss sums over the 64 samples
        assert value == pytest.approx(reference, rel=1e-5), it
    assert {e.step: e.value for e in acc.Scalars("train/batch_size")} == {it: 64.0 for it in logged}


def test_syncbatchnorm_is_one_line(tmp_path):
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)))
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    with pytest.raises(ConfigError) as e:
        hj.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, torch.nn.MSELoss(),
                   config=hj.JobConfig(batch=16, run_dir=str(tmp_path / "run")),
                   world=hj.World(rank=0, size=1, gpu_types=("v100",)))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the model has SyncBatchNorm layers (1)")
    assert "convert_sync_batchnorm" in msg and "averaged over the ranks" in msg


def test_a_cpu_world_without_emulation_names_no_gpu_type():
    cpu = hj.World(rank=0, size=2, gpu_types=("v100", "v100"), source="default", nodes=("n0", "n1"),
                   devices=("cpu", "cpu"))
    assert cpu.describe(1) == "rank 1/2 node=n1 device=cpu"
    named = hj.World(rank=0, size=1, gpu_types=("p100",), source="flag", devices=("cpu",), nodes=("n0",))
    assert named.describe() == "rank 0/1 node=n0 gpu=p100 device=cpu"        # the user named it: said
