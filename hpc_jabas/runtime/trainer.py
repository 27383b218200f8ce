"""The loop that ties the parts together on every Horovod rank.

Per iteration: the sampler hands this rank its n_i micro-batches of b samples; each runs
forward/backward (weighted by its sample count) and, when emulating, waits for its GPU type's
time; the HeterogeneousOptimizer's allreduce leaves the mean gradient of the B samples; the
optimizer steps with the current lr scale. Every p iterations the controller (rank 0 decides,
every rank applies at the announced iteration) may change B and the plan; at every epoch end
the full state is checkpointed and the epoch-end hook (auto-scaler) may end the job for a
resubmission onto another mix.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpc_jabas.core.config import JobConfig
from hpc_jabas.core.decision import Decision
from hpc_jabas.core.plan import Plan
from hpc_jabas.core.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime import checkpoint as ckpt
from hpc_jabas.runtime import comm
from hpc_jabas.runtime.emulate import Emulator, Slowdown
from hpc_jabas.runtime.optim import HeterogeneousOptimizer


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class MetricsWriter:
    """JSONL in the run directory, written by rank 0 only."""

    def __init__(self, path: Path | None):
        self.path = path
        self._f = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a", buffering=1)

    def write(self, rec: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(rec, default=float) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def tensor_fetch(dataset) -> Callable[[np.ndarray], Any]:
    """Fast path for TensorDataset-like datasets; else collate dataset[i]."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return lambda idx: tuple(t[torch.as_tensor(idx, dtype=torch.long)] for t in tensors)

    def fetch(idx):
        items = [dataset[int(i)] for i in idx]
        return torch.utils.data.default_collate(items)
    return fetch


