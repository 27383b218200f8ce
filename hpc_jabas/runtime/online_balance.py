"""LB-BSP's online load balancing, run by the adaptive controller (runtime/controller.py) on its own period
``p_balance`` (docs/formulas.md, section 6).

Every rank keeps its iterations' records since the last balancing round; at the round each reports, in one small
allgather_object, its compute time per micro-batch over that window against the perf model's (``window_times``) and
its load signals (host CPU and memory utilisation via psutil; GPU utilisation, SM clock and power via NVML when a
GPU is used; the injected emulated load when emulating: runtime/telemetry.py). Rank 0 turns them into speed factors
(expected / measured time per micro-batch), predicts the next window's factors (last value: "reactive"; NARX-style
RLS: "predictive"; core/balancing/predictor.py), and asks the Rebalancer (hysteresis, oscillation damping;
core/balancing/rebalance.py) for a new plan at the same B, which the controller broadcasts as a normal Decision.
The predicted factors also go to the planner with every batch-size decision.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.balancing import RankPredictors, Rebalancer
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.hooks import TrainerView
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.runtime.telemetry import HostTelemetry

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import PerfModel


class OnlineBalance:
    """The balancing state (this rank's window, rank 0's predictors, rebalancer and predicted factors) and its round:
    ``gather`` on every rank, then on rank 0 ``update`` and, on a round without a batch-size decision,
    ``rebalance``."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.factors: list[float] | None = None
        self.predictors: RankPredictors | None = None
        self.rebalancer: Rebalancer | None = None
        self.model: PerfModel | None = None
        self._window: list[StepRecord] = []
        self._telemetry: HostTelemetry | None = None

    def attach(self, trainer: TrainerView) -> None:
        """The trainer's perf model, and predictors for its world (new ones when the world changed: a resize)."""
        self.model = trainer.perf_model()
        if self.predictors is None or self.predictors.n_ranks != trainer.world:
            self.predictors = RankPredictors(trainer.world, kind="narx" if self.cfg.balance == "predictive" else "last")
            self.rebalancer = Rebalancer(threshold=self.cfg.balance_threshold)
            self.factors = None
        if self._telemetry is None:
            self._telemetry = HostTelemetry()

    def due(self, done: int) -> bool:
        """Whether a balancing round follows ``done`` iterations (every rank alike)."""
        return done % self.cfg.p_balance == 0

    def record(self, rec: StepRecord) -> None:
        """Every rank, every iteration: its record into the window."""
        self._window.append(rec)

    def measure(self, trainer: TrainerView) -> dict[str, Any]:
        """This rank's speed factor over the window (None: nothing to compare) and its load signals; the window
        starts anew."""
        assert self.model is not None                  # attach
        gpu = trainer.gpu_types[trainer.rank]
        declared = trainer.planner.declared_factors     # factors are relative to the declared speed
        sf = declared[trainer.rank] if declared else 1.0
        meas, exp = window_times(self._window, self.model.t_micro, gpu, sf)
        self._window = []
        exo = self._telemetry.sample(trainer.device) if self._telemetry is not None else {}
        return {"factor": (exp / meas) if meas > 0 and exp > 0 else None, "exo": exo}

    def gather(self, trainer: TrainerView) -> list[dict[str, Any]]:
        """Collective (every rank, on balancing rounds): every rank's ``measure``."""
        out: list[dict[str, Any]] = comm.allgather_object(self.measure(trainer), name="hj.balance")
        return out

    def update(self, meas: list[dict[str, Any]]) -> list[float]:
        """Rank 0: the measured factors into the predictors, and the next window's predicted ones (kept as
        ``factors``); returns the measured ones."""
        assert self.predictors is not None             # attach
        factors = [m["factor"] for m in meas]
        self.predictors.update(factors, [m["exo"] for m in meas])
        self.factors = self.predictors.predict(default=1.0)
        return factors

    def rebalance(self, trainer: TrainerView, meas: list[dict[str, Any]], measured: list[float], at: int,
                  announced: tuple[int, Any, float]) -> Decision | None:
        """Rank 0, a round without a batch-size decision: the Rebalancer's plan at the announced B (None: keep it),
        and its ``balance`` record."""
        assert self.predictors is not None and self.rebalancer is not None and self.model is not None
        model, factors = self.model, self.factors
        assert factors is not None                      # update
        B_now, plan_now, lr_now = announced
        plan, info = self.rebalancer.propose(
            B_now, plan_now, factors,
            plan_fn=lambda B, f: trainer.planner.plan(B, list(f)),
            time_fn=lambda p, f: model.iteration_time(p, trainer.gpu_types, speed_factors=list(f)))
        trainer.metrics.write({"type": "balance", "it": trainer.iteration, "measured": measured,
                               "predicted": factors, "exo": [m["exo"] for m in meas],
                               "plan": str(plan or plan_now), "info": _jsonable(info),
                               **self.predictors.error_report()})
        if plan is None:
            return None
        return Decision(at, plan.B, plan, lr_now, reason=f"rebalance ({self.cfg.balance}): {info.get('reason', '')}",
                        stats={"factors": factors}, kind="rebalance")

    def write_kept(self, trainer: TrainerView, meas: list[dict[str, Any]], measured: list[float], d: Decision,
                   kept: bool) -> None:
        """Rank 0, a round with a batch-size decision ``d`` (planned with the predicted factors): its ``balance``
        record."""
        assert self.predictors is not None
        trainer.metrics.write({"type": "balance", "it": trainer.iteration, "measured": measured,
                               "predicted": self.factors, "exo": [m["exo"] for m in meas], "plan": str(d.plan),
                               "info": {"kept": kept, "reason": "planned with the batch-size decision"},
                               **self.predictors.error_report()})

    def state_dict(self) -> dict[str, Any]:
        return {"factors": self.factors,
                "predictors": self.predictors.state_dict() if self.predictors is not None else None,
                "rebalancer": self.rebalancer.state_dict() if self.rebalancer is not None else None}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Predictors saved for the same number of ranks (after attach): loaded, with the rebalancer and the factors;
        saved for another world: left new."""
        if d.get("predictors") and self.predictors is not None and self.rebalancer is not None \
                and d["predictors"].get("n_ranks") == self.predictors.n_ranks:
            self.predictors.load_state_dict(d["predictors"])
            self.rebalancer.load_state_dict(d["rebalancer"])
            self.factors = d.get("factors")


def window_times(window: list[StepRecord], t_micro: Callable[[str, int, float], float], gpu: str,
                 sf: float) -> tuple[float, float]:
    """(measured, modelled) compute seconds of this rank's iterations in ``window`` (those it computed in):
    ``t_micro(gpu, b, speed factor)`` per micro-batch, a per-rank plan's partial last one included; an
    iteration the model cannot price counts as measured."""
    meas = exp = 0.0
    for r in window:
        if r.n_local <= 0:
            continue
        meas += r.compute_s
        try:
            n, b = r.n_local, r.b
            last = r.x - (n - 1) * b                               # a per-rank plan's partial micro-batch
            exp += (n - 1) * t_micro(gpu, b, sf) + t_micro(gpu, last, sf)
        except Exception:
            exp += r.compute_s
    return meas, exp


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in info.items()}
