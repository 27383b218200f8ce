"""Epoch-end auto-scaling on Slurm: the adapter between the pure auto-scaler and the cluster.

At every epoch end, once the epoch's checkpoint is on disk, the trainer runs this hook
(hooks.EpochEndHook) through the decision protocol: ``decide`` and ``act`` run on rank 0 only,
contained (an exception there is logged and counted, and the job stays), and every rank gets
the same MoveDecision. Rank 0:
  1. scores the forecast it made at the previous epoch end against the B trajectory that
     happened (forecast error, into the metrics);
  2. forecasts the next epoch's B trajectory (forecast.py) from the controller's decisions;
  3. reads the cluster (cluster.py): GPU partitions, their types, free GPUs (plus the GPUs
     this job holds on nodes that are not drained or down), billing weights;
  4. searches the candidate mixes (mixsearch.py: branch-and-bound, exact under the perf model's bound),
     pricing each with the planner + perf model over the forecast trajectory, with the restart
     overhead measured on this chain (prior before the first) and, when queue_aware or
     max_queue_wait_s is set, the expected queue wait that sbatch --test-only reports (slurm/queue.py);
  5. records candidates, choice and reason; on a move (``act``) submits the next job onto the new
     mix and the trainer ends this one cleanly. The next job resumes from the checkpoint.

Its state (the last forecast, the restart overheads measured on this chain) is the hook's own
(``AutoscalerState``); the trainer checkpoints it and, after ``decide``, saves it next to the
checkpoint so that the next job scores the forecast made here.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.decision import MoveDecision
from hpc_jabas.core.adaptive.policy import decision_period
from hpc_jabas.core.autoscale import forecast, mixsearch
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.overheads import OverheadMeter
from hpc_jabas.core.autoscale.scaler import epoch_time_fn, expand_mix  # noqa: F401 (pure; re-exported)
from hpc_jabas.core.config.sections import AutoscaleConfig
from hpc_jabas.core.perf.perfmodel import job_perf_model
from hpc_jabas.errors import JabasError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.calibrate import check_calibration
from hpc_jabas.runtime.hooks import EpochEndHook, TrainerView
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm.cancel import stop_cause as _cause
from hpc_jabas.slurm.cluster import available_gpus, job_nodes, read_cluster
from hpc_jabas.slurm.env import SlurmEnv

if TYPE_CHECKING:
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.slurm.cluster import ClusterView

log = get_logger(__name__)


@dataclass
class AutoscalerState:
    """What the auto-scaler carries from one epoch end (and one job) to the next."""

    forecast: dict[str, Any] | None = None           # {"start": it, "p": period, "B": [B per period]}
    restart_overheads: list[float] = field(default_factory=list)   # seconds, checkpoint -> first iteration
    overheads: dict[str, Any] = field(default_factory=dict)         # core.overheads.OverheadMeter's state

    def to_dict(self) -> dict[str, Any]:
        return {"forecast": self.forecast, "restart_overheads": list(self.restart_overheads),
                "overheads": dict(self.overheads)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AutoscalerState:
        return cls(forecast=d.get("forecast"), restart_overheads=[float(s) for s in d.get("restart_overheads", [])],
                   overheads=dict(d.get("overheads") or {}))


class EpochEndAutoscaler(EpochEndHook):
    def __init__(self, spec: JobSpec, submit_fn: Callable[[JobSpec], str] | None = None,
                 read_cluster: Callable[[dict[str, str] | None], ClusterView] | None = None,
                 job_id: str | None = None) -> None:
        self.spec = spec
        self.cfg = AutoscaleConfig.from_dict(spec.config.get("autoscale"))    # ConfigError on a bad table
        self.submit_fn = submit_fn
        self.read_cluster = read_cluster
        self.job_id = job_id
        self.mix = dict(spec.mix)
        self.state = AutoscalerState()
        self.meter = OverheadMeter()            # measurement iterations and epoch ends, as this chain ran them
        self.prices_measuring = bool(self.cfg.enabled)     # the decision prices them (EpochEndHook)
        self._last_step_end: float | None = None

    # ---- state (checkpointed by the trainer) ---------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.state.overheads = self.meter.state_dict()
        return self.state.to_dict()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.state = AutoscalerState.from_dict(d)
        self.meter = OverheadMeter()
        self.meter.load_state_dict(self.state.overheads)

    def on_step_end(self, trainer: TrainerView, rec: StepRecord) -> None:
        """Every rank, after every iteration: rank 0 meters it (its time includes waiting for the slowest)."""
        if trainer.rank == 0:
            self.meter.observe_iteration(int(rec.B), float(rec.iter_s), bool(rec.measure), rec.samples)
            self._last_step_end = time.perf_counter()

    def record_restart(self, overhead_s: float) -> None:
        """Rank 0: a measured restart overhead of this chain (checkpoint -> first iteration of the next job)."""
        self.state.restart_overheads.append(float(overhead_s))

    # ---- rank 0 ------------------------------------------------------------------------------
    def decide(self, trainer: TrainerView, epoch: int) -> MoveDecision:
        """Rank 0. Expected failures (no Slurm, an infeasible mix...) are recorded and mean "stay";
        anything else propagates to the decision protocol, which contains it."""
        try:
            return self._decide(trainer, epoch)
        except JabasError as e:
            trainer.metrics.write({"type": "autoscale", "epoch": epoch, "it": trainer.iteration,
                                   "move": False, "error": str(e)})
            log.warning("epoch-end auto-scaling skipped: %s", e)
            return MoveDecision.stay(f"skipped: {e}")

    def act(self, trainer: TrainerView, d: MoveDecision) -> MoveDecision:
        """Rank 0, after the checkpoint is written: submit the next job onto the chosen mix."""
        try:
            return self._act(trainer, d)
        except JabasError as e:
            trainer.metrics.write({"type": "autoscale", "it": trainer.iteration, "move": False,
                                   "error": f"resubmission failed: {e}"})
            log.warning("resubmission failed, staying on this allocation: %s", e)
            return MoveDecision.stay(f"resubmission failed: {e}")

    def _decide(self, trainer: TrainerView, epoch: int) -> MoveDecision:
        cfg, jc = self.cfg, trainer.cfg
        st = self.state
        traj = trainer.b_trajectory()
        p = (decision_period(jc.p, trainer.sampler.num_samples, jc.batch) if jc.policy != "fixed"
             else max(1, trainer.sampler.iterations_left(trainer.B) or 1))
        rec: dict[str, Any] = {"type": "autoscale", "epoch": epoch, "it": trainer.iteration, "mix": self.mix}
        # 1. forecast error of the finished epoch
        last = st.forecast
        if last:
            starts = [last["start"] + k * last["p"] for k in range(len(last["B"]))]
            actual = [_B_at(traj, t) for t in starts if t < trainer.iteration]   # periods that happened
            if actual:
                rec["forecast_error"] = forecast.forecast_error(last["B"][:len(actual)], actual)
        remaining = jc.epochs - (epoch + 1)
        if remaining <= 0 or not cfg.enabled:
            rec.update(move=False, reason="last epoch" if remaining <= 0 else "autoscaling disabled")
            trainer.metrics.write(rec)
            return MoveDecision.stay(rec["reason"])
        N = trainer.sampler.num_samples
        fc = forecast.forecast_next_epoch(traj, lambda B: math.ceil(N / B), period_p=p, B_min=jc.B_min,
                                          B_max=jc.B_max, start_iter=trainer.iteration)
        st.forecast = {"start": trainer.iteration, "p": p, "B": list(fc)}
        rec["forecast"] = fc
        # 2. the cluster now
        view = (self.read_cluster or _read_cluster)(cfg.partition_types)
        types = view.types
        # what this job holds comes back when it moves, but only on nodes that are not drained or down
        free = available_gpus(view, self.mix, job_nodes())
        check_calibration(jc)               # job_perf_model (pure) reads the run's calibration.json
        model = job_perf_model(jc, types.values())
        if self._last_step_end is not None:      # this epoch end so far: evaluation, checkpoint, the last safe point
            self.meter.observe_epoch_end(time.perf_counter() - self._last_step_end)
            self._last_step_end = None
        ov = self.meter.estimate()
        rec["overheads"] = {**ov.to_dict(), "compared": self.meter.compared}
        spec = trainer.planner.spec             # the job's planner, priced on every mix
        fn = epoch_time_fn(model, types, fc, p, N, B_min=jc.B_min, B_max=jc.B_max, overheads=ov, spec=spec)
        rates = view.billing if all(pt in view.billing for pt in types) else autoscale.catalog_rates(types)
        overhead = autoscale.RestartOverhead(prior_s=float(cfg.restart_prior_s))
        for s in st.restart_overheads:
            overhead.record(s)
        wait_fn = None
        if cfg.queue_aware or cfg.max_queue_wait_s is not None:     # off by default: no sbatch --test-only
            from hpc_jabas.slurm.queue import capacity, wait_estimator
            wait_fn = wait_estimator(view, self.spec)
            free = capacity(view, free)                              # busy GPUs too: the wait prices them
        unit = cfg.unit or {q: max([view.nodes[n].gpus_total for n in view.partitions[q].nodes if n in view.nodes],
                                   default=1) for q in types}       # 0: whole nodes
        bound = mixsearch.perf_bound(model, types, N, jc.B_max, every_rank_runs=spec.every_rank_runs, forecast=fc,
                                     period=p, B_min=jc.B_min, micro_batch=jc.micro_batch)
        choice = mixsearch.search(self.mix, free, types, fn, rates, cfg.objective, overhead, bound,
                        max_gpus=cfg.max_gpus, min_gpus=cfg.min_gpus, allowed=cfg.allowed,
                        max_partitions=cfg.max_partitions, unit=unit, exact_upto=cfg.exact_upto, margin=cfg.margin,
                        budget=cfg.budget, deadline_s=cfg.deadline_s, remaining_epochs=remaining, wait_fn=wait_fn,
                        max_queue_wait_s=cfg.max_queue_wait_s)
        rec.update(move=bool(choice.move), choice=choice.mix, reason=choice.reason, table=choice.table,
                   restart_overhead_s=overhead.seconds, rates=rates, free=dict(free),
                   unit=dict(unit) if isinstance(unit, dict) else unit)
        trainer.metrics.write(rec)
        where = f"MOVE to {choice.mix}" if choice.move else f"stay on {self.mix}"
        log.info("epoch %d end: %s (%s)", epoch, where, choice.reason)
        if not choice.move:
            return MoveDecision.stay(choice.reason)
        return MoveDecision(True, dict(choice.mix), choice.reason)

    def _act(self, trainer: TrainerView, d: MoveDecision) -> MoveDecision:
        if self.submit_fn is None:
            trainer.metrics.write({"type": "autoscale_note", "it": trainer.iteration,
                                   "note": "move chosen but no submitter here (not under Slurm): staying"})
            return MoveDecision.stay("no submitter here (not under Slurm)")
        assert d.mix is not None
        if (why := stop_cause(self.spec, self.job_id, under_slurm=True)) is not None:
            trainer.metrics.write({"type": "autoscale_note", "it": trainer.iteration,
                                   "note": f"move not made: the chain was cancelled ({why['by']})"})
            log.info("move to %s not made: the chain was cancelled (%s)", d.mix, why["by"])
            return MoveDecision.stay(f"chain cancelled ({why['by']})")
        t_ckpt = trainer.last_checkpoint_time if trainer.last_checkpoint_time is not None else time.time()
        new_id = self.submit_fn(self.spec.with_mix(d.mix))
        chainlog.append(self.spec.chain_dir, "move", from_job=self.job_id, to_job=new_id, mix=d.mix,
                        epoch=trainer.sampler.epoch, iteration=trainer.iteration, checkpoint_time=t_ckpt)
        return MoveDecision(True, dict(d.mix), d.reason, job_id=str(new_id))


def stop_cause(spec: JobSpec, job_id: str | None, under_slurm: bool) -> dict[str, Any] | None:
    """Rank 0, before anything that would continue the chain (a requeue after a stop, a move's successor, a
    resubmission after a failure): why the chain ends here instead, or None to go on. A ``cancel`` event in the
    chain (``hpc-jabas cancel``), or Slurm's record that a user cancelled this job (a plain ``scancel``: sacct
    CANCELLED); Slurm's preemption and time limit are not cancels (slurm/cancel.py)."""
    if job_id is None:
        return None
    here = SlurmEnv().is_job(job_id)                                   # Slurm's own job
    try:
        return _cause(spec.chain_dir, str(job_id), under_slurm=under_slurm and here)
    except JabasError as e:              # the chain record cannot be read: go on as before, and say so
        log.warning("could not tell whether the chain was cancelled: %s", e)
        return None


def _B_at(traj: list[tuple[int, int]], it: int) -> int:
    B = int(traj[0][1])
    for i, b in traj:
        if i <= it:
            B = b
    return B


def _read_cluster(partition_types: dict[str, str] | None = None) -> ClusterView:
    return read_cluster(partition_types)