class Trainer:
    """Heterogeneous data-parallel training with adaptive batching on Horovod.

    The user keeps model, optimizer, dataset and loss:

        trainer = Trainer(model, optimizer, dataset, nn.CrossEntropyLoss(), config=cfg)
        trainer.fit()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset, loss_fn,
                 config: JobConfig | None = None, scheduler=None, eval_fn=None,
                 forward_fn: Callable | None = None, controller=None, epoch_end_hook=None,
                 planner_fn: Callable | None = None, gpu_types: list[str] | None = None):
        self.cfg = (config or JobConfig()).validate()
        comm.init()
        self.rank, self.world = comm.rank(), comm.size()
        self.device = comm.device()
        self.model = model.to(self.device)
        self.loss_fn = loss_fn
        self.forward_fn = forward_fn or (lambda m, batch: loss_fn(m(batch[0]), batch[1]))
        self.scheduler = scheduler
        self.eval_fn = eval_fn
        self.epoch_end_hook = epoch_end_hook
        self.opt = HeterogeneousOptimizer(optimizer, model.named_parameters())
        self.dataset = dataset
        self.fetch = tensor_fetch(dataset)
        self.sampler = HeterogeneousSampler(len(dataset), seed=self.cfg.seed, tail=self.cfg.tail)
        self.run_dir = Path(self.cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl" if self.rank == 0 else None)
        self.iteration = 0
        self.lr_scale = 1.0
        self.gpu_types = gpu_types or self._gpu_types()
        self.emulator = self._emulator()
        self.planner_fn = planner_fn or self._default_planner()
        self.B = self.cfg.batch
        self.plan = self._initial_plan()
        if controller is None and (self.cfg.policy != "fixed" or self.cfg.balance != "off"):
            if self.cfg.planner == "fixed":
                raise ConfigError(f"policy={self.cfg.policy!r} / balance={self.cfg.balance!r} re-plan, which a "
                                  "fixed plan cannot follow; use planner='optimal' or 'lbbsp'")
            from hpc_jabas.runtime.controller import AdaptiveController
            controller = AdaptiveController(self.cfg)
        self.controller = controller
        if controller is not None:
            controller.attach(self)
        self._pending: list[dict] = []
        self.history: list[dict] = []        # (iteration, B, plan, lr) per iteration, this rank
        self.resumed_from: str | None = None
        self.stop_requested = False
        self.samples_local = 0
        self.compute_local_s = 0.0
        self.lifecycle_state: dict = {}      # epoch-end auto-scaler's state (forecasts, restart overheads)
        self.first_step_callbacks: list = []
        comm.broadcast_parameters(self.model.state_dict(), root_rank=0)
        # Horovod's broadcast_optimizer_state initialises an empty state with a zero-gradient
        # step, which shifts Adam's step count; a fresh optimizer is identical everywhere, so
        # only a non-empty state (a user-loaded one) is sent, as an object.
        has_state = comm.broadcast_object(bool(self.opt.optimizer.state_dict()["state"]), name="hj.optflag")
        if has_state:
            sd = comm.broadcast_object(self.opt.optimizer.state_dict() if self.rank == 0 else None, name="hj.opt")
            self.opt.optimizer.load_state_dict(sd)

    # ---- set-up helpers ----------------------------------------------------------------
    def _gpu_types(self) -> list[str]:
        cfg = self.cfg
        if cfg.gpu_types:
            from hpc_jabas.core import gpus
            types = [gpus.normalize(g) for g in cfg.gpu_types]
            if len(types) != self.world:
                raise ConfigError(f"gpu_types lists {len(types)} types but the job has {self.world} ranks; "
                                  "give one type per rank")
            return types
        from hpc_jabas.core import gpus
        from hpc_jabas.slurm import cluster
        mine = cluster.rank_gpu_type(os.environ)     # under Slurm: its partition / typed GRES
        if mine is None and torch.cuda.is_available():
            name = torch.cuda.get_device_name(self.device)      # e.g. "NVIDIA A100-SXM4-40GB"
            for cand in [name] + name.replace("-", " ").split():
                try:
                    mine = gpus.normalize(cand)
                    break
                except ConfigError:
                    continue
            if mine is None:
                _log(f"hpc-jabas: rank {self.rank}: GPU {name!r} is not in the catalog; planning it as a v100 "
                     "(set gpu_types or add it to the catalog)")
        mine = mine or "v100"
        return list(comm.allgather_object(mine, name="hj.types"))

    def _emulator(self) -> Emulator | None:
        if not self.cfg.emulate:
            return None
        speed = self.cfg.speeds[self.rank] if self.cfg.speeds else None
        sd = self.cfg.slowdown.get(self.rank)
        slow = Slowdown.parse(sd) if isinstance(sd, str) else sd
        return Emulator(self.gpu_types[self.rank], speed=speed, base_s=self.cfg.emulate_base_s,
                        per_sample_s=self.cfg.emulate_per_sample_s, slowdown=slow, rank=self.rank)

    def perf_model(self):
        """The job's perf model (built once; the planner, snapping and balancing share it)."""
        if getattr(self, "_perf_model", None) is None:
            from hpc_jabas.core.perfmodel import job_perf_model
            self._perf_model = job_perf_model(self.cfg, self.gpu_types)
        return self._perf_model

    def _default_planner(self) -> Callable[[int, list[float] | None], Plan]:
        cfg = self.cfg
        if cfg.planner == "fixed":
            fixed = Plan.parse(cfg.plan)
            return lambda B, factors=None: fixed
        if cfg.planner == "lbbsp":
            from hpc_jabas.core import gpus
            from hpc_jabas.core.plan import proportional_plan
            base = cfg.speeds or [gpus.get(g).relative_speed for g in self.gpu_types]
            b = cfg.micro_batch or 1

            def lbbsp(B, factors=None):
                sp = [s * (factors[i] if factors else 1.0) for i, s in enumerate(base)]
                return proportional_plan(B, b, sp)
            return lbbsp
        from hpc_jabas.core.planner import plan_batch
        model = self.perf_model()
        cands = [cfg.micro_batch] if cfg.micro_batch else None
        types = self.gpu_types
        return lambda B, factors=None: plan_batch(B, types, model, b_candidates=cands, speed_factors=factors)

    def _initial_plan(self) -> Plan:
        plan = self.planner_fn(self.B, None)
        if plan.world_size != self.world:
            raise ConfigError(f"plan {plan} has {plan.world_size} ranks but the job has {self.world}; "
                              "give one micro-batch count per rank")
        self.B = plan.B
        return plan

    # ---- decisions -------------------------------------------------------------------------
    def apply(self, d: Decision) -> None:
        if d.at_iteration != self.iteration:
            raise RuntimeError(f"rank {self.rank}: decision for iteration {d.at_iteration} applied at {self.iteration}")
        if d.plan.world_size != self.world:
            raise ConfigError(f"decision plan {d.plan} does not fit {self.world} ranks")
        self.B, self.plan, self.lr_scale = d.B, d.plan, d.lr_scale

    # ---- one iteration ----------------------------------------------------------------------
    def train_step(self) -> dict:
        t_it = time.perf_counter()
        measure = bool(self.controller is not None and self.controller.wants_stats(self.iteration))
        if self.sampler.epoch_done(self.plan.B):   # only when driven outside fit(): no epoch-end work
            self.sampler.new_epoch()
        ib = self.sampler.next(self.plan)
        mine = ib.micro[self.rank]
        if measure and ib.total != self.B:
            measure = False  # no statistics on the shrunk epoch tail
        self.opt.begin(len(mine), ib.total, measure=measure,
                       first_global_microbatch=ib.plan.first_microbatch(self.rank), b=ib.plan.b)
        self.model.train()
        compute = emu_wait = 0.0
        loss_sum = 0.0
        if self.emulator is not None:
            self.emulator.start()
        for idx in mine:
            t0 = time.perf_counter()
            batch = tuple(t.to(self.device, non_blocking=True) for t in self.fetch(idx))
            loss = self.forward_fn(self.model, batch)
            self.opt.backward(loss, len(idx))
            loss_sum += float(loss.detach()) * len(idx)
            t1 = time.perf_counter()
            compute += t1 - t0
            if self.emulator is not None:
                emu_wait += self.emulator.wait_next(len(idx), self.iteration)
        t_sync = time.perf_counter()
        self.samples_local += sum(len(i) for i in mine)
        self.compute_local_s += compute + emu_wait
        self.opt.step(lr_scale=self.lr_scale)
        t_end = time.perf_counter()
        rec = {"it": self.iteration, "epoch": ib.epoch, "rank": self.rank, "B": self.B, "samples": ib.total,
               "plan": str(ib.plan), "b": ib.plan.b,
               "n_local": len(mine), "compute_s": compute + emu_wait, "real_compute_s": compute,
               "emulation_wait_s": emu_wait, "wait_s": t_end - t_sync, "iter_s": t_end - t_it,
               "loss_sum": loss_sum, "lr_scale": self.lr_scale,
               "slowdown": self.emulator.factor(self.iteration) if self.emulator else 1.0}
        if measure and self.opt.last_stats is not None:
            rec["stats"] = self.opt.last_stats.to_dict()
        self.history.append({"it": self.iteration, "B": self.B, "plan": str(self.plan), "lr_scale": self.lr_scale})
        self._pending.append(rec)
        self.iteration += 1
        if self.scheduler is not None and getattr(self.scheduler, "_hj_per_iteration", False):
            self.scheduler.step()
        if self.controller is not None:
            d = self.controller.after_step(self, rec)
            if d is not None:
                self.apply(d)
        if len(self._pending) >= self.cfg.metrics_period:
            self.flush_metrics()
        return rec

    def flush_metrics(self) -> None:
        recs = comm.allgather_object(self._pending, name="hj.metrics")
        self._pending = []
        if self.rank != 0:
            return
        by_it: dict[int, list] = {}
        for rank_recs in recs:
            for r in rank_recs:
                by_it.setdefault(r["it"], []).append(r)
        for it in sorted(by_it):
            rs = sorted(by_it[it], key=lambda r: r["rank"])
            iter_s = max(r["iter_s"] for r in rs)
            out = {"type": "iteration", "it": it, "epoch": rs[0]["epoch"], "B": rs[0]["B"],
                   "samples": rs[0]["samples"], "plan": rs[0]["plan"],
                   "iter_s": iter_s, "samples_per_s": rs[0]["samples"] / iter_s if iter_s > 0 else None,
                   "lr_scale": rs[0]["lr_scale"],
                   "loss": sum(r["loss_sum"] for r in rs) / rs[0]["samples"],
                   "compute_s": [r["compute_s"] for r in rs], "wait_s": [r["wait_s"] for r in rs],
                   "n_local": [r["n_local"] for r in rs], "slowdown": [r["slowdown"] for r in rs]}
            if "stats" in rs[0]:
                out["stats"] = rs[0]["stats"]
            self.metrics.write(out)

    # ---- epochs, checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opt.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "sampler": self.sampler.state_dict(), "iteration": self.iteration, "B": self.B,
                "plan": self.plan.to_dict(), "lr_scale": self.lr_scale,
                "controller": self.controller.state_dict() if self.controller is not None else None,
                "world": self.world, "gpu_types": self.gpu_types, "lifecycle": self.lifecycle_state,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}}

    def load_state_dict(self, st: dict) -> None:
        self.model.load_state_dict(st["model"])
        self.opt.optimizer.load_state_dict(st["optimizer"])
        if self.scheduler is not None and st.get("scheduler") is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        self.sampler.load_state_dict(st["sampler"])
        self.iteration = int(st["iteration"])
        self.B = int(st["B"])
        self.lr_scale = float(st["lr_scale"])
        plan = Plan.from_dict(st["plan"])
        if plan.world_size != self.world:
            # a different allocation: same B, re-planned for the new ranks
            plan = self.planner_fn(self.B, None)
        self.plan = plan
        if self.controller is not None and st.get("controller") is not None:
            self.controller.load_state_dict(st["controller"])
        self.lifecycle_state = dict(st.get("lifecycle") or {})
        torch.set_rng_state(st["rng"]["torch"])
        np.random.set_state(st["rng"]["numpy"])
        random.setstate(st["rng"]["python"])

    def save_checkpoint(self) -> Path | None:
        """All ranks call; rank 0 writes (the state is identical on every rank)."""
        self.flush_metrics()
        path = None
        self.lifecycle_state["last_checkpoint_time"] = time.time()
        if self.rank == 0 and self.cfg.checkpoint:
            path = ckpt.save_in(self.ckpt_dir, self.state_dict(), self.sampler.epoch, self.iteration,
                                keep=self.cfg.keep_checkpoints)
        return comm.broadcast_object(str(path) if path else None, name="hj.ckpt")

    def maybe_resume(self) -> bool:
        found = ckpt.load_latest(self.ckpt_dir, log=_log) if self.rank == 0 else None
        st = comm.broadcast_object(found[0] if found else None, name="hj.resume")
        if st is None:
            return False
        self.load_state_dict(st)
        self.resumed_from = str(found[1]) if found else "broadcast"
        if self.rank == 0:
            _log(f"hpc-jabas: resumed from {self.resumed_from} at epoch {self.sampler.epoch}, "
                 f"cursor {self.sampler.cursor}, iteration {self.iteration}, B={self.B}")
            self.metrics.write({"type": "resume", "it": self.iteration, "epoch": self.sampler.epoch,
                                "cursor": self.sampler.cursor, "world": self.world, "B": self.B,
                                "plan": str(self.plan), "from": self.resumed_from})
        return True

    def fit(self, epochs: int | None = None, max_iterations: int | None = None, resume: bool = True) -> dict:
        epochs = epochs or self.cfg.epochs
        if resume:
            self.maybe_resume()
        if self.rank == 0:
            self.metrics.write({"type": "start", "world": self.world, "gpu_types": self.gpu_types, "B": self.B,
                                "plan": str(self.plan), "config": self.cfg.to_dict(), "it": self.iteration})
        t0 = time.perf_counter()
        samples = 0
        while self.sampler.epoch < epochs:
            if self.sampler.epoch_done(self.plan.B):
                if self._end_epoch():
                    break
                continue
            rec = self.train_step()
            samples += rec["samples"]
            if self.first_step_callbacks:
                cbs, self.first_step_callbacks = self.first_step_callbacks, []
                for cb in cbs:
                    cb(self)
            if max_iterations is not None and self.iteration >= max_iterations:
                break
            if self.stop_requested:
                self.save_checkpoint()
                break
        self.flush_metrics()
        wall = time.perf_counter() - t0
        return {"iterations": self.iteration, "epoch": self.sampler.epoch, "samples": samples, "wall_s": wall,
                "samples_per_s": samples / wall if wall > 0 else 0.0}

    def _end_epoch(self) -> bool:
        """Returns True when the job should stop (moved to another allocation)."""
        epoch = self.sampler.epoch
        self.sampler.new_epoch()
        if self.scheduler is not None and not getattr(self.scheduler, "_hj_per_iteration", False):
            self.scheduler.step()
        ev = self.eval_fn(self.model) if self.eval_fn is not None else None
        if self.rank == 0:
            self.metrics.write({"type": "epoch_end", "epoch": epoch, "it": self.iteration, "eval": ev, "B": self.B})
        hook = self.epoch_end_hook
        if hook is not None and hasattr(hook, "plan"):
            # two phases: decide (its state goes into the checkpoint), checkpoint, then act
            # (submit the next job only once the checkpoint it resumes from is on disk)
            d = hook.plan(self, epoch)
            self.save_checkpoint()
            return bool(hook.act(self, d))
        self.save_checkpoint()
        if hook is not None:
            return bool(hook(self, epoch))
        return False
