"""The loop that ties the parts together on every rank (Horovod or torch.distributed).

Per iteration, through the public keep-your-loop layer (runtime/loop.py, the calls a script's own loop makes):
``Jabas.draw`` hands this rank its n_i micro-batches of b samples and ``Jabas.begin`` announces them to the
HeterogeneousOptimizer; each runs forward/backward (``Jabas.backward``, weighted by its sample count) and, when
emulating, waits for its GPU type's time; the optimizer's reduction leaves the mean gradient of the B samples; it
steps with the current lr scale. What follows the step is step_end.py, an epoch's end epoch_end.py.
Every p iterations the controller (rank 0 decides,
every rank applies at the announced iteration) may change B and the plan; at every epoch end
the full state is checkpointed first, then the epoch-end hook (auto-scaler) may end the job for a
resubmission onto another mix. Every decision goes through one protocol (runtime/protocol.py):
rank 0 decides (contained: an exception there becomes a logged, counted no-op), the decision is
broadcast, every rank applies it at the iteration it names.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpc_jabas.core.adaptive.decision import Decision, MoveDecision
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import Plan, Planner
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime import data, epoch_end, parts, step_end
from hpc_jabas.runtime import safepoint as sp
from hpc_jabas.runtime.calibrate import Calibrator
from hpc_jabas.runtime.clock import IterationClock
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.controller import final_goal
from hpc_jabas.runtime.data import tensor_fetch  # noqa: F401  (re-exported)
from hpc_jabas.runtime.hooks import (
    Callback,
    Controller,
    ControllerCore,
    EpochEndHook,
    SchedulerStep,
    with_defaults,
)
from hpc_jabas.runtime.loop import Jabas, init, select_backend
from hpc_jabas.runtime.metrics import IterationMetrics
from hpc_jabas.runtime.optim import HeterogeneousOptimizer, check_model
from hpc_jabas.runtime.persist.pending import PendingDecisions
from hpc_jabas.runtime.persist.state import InState, initial_state
from hpc_jabas.runtime.progress import announce_start, default_callbacks, finished_already
from hpc_jabas.runtime.protocol import DecisionChannel
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.runtime.resume import HOOK_STATE, Checkpointer  # noqa: F401  (HOOK_STATE re-exported)
from hpc_jabas.runtime.rundir import RunDir
from hpc_jabas.runtime.step import micro_step_sums, read_sums, timed_micro_batches
from hpc_jabas.runtime.trainer_args import RankTotals, check_parts
from hpc_jabas.trust import set_trust_group

log = get_logger(__name__)


class Trainer:
    """Heterogeneous data-parallel training with adaptive batching on Horovod.

    The user keeps model, optimizer, dataset and loss:

        trainer = Trainer(model, optimizer, dataset, nn.CrossEntropyLoss(), config=cfg)
        trainer.fit()

    ``scheduler_step``: the user's lr scheduler steps once per "epoch" (default) or per "iteration".
    ``controller`` (hooks.Controller), ``epoch_end_hook`` (hooks.EpochEndHook) and ``callbacks``
    (hooks.Callback) are the extension points; ``history`` keeps the last ``history_len``
    iterations' (it, B, plan, lr_scale) of this rank. ``world`` (runtime/world.World): ranks, device and GPU
    types; by default ``World.detect`` from the config's (or ``gpu_types``') types, Slurm or the CUDA device.

    The constructor only composes the parts (docs/design.md, section 1); ``setup()`` runs the collectives,
    once, and the first ``fit`` calls it. The state in force (iteration, B, plan, lr scale, pending
    decisions, sampler) is ``state``, a TrainState (runtime/persist/state.py); ``checkpointer`` saves and resumes it.
    Every iteration is the public layer's calls, as a script's own loop makes them (``jabas``, runtime/loop.py:
    ``draw``, ``begin``, ``backward`` per micro-batch; the HeterogeneousOptimizer's ``step``).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset, loss_fn,
                 config: JobConfig | None = None, scheduler=None, eval_fn=None,
                 forward_fn: Callable | None = None, controller: ControllerCore | None = None,
                 epoch_end_hook: EpochEndHook | None = None,
                 planner_fn: Callable | None = None, gpu_types: list[str] | None = None,
                 callbacks: Sequence[Callback] = (), scheduler_step: SchedulerStep = "epoch",
                 history_len: int = 100_000, world: World | None = None):
        cfg = (config or JobConfig()).validate()
        set_trust_group(cfg.trust_group)      # group-writable checkpoints only when asked (hpc_jabas/trust.py)
        check_parts(dataset, scheduler, scheduler_step, controller, epoch_end_hook, callbacks)
        check_model(model)                    # not already in a DistributedDataParallel (runtime/comm/reducer.py)
        cfg.check_backend_keys(select_backend(cfg.backend))   # picked before any collective; a key it lacks: refused
        self.world_info = world if world is not None else World.detect(gpu_types or cfg.gpu_types, emulate=cfg.emulate)
        self.device = torch.device(self.world_info.device)       # rank, world, gpu_types: read from world_info
        self._clock = IterationClock(self.device)   # an iteration's compute and end (runtime/clock.py)
        self.feed = data.make_feed(dataset, self.rank, cfg.seed, cfg.tail)   # a Dataset or DataLoader: data.py
        self.resolved = parts.resolve(cfg, self.world_info, model, self.feed, planner_fn)   # what every part reads
        self.model = model.to(self.device)
        self.loss_fn, self.scheduler, self.scheduler_step, self.eval_fn = loss_fn, scheduler, scheduler_step, eval_fn
        self.forward_fn = forward_fn or (lambda m, batch: loss_fn(m(batch[0]), batch[1]))
        self.epoch_end_hook = epoch_end_hook
        self.opt = HeterogeneousOptimizer(optimizer, model.named_parameters(), clip_grad_norm=cfg.clip_grad_norm,
                                          amp=cfg.amp)
        self.decision_lead = self.feed.lead        # decisions announced this far ahead (setup() agrees the job's)
        self.feed.attach(lambda it: self.state.plan_at(it))
        self._open_run_dir()                       # run_dir, metrics.jsonl, the decision channel
        self._perf_model: PerfModel | None = None     # built on first use (perf_model())
        self.calib = Calibrator(self.cfg, self.gpu_types, self.rank, self.metrics)   # that model's calibration
        self.emulator = parts.emulator(self.cfg, self.gpu_types, self.rank)      # runtime/parts.py
        self.planner: Planner = parts.planner(self.resolved, self.gpu_types, self.perf_model, planner_fn)
        sampler = HeterogeneousSampler(len(self.dataset), seed=cfg.seed, tail=cfg.tail)
        self.state = initial_state(self.cfg, self.planner, sampler, self.world, self.rank)   # plan, lr scale, ...
        self.jabas = Jabas.over(self.opt, sampler, self.plan, rank=self.rank, world=self.world, model=self.model)
        self.controller: Controller | None = (with_defaults(controller) if controller is not None
                                              else parts.default_controller(self.cfg, self.planner))
        self.calib.attach(self.controller, self.planner.declared_factors, lambda: self.iteration)
        self.callbacks: list[Callback] = [*callbacks, *default_callbacks(self)]   # rank 0: tqdm bar, progress.json
        self.history: deque[dict] = deque(maxlen=history_len)   # (it, B, plan, lr_scale) per iteration, this rank
        self._start_records()
        self.checkpointer = Checkpointer.of(self)      # saves and resumes the state (runtime/resume.py)

    def _open_run_dir(self) -> None:
        """The run directory (checked, metrics.jsonl's writer: runtime/rundir.py) and the decision channel."""
        self.rundir = RunDir(self.cfg.run_dir, self.rank)
        self.run_dir, self.ckpt_dir, self.metrics = self.rundir.path, self.rundir.ckpt_dir, self.rundir.metrics
        self.iteration_metrics = IterationMetrics(self.rank, self.world, self.metrics)
        self.decisions = DecisionChannel(self.rank, self.metrics)   # rank 0 decides, every rank applies

    @property
    def cfg(self) -> JobConfig:
        """The resolved configuration (frozen: an assignment raises; runtime/resolve.py)."""
        return self.resolved.cfg

    @property
    def batch_range(self) -> dict | None:
        """The range an adaptive policy without batch_min/batch_max was given (core/adaptive/policy.py), else None."""
        return self.resolved.batch_range

    # ---- set-up helpers ----------------------------------------------------------------
    def _start_records(self) -> None:
        """What this job has done so far: nothing (a resume restores the TrainState, not these)."""
        self._set_up = False                            # setup() (collective) not run yet
        self._net: torch.nn.Module = self.model         # what forward_fn runs through (setup(): DDP's wrap on torch)
        self.stop_requested = False                     # a programmatic stop: agreed at the next safe point
        self.stop_reason: dict | None = None            # set when fit() stopped at a safe point (signal, iteration)
        self.nonfinite_loss = False                     # this rank's last loss was not finite (agreed at safe points)
        self._held_rec: StepRecord | None = None             # the record of a deferred measurement not read yet
        self._periodic = sp.PeriodicCheckpoint(self.cfg.checkpoint_every, self.cfg.checkpoint_minutes)
        self.safe_points = sp.SafePoints(interval_s=self.cfg.safe_point_s)   # the boundary agreement, overlapped
        self.totals = RankTotals()                     # this rank's samples and compute seconds in this job
        self.moved_to: MoveDecision | None = None        # set when the epoch-end hook moved the job
        self.fit_epochs = self.cfg.epochs                # the epochs fit() trains to (its argument, else the key)
        self.runs_progress_budget = True                 # goal = "final" runs here (fit(); the controller checks)

    @property
    def dataset(self) -> Any:
        """The training dataset (the feed's: a DataLoader's dataset when given one)."""
        return self.feed.dataset

    @property
    def fetch(self) -> Callable:
        """idx -> the batch of those samples (the feed's: a DataLoader's workers may have fetched it ahead)."""
        return self.feed.fetch

    # what this job has done, read from the parts that keep it
    @property
    def resumed_from(self) -> str | None:
        """The checkpoint this job resumed from (None: it started afresh)."""
        return self.checkpointer.resumed_from

    @property
    def last_checkpoint_time(self) -> float | None:
        """Wall clock of this job's last checkpoint (every rank; None: none yet)."""
        return self.checkpointer.saved_at

    @property
    def samples_local(self) -> int:
        """Samples this rank computed in this job."""
        return self.totals.samples

    @property
    def compute_local_s(self) -> float:
        """This rank's compute seconds in this job (an emulated GPU's wait included)."""
        return self.totals.compute_s

    def setup(self) -> None:
        """Collective, once (idempotent; the first ``fit``, ``maybe_resume``, ``save_checkpoint`` or
        ``train_step`` calls it): Horovod's rank and size checked against the world, the decision lead agreed
        (the largest loader lookahead of any rank), the controller attached, rank 0's parameters broadcast and
        a user-loaded optimizer state sent to every rank."""
        if self._set_up:
            return
        proc = init(self.cfg.backend)                # the backend started (the script's own init adopted)
        if (self.rank, self.world) != (proc.rank, proc.size):
            raise ConfigError(f"world= says rank {self.rank} of {self.world}; "
                              f"the {proc.backend} backend says rank {proc.rank} of {proc.size}")
        self.rundir.agree()                            # the first collective: rank 0's checks, said by every rank
        self.decision_lead = data.agreed_lead(self.feed.lead)
        if self.controller is not None:
            self.controller.attach(self)
        self.opt.broadcast_state(self.model)           # rank 0's parameters, a user-loaded optimizer state
        # the gradients' reducer: Horovod's hooks, or torch's DistributedDataParallel around the model (its forward
        # then runs through the wrapper: forward_module); checkpoints keep self.model
        self._net = self.opt.wrap(self.model, self.cfg.bucket_cap_mb, self.cfg.find_unused_parameters)
        self._set_up = True

    @property
    def forward_module(self) -> torch.nn.Module:
        """What ``forward_fn`` is given: the torch backend's DistributedDataParallel wrapper of the model (its
        ``.module`` is the model), else the model itself."""
        return self._net

    def perf_model(self) -> PerfModel:
        """The job's perf model (built once; the planner, snapping and balancing share it)."""
        if self._perf_model is None:      # the calibrated view: corrected in place on calibration rounds
            self._perf_model = self.calib.model()
        return self._perf_model

    @property
    def planner_fn(self) -> Callable[[int, list[float] | None], Plan]:
        """``planner.plan``: the plan of a global batch B (and balancing factors, or None)."""
        return self.planner.plan

    # ---- the ranks (the World, runtime/comm/world.py) --------------------------------------------
    @property
    def rank(self) -> int:
        return self.world_info.rank

    @property
    def world(self) -> int:
        """The rank count (``world_info.size``)."""
        return self.world_info.size

    @property
    def gpu_types(self) -> list[str]:
        """One GPU type per rank."""
        return list(self.world_info.gpu_types)

    # ---- the state in force (a TrainState, runtime/persist/state.py) -------------------------------
    iteration: InState[int] = InState()
    plan: InState[Plan] = InState()
    lr_scale: InState[float] = InState()

    @property
    def B(self) -> int:
        """The global batch in force: the plan's (``state.B``)."""
        return self.state.B

    @property
    def sampler(self) -> HeterogeneousSampler:
        return self.state.sampler

    @property
    def pending(self) -> PendingDecisions:
        return self.state.pending

    # ---- decisions -------------------------------------------------------------------------
    def check_decision(self, d: Decision) -> None:
        """Raises when ``d`` cannot be announced now (rank 0 checks before broadcasting; see protocol.py)."""
        first = self.iteration + self.decision_lead
        last = self.pending.latest()
        if d.at_iteration < first or (last is not None and d.at_iteration < last.at_iteration):
            raise RuntimeError(f"rank {self.rank}: decision for iteration {d.at_iteration} announced at "
                               f"{self.iteration}; it must name iteration {first} (now + the loader's lookahead) "
                               "or later")
        if d.plan.world_size != self.world:
            raise RuntimeError(f"decision plan {d.plan} does not fit {self.world} ranks")

    def noop_decision(self, reason: str = "") -> Decision:
        """Keep everything as it is (what a contained error on rank 0 broadcasts)."""
        return Decision.noop(self.iteration + self.decision_lead, *self.announced(), reason=reason)

    def announced(self) -> tuple[int, Plan, float]:
        """(B, plan, lr_scale) as announced so far: the last pending decision's, else those in force."""
        return self.state.announced()

    def apply(self, d: Decision) -> None:
        """Every rank: ``d`` is in force from ``d.at_iteration`` (now, or when the trainer gets there)."""
        self.check_decision(d)
        if d.kind == "noop":
            return
        self.feed.check_ahead(d.at_iteration)     # the loader has not read that iteration's plan yet
        self.state.add(d)
        self.state.apply_due()

    def b_trajectory(self) -> list[tuple[int, int]]:
        """(iteration, B) at every change of B (the controller's record; the start B without one)."""
        traj = self.controller.b_trajectory() if self.controller is not None else []
        return list(traj) or [(0, self.B)]

    # ---- one iteration ----------------------------------------------------------------------
    def train_step(self) -> StepRecord:
        self.setup()
        clock = self._clock                        # runtime/clock.py: CUDA events on a GPU, perf_counter on the CPU
        t_it = clock.begin()
        self.state.apply_due()
        it, plan, rank, ctl = self.iteration, self.plan, self.rank, self.controller     # (read once: descriptors)
        measure = bool(ctl is not None and ctl.wants_stats(it))
        if self.sampler.epoch_done(plan.B):        # only when driven outside fit(): no epoch-end work
            self.sampler.new_epoch()
        ib = self.jabas.draw(plan)                 # the public layer (runtime/loop.py), as a script's loop runs it
        self.feed.begin(it, ib)                    # a DataLoader: positioned here, its batches checked
        total = ib.total
        measure = measure and total == plan.B      # no statistics on the shrunk epoch tail
        # a noise-only measurement (the controller's measure_every) keeps no half-batch sum (runtime/gradstats.py);
        # goodput's measurements between decisions are read in the next iteration (no wait for their reduction)
        defer = measure and ctl is not None and bool(ctl.defers_stats(it))
        step = self.jabas.begin(ib, measure=measure, defer=defer, min_split=self.resolved.min_split,
                                similarity=not measure or ctl is None or bool(ctl.measures_similarity(it)))
        mine = step.local
        if not self.model.training:                # put back after an eval (a walk of every module: not per step)
            self.model.train()
        net, fwd, fetch, dev, jabas = self._net, self.forward_fn, self.fetch, self.device, self.jabas
        sums, emu_wait = timed_micro_batches(      # each timed as compute, then an emulated GPU's wait (step.py)
            mine, clock, self.opt, self.emulator, it,
            lambda idx, acc: micro_step_sums(net, fwd, jabas, fetch(idx), len(idx), dev, acc))
        clock.compute_start()
        loss_sum, loss_weight = read_sums(sums, self.opt, total)       # the iteration's one read of the loss
        clock.compute_stop()
        self.read_held_stats()                     # the previous iteration's deferred measurement, after that read
        t_sync = time.perf_counter()
        self.totals.samples += sum(map(len, mine))
        warm, lr_scale = self.state.lr_factor(), self.lr_scale   # batch_start = "knee": the lr warm-up (1 past it)
        self.opt.step(lr_scale=lr_scale * warm)
        # agreed at the safe point (runtime/safepoint.py); an fp16 step the scaler skipped is not an error
        self.nonfinite_loss = not math.isfinite(loss_sum) and not self.opt.last_step_skipped
        t_end = clock.end()                        # on a GPU: after the step's kernels, counted in this iteration
        compute = clock.compute_s()
        self.totals.compute_s += compute + emu_wait
        rec = StepRecord(
            it=it, epoch=ib.epoch, rank=rank, B=plan.B, samples=total, plan=str(ib.plan),
            b=ib.plan.bs[rank], x=ib.plan.xs[rank], n_local=len(mine), compute_s=compute + emu_wait,
            real_compute_s=compute, emulation_wait_s=emu_wait, wait_s=t_end - t_sync, iter_s=t_end - t_it,
            loss_sum=loss_sum, loss_weight=loss_weight, lr_scale=lr_scale, measure=measure,
            skipped=self.opt.last_step_skipped,      # amp fp16 inf/nan: no step, no statistics
            slowdown=self.emulator.factor(it) if self.emulator else 1.0,
            lr_warmup=warm if warm != 1.0 else None,
            stats=self.opt.last_stats.to_dict() if measure and self.opt.last_stats is not None else None,
            contained_errors=self.decisions.contained_errors)
        if defer:
            self._held_rec = rec                   # its stats come with read_held_stats
        step_end.after_step(self, rec)        # the record to the parts, the boundary's decisions (step_end.py)
        return rec

    def flush_metrics(self) -> None:
        """Collective: every rank's pending iteration numbers to rank 0, which writes them (a deferred measurement
        read first: a checkpoint, which flushes, holds the policy with it)."""
        self.read_held_stats()
        for rec in self.iteration_metrics.flush():           # rank 0: the iterations' records, the global loss in each
            for cb in self.callbacks:
                cb.on_metrics(self, rec)

    def read_held_stats(self) -> None:
        """Every rank: read the measurement an earlier iteration deferred (``controller.defers_stats``) into its
        record, and hand it to the controller, before anything that reads the policy (the next iteration's
        decision, a checkpoint, the metrics)."""
        held, st = self.opt.read_held()
        rec, self._held_rec = self._held_rec, None
        if not held or rec is None:
            return
        if st is not None:
            rec.stats = st.to_dict()
        if self.controller is not None:
            self.controller.observe_held(self, rec)

    # ---- state, checkpoints, resume (the Checkpointer, runtime/resume.py) ---------------------
    def state_dict(self) -> dict:
        self.read_held_stats()                     # the policy with every measurement taken
        return self.checkpointer.state_dict()

    def load_state_dict(self, st: dict) -> None:
        self.checkpointer.load_state_dict(st)

    def save_checkpoint(self) -> str | None:
        """All ranks call; rank 0 writes (the state is identical on every rank)."""
        self.setup()
        self.calib.sync(write=self.cfg.checkpoint)        # every rank's fit in the checkpoint and calibration.json
        self.flush_metrics()
        path = self.checkpointer.save(self.samples_local)
        self._periodic.mark(self.iteration)
        return path

    def lock_run_dir(self, wait_s: float = 0.0) -> None:
        """Collective: rank 0 holds the run directory for the process's life; a second writer is refused."""
        self.rundir.lock(wait_s)

    def maybe_resume(self, epochs: int | None = None) -> bool:
        """Resume from the run_dir's latest checkpoint (True when one was loaded); one that already finished the
        epochs is said in one line, and ``fit`` then trains nothing (progress.finished_already)."""
        self.setup()                                # before the load: a resumed state is not broadcast over
        self.lock_run_dir()
        source = self.checkpointer.resume()
        if source is None:
            return False
        if not finished_already(self, epochs or self.cfg.epochs):
            self.checkpointer.announce_resume(source)
        return True

    # ---- epochs ------------------------------------------------------------------------------
    def fit(self, epochs: int | None = None, max_iterations: int | None = None, resume: bool = True) -> dict:
        epochs = self.fit_epochs = epochs or self.cfg.epochs
        self.setup()
        self.lock_run_dir()
        installed_here = not sp.stop_signals().installed and sp.stop_signals().install()
        self.stop_reason = None
        if resume:
            self.maybe_resume(epochs)
        if self.rank == 0 and self.sampler.epoch < epochs:      # (a finished run: its one line said, no more)
            announce_start(self)                        # where every rank runs; metrics.jsonl's start record
        t0, it0 = time.perf_counter(), self.iteration
        samples = 0
        first_step = True
        fin = final_goal(self.controller)                # goal = "final": on past the epochs to the progress budget
        while self.sampler.epoch < epochs or (fin is not None and fin.runs_on()):
            if self.sampler.epoch_done(self.plan.B):
                if self._end_epoch():
                    break
                continue
            rec = self.train_step()
            samples += rec.samples
            self.state.samples += rec.samples
            if first_step:
                first_step = False
                for cb in self.callbacks:
                    cb.on_first_step(self)
            if fin is not None and fin.finished():
                break
            if max_iterations is not None and self.iteration >= max_iterations:
                break
            if self._safe_point():
                break
        sp.finish(self)                                  # an agreement still in flight is read
        self.flush_metrics()
        self.calib.sync(write=True)
        self.feed.close()
        if installed_here:
            sp.stop_signals().uninstall()
        wall = time.perf_counter() - t0
        # the run's totals (over every job and resume of it), and this call's
        return {"iterations": self.iteration, "epoch": self.sampler.epoch, "samples": self.state.samples,
                "iterations_here": self.iteration - it0, "samples_here": samples, "wall_s": wall,
                "samples_per_s": samples / wall if wall > 0 else 0.0, "stopped": self.stop_reason}

    def _safe_point(self) -> bool:
        """Every rank, at an iteration boundary (runtime/safepoint.py): True when the job stops here."""
        self.stop_reason = sp.boundary(self, self._periodic)
        return self.stop_reason is not None

    def _end_epoch(self) -> bool:
        """Every rank, at the sampler's epoch end (runtime/epoch_end.py): True when the job stops (moved)."""
        moved = epoch_end.end_epoch(self, self.fit_epochs)
        if moved is not None:
            self.moved_to = moved
        return moved is not None
