"""The script's own loop: what a training script that keeps its loop calls from ``hpc_jabas``.

:class:`Jabas` (``hpc_jabas.Jabas``): setup, the loader of iterations, backward, epochs, save and resume, B
changed at iteration boundaries. :func:`init` (``hpc_jabas.init``) starts a backend for a script that starts
none. A script that calls hvd.init() or ``torch.distributed.init_process_group(...)`` itself needs no call: the
low-level layer (``HeterogeneousOptimizer``) adopts that initialisation at its first ``begin()`` (runtime/comm/seam.py
``adopt``).
"""
from __future__ import annotations

import functools
import io
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import TensorDataset, default_collate

from hpc_jabas.core.adaptive.stats import NoiseScale
from hpc_jabas.core.planning import Plan, half_split, proportional_plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler, IterationBatch, split_single_micro
from hpc_jabas.errors import CheckpointError, ConfigError, JabasError
from hpc_jabas.runtime.batchnorm import batch_coupled_layers
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.loop_policy import LoopPolicy, option_keys
from hpc_jabas.runtime.optim import HeterogeneousOptimizer
from hpc_jabas.trust import check_write_dir, open_trusted, write_atomic_nofollow


class Process(NamedTuple):
    """Where this process stands in the job: what :func:`init` returns."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str


def init(backend: str | None = None) -> Process:
    """Start the job's backend in this process and return its rank, size, local rank, device and backend name.

    ``backend``: "horovod", "torch" or "auto" (None: the ``HPC_JABAS_BACKEND`` environment variable, else
    "auto": Horovod when it imports, torch under torchrun). The ranks find each other as the launcher started
    them (mpirun, srun, torchrun; none: one rank). A script that already called hvd.init() or
    ``init_process_group`` gets that one; asking for the other backend then is a ConfigError. Idempotent."""
    if backend is not None:
        comm.check_backend(backend)
    if not comm.adopt():
        comm.use(backend)
        comm.init()
    elif backend not in (None, "auto") and comm.backend() != backend:
        raise ConfigError(f"hpc_jabas.init(backend={backend!r}) but this process already runs the "
                               f"{comm.backend()} backend (the script's own initialisation); one process runs one")
    return Process(comm.rank(), comm.size(), comm.local_rank(), comm.device(), comm.backend())


def select_backend(backend: str | None) -> str:
    """Pick this process's backend ("horovod", "torch", "auto"; None: the environment's, else "auto") before it
    starts, no collective; returns the name picked ("auto" until :func:`init` resolves it, the Trainer's
    constructor). ConfigError when another backend already runs here."""
    comm.use(backend)
    return comm.backend()


def from_rank0(obj: Any, name: str) -> Any:
    """Collective: rank 0's ``obj`` (any picklable value) on every rank; ``name`` tells this collective apart."""
    return comm.broadcast_object(obj if comm.rank() == 0 else None, name=name)


