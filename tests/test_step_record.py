"""The loop's contract, typed (issue 59, items 1-2): the StepRecord the Trainer hands on (runtime/record.py), the
Controller protocol with every method the Trainer calls (a user's controller without them keeps working), and B
stored once, in the plan (Decision.B and TrainState.B read it; the checkpoint still writes and reads "B")."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.runtime.hooks import Controller, ControllerCore, with_defaults
from hpc_jabas.runtime.persist.state import TrainState
from hpc_jabas.runtime.record import StepRecord

ROOT = Path(__file__).resolve().parents[1]
#: the keys of the plain dict that train_step returned before the StepRecord (lr_warmup and stats when set)
OLD_KEYS = ["it", "epoch", "rank", "B", "samples", "plan", "b", "x", "n_local", "compute_s", "real_compute_s",
            "emulation_wait_s", "wait_s", "iter_s", "loss_sum", "loss_weight", "lr_scale", "measure", "skipped",
            "slowdown", "contained_errors"]


def _rec(**kw) -> StepRecord:
    base = dict(it=7, epoch=1, rank=0, B=24, samples=24, plan="b=4 n=3,3", b=4, x=12, n_local=3, compute_s=0.5,
                real_compute_s=0.25, emulation_wait_s=0.25, wait_s=0.125, iter_s=0.75, loss_sum=6.0,
                loss_weight=12.0, lr_scale=1.5, measure=False, skipped=False, slowdown=1.0)
    return StepRecord(**{**base, **kw})


def test_the_record_reads_as_the_earlier_dict():
    r = _rec()
    assert sorted(r.keys()) == sorted(OLD_KEYS) and "stats" not in r and "lr_warmup" not in r
    assert r["B"] == r.B == 24 and r["loss_sum"] / r["loss_weight"] == 0.5 and r.get("stats") is None
    assert r.get("nothing", 3) == 3 and dict(r) == r.to_dict() and dict(r)["iter_s"] == 0.75
    with pytest.raises(KeyError):
        r["stats"]
    m = _rec(measure=True, stats={"similarity": 0.25}, lr_warmup=0.5)
    assert sorted(m.keys()) == sorted([*OLD_KEYS, "stats", "lr_warmup"]) and m["stats"]["similarity"] == 0.25
    assert m["lr_warmup"] * m["lr_scale"] == 0.75


class Minimal:
    """A user's controller written without subclassing Controller, and without its defaulted methods."""

    def __init__(self) -> None:
        self.steps = 0
        self.note = "mine"

    def attach(self, trainer):
        self.B0 = trainer.B

    def wants_stats(self, iteration):
        return iteration % 2 == 1

    def after_step(self, trainer, rec):
        self.steps += 1
        assert rec.B == trainer.B and rec["it"] + 1 == trainer.iteration
        return None

    def b_trajectory(self):
        return [(0, self.B0)]

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, d):
        self.steps = d["steps"]


def test_a_controller_without_the_new_methods_is_given_their_defaults():
    m = Minimal()
    assert isinstance(m, ControllerCore) and not isinstance(m, Controller)
    c = with_defaults(m)
    assert isinstance(c, Controller) and c.measures_similarity(3) is True and c.defers_stats(3) is False
    assert c.observe_held(None, _rec()) is None and c.note == "mine" and c.wants_stats(3) and not c.wants_stats(2)
    c.load_state_dict({"steps": 5})
    assert m.steps == 5 and c.state_dict() == {"steps": 5}
    full = with_defaults(c)
    assert full is c                                  # a full controller is used as it is


def test_a_minimal_controller_trains(tmp_path):
    """One rank, in process: the Trainer takes it, measures on its odd iterations and hands it each record."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = torch.nn.Linear(4, 2)
    m = Minimal()
    cfg = JobConfig(batch=8, epochs=1, checkpoint=False, run_dir=str(tmp_path / "run"))
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(), config=cfg,
                 controller=m, world=World(rank=0, size=1, gpu_types=("v100",)))
    res = tr.fit()
    assert res["iterations"] == 8 and m.steps == 8 and tr.b_trajectory() == [(0, 8)]
    assert tr.controller.inner is m and tr.controller.note == "mine"


def test_the_trainer_probes_no_controller_and_hands_on_no_dict():
    runtime = ROOT / "hpc_jabas" / "runtime"
    src = (runtime / "trainer.py").read_text()
    assert "getattr(self.controller" not in src and "rec[" not in src and "rec.get(" not in src
    for p in runtime.glob("*.py"):          # every receiver of the step's record types it as one
        assert not re.search(r"def (after_step|observe_held|on_step_end|decide|observe|add)\([^)]*rec: dict",
                             p.read_text()), p.name


def test_a_decision_stores_B_once_in_its_plan():
    plan = Plan(4, (3, 2, 1))
    d = Decision(9, 24, plan, 1.25, reason="r", stats={"s": 1})
    assert "B" not in {f.name for f in dataclasses.fields(Decision)}
    assert d.B == plan.B == 24 and Decision(9, None, plan, 1.25).B == 24
    assert d.to_dict()["B"] == 24 and Decision.from_dict(d.to_dict()) == d
    with pytest.raises(ValueError, match="B=25 differs from its plan's B=24"):
        Decision(9, 25, plan, 1.25)
    with pytest.raises(ValueError, match="B=20 differs"):
        Decision.from_dict({**d.to_dict(), "B": 20})
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.lr_scale = 2.0          # type: ignore[misc]


def test_the_state_stores_B_once_and_the_checkpoint_keeps_it():
    plan = Plan(4, (2, 2))
    st = TrainState(plan, HeterogeneousSampler(100, seed=1))
    assert "B" not in {f.name for f in dataclasses.fields(TrainState)} and st.B == 16
    st.add(Decision(0, 24, Plan(4, (3, 3)), 1.5))
    assert st.announced() == (24, Plan(4, (3, 3)), 1.5) and st.B == 16
    st.apply_due()
    assert st.B == 24 and st.lr_scale == 1.5
    sd = st.state_dict()
    assert sd["B"] == 24 and sd["plan"] == Plan(4, (3, 3)).to_dict()
    # back on another rank count: replanned from the checkpoint's B (3 ranks of b=4: 2 + 2 + 2 micro-batches)
    again = TrainState(Plan(4, (1, 1, 1)), HeterogeneousSampler(100, seed=1))
    seen = []

    def replan(B: int) -> Plan:
        seen.append(B)
        return Plan(4, (2, 2, 2))
    again.load_state_dict(sd, world=3, replan=replan)
    assert seen == [24] and again.B == 24 and again.plan == Plan(4, (2, 2, 2)) and again.lr_scale == 1.5
    same = TrainState(Plan(4, (1, 1)), HeterogeneousSampler(100, seed=1))
    same.load_state_dict(sd, world=2, replan=replan)
    assert seen == [24] and same.B == 24 and same.plan == Plan(4, (3, 3))
