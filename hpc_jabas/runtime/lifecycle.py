"""Epoch-end auto-scaling on Slurm: the adapter between the pure auto-scaler and the cluster.

At every epoch end (after the checkpoint) all ranks call ``EpochEndAutoscaler``; rank 0:
  1. scores the forecast it made at the previous epoch end against the B trajectory that
     happened (forecast error, into the metrics);
  2. forecasts the next epoch's B trajectory (forecast.py) from the controller's decisions;
  3. reads the cluster (cluster.py): GPU partitions, their types, free GPUs (plus the GPUs
     this job holds), billing weights;
  4. prices every candidate mix (autoscale.py) with the planner + perf model over the forecast
     trajectory, with the restart overhead measured on this chain (prior before the first);
  5. records candidates, choice and reason; on a move submits the next job onto the new mix
     (submit.py) and tells every rank to exit cleanly. The next job resumes from the checkpoint.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.slurm import chain as chainlog

DEFAULTS = {"objective": "time", "max_gpus": 8, "min_gpus": 1, "allowed": None, "max_partitions": 2,
            "margin": 0.05, "restart_prior_s": 30.0, "budget": None, "deadline_s": None, "enabled": True,
            "partition_types": None}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def expand_mix(mix: dict[str, int], types: dict[str, str]) -> list[str]:
    """Per-rank GPU types of a mix, partitions in sorted order (the order ranks get in a hetjob)."""
    return [types[p] for p in sorted(mix) for _ in range(mix[p])]


def epoch_time_fn(model, types: dict[str, str], forecast: list[int], period: int, num_samples: int,
                  cands: list[int] | None = None) -> Callable[[dict], float | None]:
    """Predicted time of one epoch on a mix: the forecast B per period of p iterations, each period's
    iterations priced by the planner's plan for that B on the mix, until the epoch's samples are used."""
    from hpc_jabas.core.planner import plan_batch

    def fn(mix):
        gl = expand_mix(mix, types)
        if not gl:
            return None
        total, left, k = 0.0, num_samples, 0
        while left > 0:
            B = forecast[min(k, len(forecast) - 1)]
            plan = plan_batch(B, gl, model, b_candidates=cands)
            T = model.iteration_time(plan, gl)
            its = min(period, math.ceil(left / plan.B))
            total += its * T
            left -= its * plan.B
            k += 1
        return total
    return fn


class EpochEndAutoscaler:
    def __init__(self, spec, submit_fn: Callable | None = None, read_cluster: Callable | None = None,
                 job_id: str | None = None):
        self.spec = spec
        cfg = dict(DEFAULTS)
        user = dict(spec.config.get("autoscale") or {})
        bad = [k for k in user if k not in DEFAULTS]
        if bad:
            raise ConfigError(f"unknown autoscale key {bad[0]!r}; valid keys: {', '.join(DEFAULTS)}")
        cfg.update(user)
        self.cfg = cfg
        self.submit_fn = submit_fn
        self.read_cluster = read_cluster
        self.job_id = job_id
        self.mix = dict(spec.mix)

    # ---- rank 0 ------------------------------------------------------------------------------
    def _decide(self, trainer, epoch: int) -> dict:
        from hpc_jabas.core import autoscale, forecast
        from hpc_jabas.core.perfmodel import job_perf_model
        cfg, jc = self.cfg, trainer.cfg
        st = trainer.lifecycle_state
        traj = list(getattr(trainer.controller, "trajectory", None) or [(0, trainer.B)])
        p = jc.p if jc.policy != "fixed" else max(1, trainer.sampler.iterations_left(trainer.B) or 1)
        rec = {"type": "autoscale", "epoch": epoch, "it": trainer.iteration, "mix": self.mix}
        # 1. forecast error of the finished epoch
        last = st.get("forecast")
        if last:
            starts = [last["start"] + k * last["p"] for k in range(len(last["B"]))]
            actual = [_B_at(traj, t) for t in starts if t < trainer.iteration]   # periods that happened
            if actual:
                rec["forecast_error"] = forecast.forecast_error(last["B"][:len(actual)], actual)
        remaining = jc.epochs - (epoch + 1)
        if remaining <= 0 or not cfg["enabled"]:
            rec.update(move=False, reason="last epoch" if remaining <= 0 else "autoscaling disabled")
            trainer.metrics.write(rec)
            return {"move": False}
        N = trainer.sampler.num_samples
        fc = forecast.forecast_next_epoch(traj, lambda B: math.ceil(N / B), period_p=p, B_min=jc.B_min,
                                          B_max=jc.B_max, start_iter=trainer.iteration)
        st["forecast"] = {"start": trainer.iteration, "p": p, "B": fc}
        rec["forecast"] = fc
        # 2. the cluster now
        view = (self.read_cluster or _read_cluster)(cfg.get("partition_types"))
        types = view.types
        free = dict(view.free)
        for part, n in self.mix.items():          # what this job holds comes back when it moves
            free[part] = free.get(part, 0) + n
        cands = autoscale.enumerate_mixes(free, types, max_gpus=cfg["max_gpus"], min_gpus=cfg["min_gpus"],
                                          allowed=cfg["allowed"], max_partitions=cfg["max_partitions"])
        model = job_perf_model(jc, types.values())
        fn = epoch_time_fn(model, types, fc, p, N, [jc.micro_batch] if jc.micro_batch else None)
        rates = view.billing if all(pt in view.billing for pt in types) else autoscale.catalog_rates(types)
        overhead = autoscale.RestartOverhead(prior_s=float(cfg["restart_prior_s"]))
        for s in st.get("restart_overheads", []):
            overhead.record(s)
        choice = autoscale.choose(self.mix, cands, fn, rates, cfg["objective"], overhead, margin=cfg["margin"],
                                  budget=cfg["budget"], deadline_s=cfg["deadline_s"], remaining_epochs=remaining)
        rec.update(move=bool(choice.move), choice=choice.mix, reason=choice.reason, table=choice.table,
                   restart_overhead_s=overhead.seconds, rates=rates)
        trainer.metrics.write(rec)
        where = f"MOVE to {choice.mix}" if choice.move else f"stay on {self.mix}"
        _log(f"hpc-jabas: epoch {epoch} end: {where}"
             f" ({choice.reason})")
        if not choice.move:
            return {"move": False}
        return {"move": True, "mix": choice.mix}

    def _act(self, trainer, d: dict) -> dict:
        """Rank 0, after the checkpoint is written: submit the next job onto the chosen mix."""
        if self.submit_fn is None:
            trainer.metrics.write({"type": "autoscale_note", "it": trainer.iteration,
                                   "note": "move chosen but no submitter here (not under Slurm): staying"})
            return {"move": False}
        t_ckpt = trainer.lifecycle_state.get("last_checkpoint_time", time.time())
        new_id = self.submit_fn(self.spec.with_mix(d["mix"]))
        chainlog.append(self.spec.chain_dir, "move", from_job=self.job_id, to_job=new_id, mix=d["mix"],
                        epoch=trainer.sampler.epoch, iteration=trainer.iteration, checkpoint_time=t_ckpt)
        return {"move": True, "mix": d["mix"], "job_id": new_id}

    # ---- every rank --------------------------------------------------------------------------
    def plan(self, trainer, epoch: int) -> dict:
        from hpc_jabas.runtime import comm
        d = None
        if trainer.rank == 0:
            try:
                d = self._decide(trainer, epoch)
            except JabasError as e:
                trainer.metrics.write({"type": "autoscale", "epoch": epoch, "it": trainer.iteration,
                                       "move": False, "error": str(e)})
                _log(f"hpc-jabas: epoch-end auto-scaling skipped: {e}")
                d = {"move": False}
        return comm.broadcast_object(d, root_rank=0, name="hj.autoscale")

    def act(self, trainer, d: dict) -> bool:
        from hpc_jabas.runtime import comm
        if not d["move"]:
            return False
        res = None
        if trainer.rank == 0:
            try:
                res = self._act(trainer, d)
            except JabasError as e:
                trainer.metrics.write({"type": "autoscale", "it": trainer.iteration, "move": False,
                                       "error": f"resubmission failed: {e}"})
                _log(f"hpc-jabas: resubmission failed, staying on this allocation: {e}")
                res = {"move": False}
        res = comm.broadcast_object(res, root_rank=0, name="hj.autoscale.act")
        if res["move"]:
            trainer.moved_to = res
        return bool(res["move"])

    def __call__(self, trainer, epoch: int) -> bool:
        return self.act(trainer, self.plan(trainer, epoch))


def _B_at(traj, it: int) -> int:
    B = traj[0][1]
    for i, b in traj:
        if i <= it:
            B = b
    return B


def _read_cluster(partition_types=None):
    from hpc_jabas.slurm.cluster import read_cluster
    return read_cluster(partition_types)