class Jabas:
    """Keep your loop (Lightning Fabric's and Accelerate's shape): hpc-jabas's weighted data parallelism and the
    global batch B around the script's own loop, exact against one big batch of B samples.

        jabas = hpc_jabas.Jabas(batch=256, micro_batch=32, speeds=(1, 1, 2), checkpoint="run.pt")
        model, optimizer, loader = jabas.setup(model, optimizer, dataset)
        for epoch in jabas.epochs(10):            # resumes from ``checkpoint``; saves it at every epoch end
            for step in loader:                   # one iteration of B samples
                for x, y in step:                 # this rank's micro-batches of it
                    jabas.backward(loss_fn(model(x), y), len(x))
                optimizer.step()                  # the global batch's exact mean gradient, stepped

    ``speeds``: each rank's relative speed (rank i gets a share of B proportional to it, in micro-batches of
    ``micro_batch``), or ``plan=``: a ``Plan`` of the split itself. :meth:`set_batch` changes B (or the plan) from
    the next iteration on: every rank makes the same call (a decision every rank computes alike, or one it
    received). On torch the model comes back in ``DistributedDataParallel`` (DDP reduces the last micro-batch's
    backward, overlapped; the others run in its ``no_sync``); on Horovod as it is, with Horovod's hooks. The
    loader yields each micro-batch as the dataset's samples collated (a TensorDataset: its tensors indexed), on
    the host. The backend: the script's own (hvd.init(), ``init_process_group``) or :func:`init`'s.

    Adaptive B: ``measure_every=k`` measures the gradient noise every k-th iteration (noise-only: the micro-batch
    norms and one small extra reduction, no extra gradient memory; iterations of one micro-batch in all measure
    nothing) into :attr:`b_noise`, the gradient noise scale (McCandlish et al. 2018; an EMA of its terms, the same
    value on every rank); with ``adapt=(B_min, B_max)`` B then follows it, rounded to a multiple of ``micro_batch``
    and clipped, from the iteration after each measurement (the script's lr is left as it is: scale it by
    ``jabas.B`` if the optimizer wants that).

    ``policy=`` runs fit()'s batch-size policies instead (runtime/loop_policy.py): "fixed", "similarity",
    "noise-scale", "ramp" or a registered one, with fit()'s keys ``p``, ``batch_min``/``batch_max`` (multiples of
    ``micro_batch``; unset: fit()'s range), ``lr_rule`` ("auto", "sqrt", "linear", "none", "adascale"),
    ``batch_ref``, ``epochs`` (ramp: the run its fractions are of), ``measure_every`` (0: the policy's default) and
    the policy's own keys (``gamma``, ``alpha``, ``ramp_at``, ``ramp_factor``, ``kappa``, ...). Every p iterations
    rank 0's policy decides from the measured statistics and broadcasts (B, lr scale); from the next iteration
    on every rank runs that B, and ``optimizer.step()`` multiplies every param group's lr by the scale for the
    step (as fit() does: the script's scheduler keeps its lr). :attr:`lr_scale`, :attr:`trajectory`."""

    def __init__(self, batch: int | None = None, micro_batch: int = 1, speeds: Sequence[float] | None = None,
                 plan: Plan | None = None, seed: int = 0, tail: str = "shrink",
                 checkpoint: str | os.PathLike[str] | None = None, backend: str | None = None,
                 measure_every: int = 0, adapt: tuple[int, int] | None = None, policy: str | None = None,
                 p: int | None = None, batch_min: int | None = None, batch_max: int | None = None,
                 lr_rule: str = "auto", batch_ref: int | None = None, epochs: int | None = None,
                 **policy_keys: Any):
        self.process = init(backend)
        self.rank, self.world = self.process.rank, self.process.size
        self.micro_batch = _positive(micro_batch, "micro_batch")
        self.speeds = tuple(float(v) for v in speeds) if speeds is not None else (1.0,) * self.world
        if len(self.speeds) != self.world or not all(v > 0 for v in self.speeds):
            raise ConfigError(f"speeds={list(self.speeds)} must give one positive speed per rank ({self.world})")
        if plan is None and batch is None:
            raise ConfigError("Jabas needs batch= (the global batch B) or plan=")
        self.plan = self._check_plan(plan) if plan is not None else self._plan_for(batch)
        self._pending: Plan | None = None
        self.seed, self.tail = int(seed), tail
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.iteration = 0
        self._sampler: HeterogeneousSampler | None = None
        self._opt: HeterogeneousOptimizer | None = None
        self._model: torch.nn.Module | None = None
        self._data: Any = None
        if isinstance(measure_every, bool) or not isinstance(measure_every, int) or measure_every < 0:
            raise ConfigError(f"measure_every={measure_every!r} must be an integer >= 0 (0: never)")
        self.measure_every = measure_every
        self.adapt = _check_adapt(adapt, self.micro_batch, measure_every)
        self.noise = NoiseScale()
        self.stats: Any = None                  # the last measurement's GradStats (runtime/gradstats.py)
        self._due: tuple[bool, int] | None = None    # the last iteration's after-step work: (it measured, its B)
        self._pending_lr: float | None = None
        self._min_split = 1
        self.adaptive: LoopPolicy | None = None
        unknown = sorted(set(policy_keys) - set(option_keys()))
        if unknown:
            raise ConfigError(f"unknown Jabas keyword(s) {', '.join(unknown)}; a policy's keys: "
                              f"{', '.join(option_keys())}")
        if policy is None and (policy_keys or p is not None or batch_min is not None or batch_max is not None):
            bad = sorted(policy_keys) or [k for k, v in (("p", p), ("batch_min", batch_min),
                                                        ("batch_max", batch_max)) if v is not None]
            raise ConfigError(f"Jabas keyword(s) {', '.join(bad)} need policy= (fixed, similarity, noise-scale, "
                              "ramp or a registered one)")
        if policy is not None:
            if adapt is not None:
                raise ConfigError(f"adapt={adapt!r} and policy={policy!r}: give one (adapt=(lo, hi) is the loop's "
                                  "own rule; policy= runs fit()'s)")
            if str(policy).strip().lower() == "ramp" and epochs is None:
                raise ConfigError("policy='ramp' needs epochs= (the run whose fractions ramp_at are)")
            self.adaptive = LoopPolicy(policy, batch=self.plan.B, micro_batch=self.micro_batch, speeds=self.speeds,
                                       p=p, batch_min=batch_min, batch_max=batch_max, lr_rule=lr_rule,
                                       batch_ref=batch_ref, epochs=epochs, measure_every=measure_every or None,
                                       options=policy_keys)

    @classmethod
    def over(cls, optimizer: HeterogeneousOptimizer, sampler: HeterogeneousSampler, plan: Plan, *, rank: int,
             world: int, model: torch.nn.Module | None = None, data: Any = None) -> Jabas:
        """A Jabas over parts the caller built and a backend it started: a HeterogeneousOptimizer (its reducer
        made, e.g. by its ``wrap``), the sampler (its position is the caller's to save) and the plan in force, on
        rank ``rank`` of ``world``. ``Trainer.fit()`` runs every iteration so: :meth:`draw`, :meth:`begin`,
        :meth:`backward` per micro-batch (in ``micro()`` and ``autocast()``), the optimizer's ``step``."""
        j = cls.__new__(cls)
        j.process, j.rank, j.world = None, int(rank), int(world)           # type: ignore[assignment]
        j.micro_batch, j.speeds, j.seed, j.tail = 1, (1.0,) * j.world, sampler.seed, sampler.tail
        j.plan, j._pending, j.checkpoint, j.iteration = j._check_plan(plan), None, None, 0
        j._sampler, j._opt, j._model, j._data = sampler, optimizer, model, data
        j.measure_every, j.adapt, j.noise, j.stats = 0, None, NoiseScale(), None
        j._due, j._pending_lr, j.adaptive, j._min_split = None, None, None, 1
        return j

    @property
    def B(self) -> int:
        """The global batch of the plan in force."""
        return self.plan.B

    @property
    def optimizer(self) -> HeterogeneousOptimizer:
        """The HeterogeneousOptimizer this Jabas steps (``setup``'s, or the one given to :meth:`over`)."""
        return self._need()

    @property
    def sampler(self) -> HeterogeneousSampler:
        """The sampler of the iterations (its ``epoch``, ``epoch_done``, ``new_epoch``, ``state_dict``)."""
        self._need()
        assert self._sampler is not None
        return self._sampler

    def _plan_for(self, B: int | None) -> Plan:
        return proportional_plan(_positive(B, "batch"), self.micro_batch, self.speeds)

    def _check_plan(self, plan: Plan) -> Plan:
        if not isinstance(plan, Plan) or plan.world_size != self.world:
            raise ConfigError(f"plan={plan!r} must be a hpc_jabas.Plan with one entry per rank ({self.world})")
        return plan

    @property
    def b_noise(self) -> float | None:
        """The gradient noise scale measured so far (None before a measurement; inf: no signal yet)."""
        return self.noise.b_noise

    @property
    def lr_scale(self) -> float:
        """The lr scale in force: what ``optimizer.step()`` multiplies the lr by (1 without a policy)."""
        return self.adaptive.lr_scale if self.adaptive is not None else 1.0

    @property
    def trajectory(self) -> list[tuple[int, int]]:
        """With a policy: (iteration, B) at the start and at every change of B, the iteration the decision
        was made after (it runs from the next one)."""
        return list(self.adaptive.trajectory) if self.adaptive is not None else []

    def _after_step(self) -> None:
        """The last iteration's work after its step (once; the loader's next iteration, or :meth:`save`): its
        measurement, and with a policy its decision round (collective on rounds)."""
        due, self._due = self._due, None
        if due is None:
            return
        measured, samples = due
        opt = self._need()
        st = opt.last_stats if measured else None
        if st is not None:
            self._measured(st)
        if self.adaptive is not None:
            assert self._sampler is not None
            ep = self.adaptive.cfg.epochs
            n = self._sampler.num_samples
            progress = (self._sampler.epoch + self._sampler.cursor / n) / ep if ep and n else None
            st = st if st is not None and st.M >= 2 and st.b < st.S else None
            d = self.adaptive.after_step(self.iteration, samples, st, (self._pending or self.plan).B, progress)
            if d is not None:
                if d[0] != (self._pending or self.plan).B:
                    self.set_batch(d[0])
                self._pending_lr = d[1]

    def _apply_pending(self) -> None:
        """A decision takes effect at an iteration boundary: the plan, and the lr scale the optimizer steps with."""
        if self._pending is not None:
            self.plan, self._pending = self._pending, None
        if self._pending_lr is not None and self._opt is not None:
            self._opt.lr_scale, self._pending_lr = self._pending_lr, None

    def _measured(self, st: Any) -> None:
        """After a measuring iteration's step: the noise scale, and with ``adapt`` the next B."""
        if st is None or st.M < 2 or st.b >= st.S:
            return
        self.stats = st
        b_noise = self.noise.update(st.b, st.sq_micro, st.S, st.sq_global)
        if self.adapt is not None and b_noise is not None and self._pending is None:
            B = adapt_batch(b_noise, *self.adapt, self.micro_batch)
            if B != self.plan.B:
                self.set_batch(B)

    def _measure_now(self) -> bool:
        return self.measure_every > 0 and self.iteration % self.measure_every == 0

    def set_batch(self, batch: int | None = None, plan: Plan | None = None) -> None:
        """B (split by ``speeds``), or the plan itself, from the next iteration on; the same call on every rank."""
        self._pending = self._check_plan(plan) if plan is not None else self._plan_for(batch)

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any
              ) -> tuple[torch.nn.Module, HeterogeneousOptimizer, _Loader]:
        """(the model to run the forward through, the optimizer to step, the loader of iterations)."""
        if self._opt is not None:
            raise ConfigError("Jabas.setup() was called already; one Jabas drives one model")
        self._model = model
        net = model
        if comm.backend() == "torch":
            import inspect

            from torch.nn.parallel import DistributedDataParallel
            dev = next((p.device for p in model.parameters()), torch.device("cpu"))
            opts = inspect.signature(DistributedDataParallel.__init__).parameters   # buffers: each rank's own
            flag = "forward_sync_buffers" if "forward_sync_buffers" in opts else "broadcast_buffers"
            kw: dict[str, Any] = {flag: False}
            net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None, **kw)
        else:
            comm.broadcast_parameters(model.state_dict(), root_rank=0)
        self._opt = HeterogeneousOptimizer(optimizer, model.named_parameters(), model=net if net is not model else None)
        self._sampler = HeterogeneousSampler(len(data), seed=self.seed, tail=self.tail)
        self._data = data
        if self.adaptive is not None:
            self.adaptive.start(len(data), self.plan.B, self.iteration)
            # a measuring iteration of one micro-batch in all runs it as two halves (fit()'s min_split): not with
            # batch-coupled layers (BatchNorm would see half micro-batches)
            self._min_split = self.micro_batch if batch_coupled_layers(model) else 1
        return net, self._opt, _Loader(self)

    def draw(self, plan: Plan | None = None) -> IterationBatch:
        """The next iteration's samples, in the sampler's seeded order, split by ``plan`` (default: the plan in
        force, a pending :meth:`set_batch` taking effect first: at an iteration boundary); ``plan`` becomes the
        plan in force. On the epoch's last iteration the split shrinks to the samples left (``tail``)."""
        if plan is None:
            self._apply_pending()
        else:
            self.plan = plan
        assert self._sampler is not None
        return self._sampler.next(self.plan)

    def begin(self, batch: IterationBatch, measure: bool = False, similarity: bool = True, defer: bool = False,
              min_split: int = 1) -> Step:
        """Begin the iteration ``batch`` (:meth:`draw`'s) on this rank: its micro-batches announced to the optimizer
        (``HeterogeneousOptimizer.begin``); returns its :class:`Step`. ``measure``: the iteration measures the
        gradient statistics (the noise scale; ``similarity``: and the two halves' similarity, by the plan's
        ``half_split``; ``defer``: read later, ``optimizer.read_held()``); a plan of one micro-batch in all runs
        it as two halves of at least ``min_split`` samples each (``split_single_micro``), else measures nothing."""
        opt = self._opt if self._opt is not None else self._need()
        mine = batch.micro[self.rank]
        total = batch.total
        halves: Sequence[int] | None = None
        first = 0
        if measure:
            halves = half_split(batch.plan)[self.rank]
            if len(halves) == len(mine):
                mine, halves = split_single_micro(batch.micro, self.rank, mine, halves, min_split)
            else:                   # an epoch tail that took one sample more: the global micro-batch index's parity
                halves, first = None, sum(len(m) for m in batch.micro[:self.rank])
        opt.begin(len(mine), total, measure=measure, halves=halves, defer=defer, similarity=similarity,
                  first_global_microbatch=first)
        self.iteration += 1
        return Step(batch, mine, self._data, total)

    def backward(self, loss: torch.Tensor, count: int, weight: torch.Tensor | float | None = None) -> None:
        """One micro-batch's mean loss, weighted by its ``count`` samples, or by ``weight`` units (e.g. tokens,
        ``loss`` their mean): the optimizer's ``backward``."""
        (self._opt if self._opt is not None else self._need()).backward(loss, count, weight=weight)

    def micro(self) -> Any:
        """The context of the next micro-batch's forward and backward (the optimizer's ``micro``: no gradient
        sync but on the iteration's last micro-batch, where the optimizer's reducer was made by ``wrap``)."""
        return (self._opt if self._opt is not None else self._need()).micro()

    def autocast(self) -> Any:
        """The forward's context: ``torch.autocast`` under the optimizer's amp (bf16, fp16), else nothing."""
        return (self._opt if self._opt is not None else self._need()).autocast()

    def _need(self) -> HeterogeneousOptimizer:
        if self._opt is None:
            raise ConfigError("call Jabas.setup(model, optimizer, dataset) first")
        return self._opt

    @property
    def epoch(self) -> int:
        return self._sampler.epoch if self._sampler is not None else 0

    def epochs(self, n: int) -> Iterator[int]:
        """Epochs up to ``n``, from the checkpoint when it exists (at the iteration it was saved); the checkpoint
        is saved at every epoch end."""
        self._need()
        assert self._sampler is not None
        if self.checkpoint is not None and self.checkpoint.exists():
            self.load(self.checkpoint)
        while self._sampler.epoch < n:
            yield self._sampler.epoch
            self._after_step()
            self._apply_pending()
            if self._sampler.epoch_done(self.plan.B):
                self._sampler.new_epoch()
            if self.checkpoint is not None:
                self.save()

    def state_dict(self) -> dict[str, Any]:
        opt = self._need()
        assert self._sampler is not None and self._model is not None
        plans = [[list(p.bs), list(p.n), list(p.xs)] if p is not None else None for p in (self.plan, self._pending)]
        return {"model": self._model.state_dict(), "optimizer": opt.state_dict(), "sampler": self._sampler.state_dict(),
                "plan": plans[0], "pending": plans[1], "iteration": self.iteration, "noise": self.noise.state_dict(),
                "adaptive": None if self.adaptive is None else {**self.adaptive.state_dict(),
                                                                "pending_lr": self._pending_lr,
                                                                "opt_lr_scale": opt.lr_scale}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        opt = self._need()
        assert self._sampler is not None and self._model is not None
        self._model.load_state_dict(d["model"])
        opt.load_state_dict(d["optimizer"])
        self._sampler.load_state_dict(d["sampler"])
        self.plan = self._check_plan(Plan(*d["plan"]))
        self._pending = self._check_plan(Plan(*d["pending"])) if d["pending"] is not None else None
        self.iteration = int(d["iteration"])
        self.noise.load_state_dict(d["noise"])
        a = d.get("adaptive")
        if (a is None) != (self.adaptive is None):
            raise CheckpointError("this checkpoint was saved " + ("with" if a is not None else "without") +
                                  " a policy and this Jabas runs " + ("none" if a is not None else "one") +
                                  "; resume with the policy keys it was saved with")
        if a is not None and self.adaptive is not None:
            self.adaptive.load_state_dict(a)
            self._pending_lr = None if a["pending_lr"] is None else float(a["pending_lr"])
            opt.lr_scale = float(a["opt_lr_scale"])
        self._due = None

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """The state at this iteration boundary (model, optimizer, sampler, plan, iteration), written by rank 0
        into a directory of this user's (made when missing; one another user could write is refused), beside
        the file and renamed over it, never through a link (hpc_jabas/trust.py): never torn. Every rank
        returns once it is on disk, or raises the same one-line error when rank 0 could not write it."""
        p = Path(path) if path is not None else self.checkpoint
        if p is None:
            raise ConfigError("Jabas.save() needs a path (or Jabas(checkpoint=...))")
        self._after_step()                    # collective: the last iteration's decision round, before its state
        sd = self.state_dict()
        err: JabasError | None = None
        if self.rank == 0:
            try:
                check_write_dir(p.absolute().parent, "checkpoint directory")
                buf = io.BytesIO()
                torch.save(sd, buf)
                write_atomic_nofollow(p, buf.getvalue(), "checkpoint", fsync=True)
            except JabasError as e:
                err = e
            except OSError as e:
                err = CheckpointError(f"cannot write checkpoint {str(p)!r}: {e.strerror or e}; the previous "
                                      "checkpoint is kept: free space or give a writable path")
        failed = torch.tensor([0.0 if err is None else 1.0])
        comm.allreduce_sum(failed, name="hj.loop.saved")      # every rank: the file is there (or it is not)
        if err is not None:
            raise err
        if float(failed.item()) > 0:
            raise CheckpointError(f"rank 0 could not write checkpoint {str(p)!r} (its line says why)")
        return p

    def load(self, path: str | os.PathLike[str]) -> None:
        """The state :meth:`save` wrote (every rank reads it, and returns once all have: a save that follows
        cannot replace the file under a rank still reading it). A file another user could have written (or
        planted as a link) is refused in one line, never read (hpc_jabas/trust.py)."""
        with open_trusted(path, "checkpoint") as f:
            sd = torch.load(f, map_location="cpu", weights_only=True)
        self.load_state_dict(sd)
        comm.allreduce_sum(torch.zeros(1), name="hj.loop.loaded")


class _Loader:
    """Iterations until the epoch's samples are used: each a :class:`Step` (its optimizer ``begin`` done)."""

    def __init__(self, jabas: Jabas):
        self._j = jabas

    def __len__(self) -> int:
        j = self._j
        assert j._sampler is not None
        return j._sampler.iterations_left((j._pending or j.plan).B)

    def __iter__(self) -> Iterator[Step]:
        j = self._j
        j._need()
        assert j._sampler is not None
        while True:
            j._after_step()                            # the previous iteration's (its step is done)
            j._apply_pending()                         # a decision takes effect at an iteration boundary
            if j._sampler.epoch_done(j.plan.B):
                return
            ib = j.draw()
            a, many = j.adaptive, sum(len(m) for m in ib.micro) >= 2
            if a is not None:
                # the policy's schedule (fit()'s); a policy that reads nothing: measure_every's noise scale
                measuring = a.measures(j.iteration + 1) if a.policy.reads else many and j._measure_now()
                sim = measuring and a.similarity(j.iteration + 1)
                step = j.begin(ib, measure=measuring, similarity=sim, min_split=j._min_split)
            else:
                measuring = many and j.measure_every > 0 and j._measure_now()
                step = j.begin(ib, measure=measuring, similarity=False)   # noise only: the halves are not read
            j._due = (measuring, ib.total)
            yield step


class Step:
    """One iteration: iterating it yields this rank's micro-batches. ``samples``: the iteration's B (all ranks);
    ``indices``: the dataset indices of all ranks, in order; ``plan``: the split used."""

    def __init__(self, ib: IterationBatch, mine: Sequence[Any], data: Any, samples: int | None = None):
        self.samples, self.plan, self._mine, self._data = int(ib.total if samples is None else samples), ib.plan, \
            mine, data
        self._ib = ib
        self._indices: list[int] | None = None

    @property
    def batch(self) -> IterationBatch:
        """The iteration drawn (``epoch``, ``plan``, ``micro``: every rank's micro-batches' indices)."""
        return self._ib

    @property
    def local(self) -> Sequence[Any]:
        """This rank's micro-batches as dataset indices, in order (a measuring iteration's split included): what a
        loop that fetches its own batches (a DataLoader's, ``Trainer.fit()``'s) iterates instead of the step."""
        return self._mine

    @property
    def indices(self) -> list[int]:
        """Built when first read: a loop that never reads it pays nothing per iteration for it (B ints)."""
        if self._indices is None:
            self._indices = [int(i) for i in self._ib.all_indices()]
        return self._indices

    def __len__(self) -> int:
        return len(self._mine)

    def __iter__(self) -> Iterator[Any]:
        return map(functools.partial(_fetch, self._data), self._mine)     # (no generator frame per micro-batch)


def _fetch(data: Any, idx: Any) -> Any:
    """The samples ``idx`` of ``data``, collated (a TensorDataset: its tensors indexed at once)."""
    if isinstance(data, TensorDataset):
        t = torch.as_tensor(idx)
        return tuple([x[t] for x in data.tensors])
    return default_collate([data[int(i)] for i in idx])


def adapt_batch(b_noise: float, lo: int, hi: int, b: int) -> int:
    """The B that follows the noise scale: ``b_noise`` rounded to a multiple of ``b`` (half up), clipped to
    [lo, hi] (multiples of b); no signal yet (inf, nan): hi."""
    if not b_noise < math.inf:                 # inf or nan
        return hi
    return max(lo, min(hi, b * math.floor(b_noise / b + 0.5)))


def _check_adapt(adapt: Any, b: int, measure_every: int) -> tuple[int, int] | None:
    if adapt is None:
        return None
    lo, hi = (adapt if isinstance(adapt, (tuple, list)) and len(adapt) == 2 else (0, 0))
    if not (isinstance(lo, int) and isinstance(hi, int) and b <= lo <= hi and lo % b == 0 and hi % b == 0):
        raise ConfigError(f"adapt={adapt!r} must be (B_min, B_max), multiples of micro_batch={b} with "
                          f"{b} <= B_min <= B_max")
    if measure_every < 1:
        raise ConfigError("adapt= needs measure_every >= 1 (B follows the measured gradient noise)")
    return int(lo), int(hi)


def _positive(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{what}={v!r} must be an integer >= 1")
    return v
