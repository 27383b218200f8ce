"""A small real fake of the trainer for unit tests of controllers, hooks and callbacks: every attribute of
hpc_jabas.runtime.hooks.TrainerView, no Horovod. tests/test_trainer_view.py checks that it and the real
Trainer both have them all."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_jabas.core.adaptive.decision import Decision, MoveDecision
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.planning.plan import Plan
from hpc_jabas.core.planning.planner import PlanSpec, make_planner
from hpc_jabas.core.planning.sampler import HeterogeneousSampler


class Metrics:
    """metrics.jsonl kept in a list."""

    def __init__(self):
        self.recs: list[dict] = []

    def write(self, r: dict) -> None:
        self.recs.append(r)


class FakeTrainer:
    """One rank's view of a trainer. ``perf_model``: a callable returning the model (or None);
    ``trajectory``: what b_trajectory() returns (default: B from iteration 0)."""

    def __init__(self, cfg: JobConfig | None = None, *, rank: int = 0, gpu_types: list[str] | None = None,
                 iteration: int = 0, B: int | None = None, num_samples: int = 1000, perf_model=None,
                 trajectory: list[tuple[int, int]] | None = None, identical_b: bool = True,
                 declared_speed_factors: list[float] | None = None, planner_fn=None):
        self.cfg = cfg if cfg is not None else JobConfig().validate()
        self.gpu_types = list(gpu_types or ["v100"])
        self.rank, self.world = rank, len(self.gpu_types)
        self.device: Any = "cpu"
        self.iteration = iteration
        self.B = B if B is not None else self.cfg.batch
        self.planner_fn = planner_fn or (lambda B, factors: Plan(B // self.world, [1] * self.world))
        self.planner = make_planner(PlanSpec.from_config(self.cfg), self.gpu_types, self.perf_model,
                                    plan_fn=self.planner_fn, identical_b=identical_b,
                                    speed_factors=declared_speed_factors)
        self.plan: Plan = self.planner.plan(self.B, None)
        self.lr_scale = 1.0
        self.sampler = HeterogeneousSampler(num_samples, seed=self.cfg.seed)
        self.decision_lead = 0
        self.identical_b = identical_b
        self.declared_speed_factors = declared_speed_factors
        self.opt: Any = None
        self.controller = None
        self.epoch_end_hook = None
        self.decisions: Any = None
        self.metrics = Metrics()
        self.run_dir = Path(self.cfg.run_dir or "runs/fake")     # run_dir unset: the trainer names one
        self.resumed_from: str | None = None
        self.last_checkpoint_time: float | None = None
        self.moved_to: MoveDecision | None = None
        self.fit_epochs = self.cfg.epochs
        self.runs_progress_budget = False
        self.samples_local = 0
        self.compute_local_s = 0.0
        self._perf_model = perf_model
        self.trajectory = trajectory

    def perf_model(self) -> Any:
        return self._perf_model() if callable(self._perf_model) else self._perf_model

    def announced(self) -> tuple[int, Plan, float]:
        return self.B, self.plan, self.lr_scale

    def b_trajectory(self) -> list[tuple[int, int]]:
        return list(self.trajectory) if self.trajectory is not None else [(0, self.B)]

    def check_decision(self, d: Decision) -> None:
        return None

    def noop_decision(self, reason: str = "") -> Decision:
        return Decision.noop(self.iteration + self.decision_lead, *self.announced(), reason=reason)
