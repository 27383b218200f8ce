"""The low-level layer: an optimizer wrapper for weighted heterogeneous local batches.

Like ``hvd.DistributedOptimizer``, it wraps the user's optimizer. Per iteration:

    opt.begin(n_local, total_samples)          # n_local micro-batches here, S samples in all ranks
    for mb in my_micro_batches:
        loss = criterion(model(x_mb), y_mb)    # mean over the micro-batch, as usual
        opt.backward(loss, len(mb))            # accumulates len(mb) * grad(mean loss)
    opt.step()                                 # waits for the allreduce, steps the optimizer

Every rank accumulates the sum of per-sample gradients of its own micro-batches, divided by
c = S / world (the backward of ``loss * count / c``: the usual ``loss / accumulation_steps`` of
gradient accumulation, which keeps fp16 gradients in range); one ``op=Sum`` allreduce with the
postscale 1/world (the same on every rank) leaves the mean gradient of all S samples of the
iteration on every rank: exactly the gradient of one big batch (docs/invariants.md, invariants 1-2;
Horovod refuses per-rank scale factors, so the weight is applied locally by the sample count).
The gradients go through the backend's reducer (runtime/comm/reducer.py, ``GradReducer``): on Horovod
each parameter's allreduce starts from a post-accumulate-grad hook during the last micro-batch's
backward (overlapping the rest of it; Horovod fuses small tensors); on torch the Trainer's model is
in DistributedDataParallel, all but the last micro-batch run in its ``no_sync()`` (``micro()``), and a
rank without micro-batches joins with one zero step. Either way the sum, then the postscale 1/world.

Under the script's own initialisation (the layer in a user's loop): the first ``begin`` adopts the backend the
script started (hvd.init(), its own ``init_process_group``; ``comm.adopt``), or ``hpc_jabas.init()``'s. On torch
the script's DistributedDataParallel wrap of these parameters is found (or given as ``model=``) and used as it is
(reducer.py ``ScriptDDPReducer``): its ``no_sync`` is held from ``begin`` until the last micro-batch, over the
script's forwards too, so DDP reduces only the last backward, overlapped with it. Without a wrap, one flat
allreduce after the backward (``FlatReducer``). Misuse (``step`` before ``begin``, a backward count other than
``n_local``, no backend) is one ConfigError line.

Token-weighted losses: ``opt.backward(loss, count, weight=w)`` (``loss`` the mean over the w
tokens of the micro-batch) accumulates w x grad(loss) / c (c = the previous iteration's W / world,
rank-independent); the same allreduce runs, then the gradients are multiplied by c world / W with W
the global total weight (one tiny allreduce of the local weight sums, the factor applied on the
device, no host sync): the big batch's token-mean gradient. The mode (plain or weighted) is
agreed by every rank at the first iteration (one tiny collective) and must stay the same.

Horovod's recipe for work between the allreduce and the step (clipping, logging) works and
allreduces once: ``synchronize()`` is idempotent within an iteration, and

    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()

``clip_grad_norm`` (config key) clips by the global norm after the allreduce and before the step;
``add_pre_step_hook(fn)`` runs ``fn(opt)`` there too. With ``amp="fp16"`` the gradients are unscaled
inside ``synchronize()`` (runtime/amp.py), so hooks and the recipe see true gradients.

Measurement iterations (``begin(..., measure=True, halves=...)``, runtime/gradstats.py): the
normal allreduce of the full gradient sum plus one extra reduction of the half-0 gradient sum
(split by ``plan.half_split``: identical b, the parity of the global micro-batch index; per-rank
b, two halves of nearly equal sample counts) and of one small scalar tensor; half 1 = total -
half 0. No host sync per micro-batch or parameter; one host read per measurement iteration; 1x
the parameter memory extra (2x for fp16/bf16 parameters, whose half sum is kept in fp32). A noise-only
measurement (``similarity=False``, goodput's ``measure_every``) keeps no half sum: the small scalar
reduction only, no extra memory but the micro-batch norms. With ``begin(defer=True)`` (goodput's measurements
between decisions) that reduction is not waited for in its own iteration: ``read_held`` reads it later (the
trainer: after the next iteration's loss read), with no wait once it is done.

Noise scale with mixed micro-batch sizes: with g_j the mean gradient of micro-batch j (b_j
samples), E|g_j|^2 = |G|^2 + tr(Sigma)/b_j, so the sample-weighted mean sum_j b_j |g_j|^2 / S has
expectation |G|^2 + tr(Sigma) M / S: a measurement at the effective size b_small = S / M (the
plan's b when every micro-batch has b samples), which ``stats.noise_scale_terms`` pairs with
|g|^2 at S. Unbiased for any mix of sizes.
"""
from __future__ import annotations

import contextlib
import gc
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.utils.hooks import RemovableHandle

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.amp import Amp
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.comm.reducer import GradReducer, check_model
from hpc_jabas.runtime.gradstats import GradStats, Measurement, mul_, stat_dtype
from hpc_jabas.runtime.token_weights import TokenWeights

__all__ = ["GradStats", "HeterogeneousOptimizer", "check_model"]

PreStepHook = Callable[["HeterogeneousOptimizer"], None]
_NO_CONTEXT = contextlib.nullcontext()           # reusable: the context of a micro-batch that needs none


class HeterogeneousOptimizer:
    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters, overlap: bool = True,
                 clip_grad_norm: float | None = None, amp: str = "off", model: torch.nn.Module | None = None):
        """``model``: the script's DistributedDataParallel wrapper (torch backend), whose forward the script
        runs; found by itself when not given (module docstring, "Under the script's own initialisation")."""
        self.optimizer = optimizer
        self.named = [(n, p) for n, p in named_parameters if p.requires_grad]
        names = [n for n, _ in self.named]
        if len(set(names)) != len(names):
            raise ConfigError("named_parameters has duplicate names; give each parameter once "
                              "(model.named_parameters())")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm={clip_grad_norm!r} must be > 0 (or None: off)")
        self._model = model
        self._begun: bool | None = None            # None: never begun; True: inside an iteration; False: stepped
        self._hold = contextlib.ExitStack()        # a DDP wrap's no_sync, held across the script's forwards
        self._holding = False
        self.clip_grad_norm = clip_grad_norm
        self.overlap = overlap
        self.device = self.named[0][1].device if self.named else torch.device("cpu")
        self.amp = Amp(amp, optimizer, self.device)
        self._sd = stat_dtype(self.device)
        self._n_local = 0
        self._done_local = 0
        self._total = 1
        self._world = 1
        self._world_known = False                  # the backend's size, read once its reducer exists
        self._c: torch.Tensor | float = 1.0        # the backward's normaliser (module docstring)
        self._measure = False
        self._meas: Measurement | None = None
        self._first_global = 0
        self._halves: list[int] | None = None
        self._synced = False
        self._skip_sync = False
        self._pre_step_hooks: OrderedDict[int, PreStepHook] = OrderedDict()
        self._tw = TokenWeights(self._sd, self.device)   # plain or token-weighted losses, and the weights' sum
        self._found_inf: torch.Tensor | None = None
        self._found_host: bool | None = None
        self.reducer: GradReducer | None = None    # the backend's (runtime/comm/reducer.py), made at the first begin()
        self._joined = False                       # a rank without micro-batches ran its zero step
        self.last_stats: GradStats | None = None
        self.last_step_skipped = False
        self._defer = False
        # a noise-only measurement held for a later read (begin(defer=True)): (measurement, S), or its stats once
        # a synchronize had to read it first
        self._held: tuple[Measurement, int] | None = None
        self._held_read: tuple[bool, GradStats | None] = (False, None)

    # expose the usual optimizer surface
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def state_dict(self):
        return self.optimizer.state_dict()          # with the fp16 loss scaler's state (runtime/amp.py)

    def load_state_dict(self, sd):
        self.optimizer.load_state_dict(sd)

    def zero_grad(self, set_to_none: bool = False):
        for _, p in self.named:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:      # torch's Optimizer.zero_grad: a view (DDP's bucket
                        p.grad.detach_()                # views) cannot be detached in place
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ---- the gradient reducer (runtime/comm/reducer.py) ---------------------------------------------
    def use_reducer(self, reducer: GradReducer) -> None:
        """Reduce the gradients with ``reducer`` (the Trainer gives the torch backend's DDP one); the one in use
        is closed. Without a call, the first ``begin`` asks the backend for its reducer of these parameters."""
        if self.reducer is not None and self.reducer is not reducer:
            self.reducer.close()
        self.reducer = reducer
        self._world_known = False

    def wrap(self, model: torch.nn.Module, bucket_cap_mb: float | None = None,
             find_unused_parameters: bool = False) -> torch.nn.Module:
        """The backend's reducer of these gradients made around ``model`` (the backend started); returns what the
        forward runs through: on torch a DistributedDataParallel wrapper of ``model`` (its ``.module``) whose
        micro-batches but the last run in ``micro()``, on Horovod ``model`` itself with the per-parameter hooks.
        ``bucket_cap_mb`` and ``find_unused_parameters``: DDP's knobs. What ``Trainer.setup`` does."""
        knobs = {"find_unused_parameters": True} if find_unused_parameters else {}
        self.use_reducer(comm.make_reducer(self.named, model=model, overlap=self.overlap, bucket_cap_mb=bucket_cap_mb,
                                           **knobs))
        assert self.reducer is not None
        return self.reducer.module if self.reducer.module is not None else model

    def broadcast_state(self, model: torch.nn.Module) -> None:
        """Collective: rank 0's parameters and buffers of ``model`` to every rank, and a loaded optimizer state (a
        fresh one is identical everywhere and is not sent: Horovod's broadcast_optimizer_state would initialise an
        empty state with a zero-gradient step, which shifts Adam's step count)."""
        comm.broadcast_parameters(model.state_dict(), root_rank=0)
        has_state = comm.broadcast_object(bool(self.optimizer.state_dict()["state"]), name="hj.optflag")
        if has_state:
            sd = comm.broadcast_object(self.optimizer.state_dict() if comm.rank() == 0 else None, name="hj.opt")
            self.optimizer.load_state_dict(sd)

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        """``fn()`` runs when this rank's last gradient of an iteration is ready, before a reduction that blocks the
        last backward (DDP's) waits for the other ranks: where a clock of this rank's compute stops. None: off."""
        if self.reducer is not None:
            self.reducer.on_ready(fn)

    def _new_reducer(self) -> GradReducer | None:
        """The backend's reducer (None: no backend runs here); on torch, around the script's DDP wrap if any."""
        if not comm.adopt():
            return None
        model = self._model
        if comm.backend() != "torch":
            if _is_ddp(model):
                raise ConfigError("model= is a DistributedDataParallel wrapper but the backend is Horovod, which "
                                  "reduces the gradients itself: pass the model without the wrap")
            self._model = None
            return comm.make_reducer(self.named, overlap=self.overlap)
        if model is None:
            model = _ddp_around([p for _, p in self.named])
        elif not _is_ddp(model):
            raise ConfigError(f"model={type(model).__name__} is not a DistributedDataParallel wrapper; on the torch "
                              "backend model= takes the DDP wrap the script's forward runs through (or leave it out)")
        self._model = model
        return comm.make_reducer(self.named, model=model, overlap=self.overlap)

    def _eager(self) -> bool:
        return self.reducer is None or self.reducer.eager_extras

    def micro(self) -> contextlib.AbstractContextManager[None]:
        """The context of the next micro-batch's forward and backward: the reducer's ``no_sync`` for all but this
        iteration's last micro-batch (runtime/step.py enters it around both)."""
        if self.reducer is None or self._done_local >= self._n_local - 1:
            return _NO_CONTEXT
        return self.reducer.no_sync()

    def _join(self) -> None:
        """A rank without micro-batches in this iteration joins the gradients' reduction (zeros), at the point
        where the others end their last backward: before any other collective of the iteration."""
        if self._done_local == 0 and not self._joined and self.reducer is not None:
            self._joined = True
            self.reducer.zero_step()

    # ---- hooks and the Horovod-style surface -------------------------------------------------
    def add_pre_step_hook(self, fn: PreStepHook) -> RemovableHandle:
        """``fn(opt)`` runs in ``step()`` after the allreduce (and the fp16 unscale) and before the configured
        clipping and the inner step; not on a skipped (inf/nan) step. Returns a handle with ``remove()``."""
        h = RemovableHandle(self._pre_step_hooks)
        self._pre_step_hooks[h.id] = fn
        return h

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside does not synchronize (Horovod's API): call ``synchronize()`` first."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def autocast(self):
        """The forward's context: ``torch.autocast`` for amp bf16/fp16, else nothing."""
        return self.amp.autocast() if self.amp.dtype is not None else _NO_CONTEXT

    # ---- iteration protocol ------------------------------------------------------------
    def begin(self, n_local: int, total_samples: int, measure: bool = False,
              first_global_microbatch: int = 0, b: int = 1, halves: Sequence[int] | None = None,
              similarity: bool = True, defer: bool = False) -> None:
        """``halves``: per local micro-batch, the half (0/1) it belongs to on a measurement iteration
        (``plan.half_split(plan)[rank]``); default the parity of the global micro-batch index.
        ``similarity``: False for a noise-only measurement (no half-batch buffer, no gradient-sized extra
        reduction; ``last_stats.similarity`` None). ``defer``: a noise-only measurement is not waited for nor read in
        this iteration's ``synchronize``: its scalars' reduction stays in flight and :meth:`read_held` reads it later
        (``last_stats`` None until then; not with fp16, whose skipped steps discard statistics).
        ``b`` is accepted for compatibility and unused (the statistics use the true sample counts)."""
        if not (type(n_local) is int and type(total_samples) is int and n_local >= 0 and total_samples >= 1):
            _check_counts(n_local, total_samples)
        if self._begun and 0 < self._done_local and not self._synced:
            raise ConfigError(f"begin() again before step(): the {self._done_local} backward() call(s) of this "
                              "iteration were never stepped; call step() once per begin()")
        if self._holding:
            self._release()
        if self.reducer is None:
            self.reducer = self._new_reducer()      # the script's own hvd.init() / init_process_group adopted
        if self._meas is not None:
            self._meas.remove_hooks()
        # the first backward then stores its gradient: no memset, no add; gradients that are views of the
        # reducer's buckets (DDP's gradient_as_bucket_view) stay there, zeroed in place (no new tensor, no copy)
        self.zero_grad(set_to_none=self.reducer is None or not self.reducer.keeps_grads)
        self._n_local, self._done_local = int(n_local), 0
        self._total = int(total_samples)
        if not self._world_known:           # once per reducer: no backend call per iteration
            try:
                self._world = comm.size()
                self._world_known = self.reducer is not None
            except ValueError:              # Horovod not initialised: one process (the profiler)
                self._world = 1
        self._c = self._total / self._world if self._tw.prev is None else self._tw.prev / self._world
        self._measure = bool(measure)
        self._defer = bool(defer) and not similarity
        self._first_global = int(first_global_microbatch)
        self._halves = None if halves is None else [int(h) for h in halves]
        if self._halves is not None and len(self._halves) != self._n_local:
            raise ConfigError(f"halves has {len(self._halves)} labels for {self._n_local} local micro-batches")
        if self.reducer is not None:
            self.reducer.begin(self._n_local)
            if self.reducer.module is not None and self._model is not None and self._n_local > 1:
                self._hold.enter_context(self.reducer.no_sync())    # the script's DDP: its forwards too
                self._holding = True
        self._begun = True
        self._joined = False
        self._synced = False
        self._tw.reset()
        self._found_inf, self._found_host = None, None
        self.last_stats = None
        self.last_step_skipped = False
        self._meas = None
        if self._measure:
            labels = self._halves if self._halves is not None else \
                [(self._first_global + k) % 2 for k in range(self._n_local)]
            self._meas = Measurement([p for _, p in self.named], labels, overlap=self.overlap,
                                     similarity=similarity, reducer=self.reducer)

    def backward(self, loss: torch.Tensor, count: int, weight: torch.Tensor | float | None = None) -> None:
        """Backward of one micro-batch's mean loss, weighted by its sample count, or by ``weight`` (e.g. its
        token count, ``loss`` being the mean over those tokens): accumulates weight x grad(loss)."""
        if not self._begun or self._done_local >= self._n_local:
            self._check_backward()            # (raises: a misuse)
        w = self._tw.add(weight)
        if w is not None:
            mult: torch.Tensor | float = (w / self._c).to(loss.dtype)
            if self._done_local == self._n_local - 1 and self._tw.mode == "weighted" and self._eager():
                assert self.reducer is not None
                self._tw.launch(self.reducer)    # overlaps the last backward
        else:
            mult = count / self._c if isinstance(self._c, float) else (count / self._c).to(loss.dtype)
        if self._meas is not None:
            self._meas.start_micro(self._done_local)
        scaled = loss * mult if self.amp.scaler is None else self.amp.scale(loss * mult)
        if self.reducer is None or self._done_local >= self._n_local - 1:
            scaled.backward()                    # the last micro-batch: the reducer syncs
        else:
            with self.reducer.no_sync():         # all but the last micro-batch: the reducer does not sync
                scaled.backward()
        if self._meas is not None:
            self._meas.end_micro(count, w)    # |g_in|^2 / w: x c^2 / scale^2 in synchronize
        self._done_local += 1
        if self._holding and self._done_local == self._n_local - 1:
            self._release()                      # the last micro-batch's forward runs synced (DDP's wrap)

    def _release(self) -> None:
        self._holding = False
        self._hold.close()

    def _check_backward(self) -> None:
        if self._begun is False:
            raise ConfigError("backward() after step() without begin(): call opt.begin(n_local, total_samples) "
                              "at the start of every iteration")
        if self._begun and self._done_local >= self._n_local:
            raise ConfigError(f"backward() called {self._done_local + 1} times after begin(n_local="
                              f"{self._n_local}, ...): call it once per local micro-batch, as begin() announced")

    # ---- the token-weight reduction (runtime/token_weights.py) ---------------------------------------
    def weight_total(self) -> torch.Tensor | None:
        """The global sum of the iteration's token weights (a device scalar; None for plain losses).
        Collective on the first iteration (the mode agreement): every rank calls it, or ``synchronize``."""
        if self._done_local == 0 and not self._joined:
            self._join()
        if self._tw.mode == "plain":          # agreed at the first iteration: no weight to reduce, no call
            return None
        if self._tw.agree() != "weighted":
            return None
        assert self.reducer is not None
        return self._tw.wait(self.reducer)

    # ---- synchronize and step ------------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish the allreduce: every parameter's .grad holds the mean gradient of the S samples (token
        weights: of the W tokens), unscaled. Idempotent within an iteration (runs once after ``begin``)."""
        if self._synced:
            return
        if not self._begun:
            raise ConfigError(f"{'synchronize' if self._skip_sync else 'step'}() before begin(): call "
                              "opt.begin(n_local, total_samples) at the start of every iteration")
        if self._done_local != self._n_local:
            raise ConfigError(f"step() after {self._done_local} backward() call(s), but begin(n_local="
                              f"{self._n_local}, ...) announced {self._n_local}: call backward() once per local "
                              "micro-batch")
        if self.reducer is None:
            raise ConfigError("no backend runs in this process: call hpc_jabas.init() (or the script's own "
                              "hvd.init() or torch.distributed.init_process_group()) before the first begin()")
        if self._held is not None:            # not read since: read before another measurement reuses its names
            self._held_read = self.read_held()
        if self._done_local == 0 and not self._joined:
            self._join()
        # W: plain losses, once agreed (the first iteration's weight_total), reduce no weight
        if self.reducer.eager_extras:         # Horovod: the extra sums start beside the gradients' (named)
            if self._meas is not None:
                self._meas.launch()
            W = None if self._tw.mode == "plain" else self.weight_total()
            self.reducer.finish()
        else:                                 # torch.distributed: after the gradients, in one order on every rank
            self.reducer.finish()
            if self._meas is not None:
                self._meas.launch()
            W = None if self._tw.mode == "plain" else self.weight_total()
        grads = [p.grad for _, p in self.named if p.grad is not None] if W is not None or self._meas is not None \
            else []
        if W is not None:
            mul_(grads, self._c * self._world / W)         # sum w g / (c world), x c world / W: the token mean
        self._found_inf = None if self.amp.scaler is None else self.amp.unscale_and_check()
        self._synced = True
        if self._meas is not None:
            inv = self.amp.inv_scale()
            norm, factor = W if W is not None else self._total, self._c * inv if inv is not None else self._c
            if self._defer and self._found_inf is None:    # read later (read_held): no wait, no host read here
                self._meas.hold(grads, norm, factor)
                self._held, self._meas = (self._meas, self._total), None
        if self._meas is not None:
            self._meas.wait()
            v = self._meas.values(grads, norm, factor)
            if self._found_inf is not None:
                v = torch.cat([v, self._found_inf.to(v.dtype).reshape(1)])
            vals = v.tolist()                              # the measurement iteration's one host read
            if self._found_inf is not None:
                self._found_host = vals.pop() > 0
            self.last_stats = None if self._found_host else Measurement.stats(vals, self._total)
            self._meas = None
        self._measure = False

    def read_held(self) -> tuple[bool, GradStats | None]:
        """The measurement that an earlier ``synchronize`` held (``begin(defer=True)``), read now: its one host read,
        with no wait once its reduction is done. (True, stats) where one was held, (False, None) otherwise."""
        if self._held is None:
            out, self._held_read = self._held_read, (False, None)
            return out
        meas, total = self._held
        self._held = None
        return True, Measurement.stats(meas.read_held().tolist(), total)

    def found_inf(self) -> bool:
        """fp16: whether this iteration's reduced gradients had an inf/nan (the step is skipped); one host read."""
        if self._found_host is None:
            self._found_host = bool(self._found_inf is not None and self._found_inf.item() > 0)
        return self._found_host

    #: the lr scale a ``step()`` without one applies (a Jabas policy's lr rule sets it at iteration boundaries)
    lr_scale: float = 1.0

    def step(self, lr_scale: float | None = None, closure=None):
        """Synchronize (unless inside ``skip_synchronize()``), run the pre-step hooks and the configured
        clipping, then step with every group's lr multiplied by lr_scale (None: the attribute ``lr_scale``) for
        this step only (the user's scheduler keeps owning the base lr). With amp fp16 an inf/nan iteration skips
        the step (every rank)."""
        if lr_scale is None:
            lr_scale = self.lr_scale
        if self._skip_sync:
            if not self._synced:
                raise ConfigError("step() inside skip_synchronize() before synchronize(): the gradients are not "
                                   "reduced yet; call opt.synchronize() first")
        else:
            self.synchronize()
        self._begun = False
        if self._found_inf is not None and self.found_inf():
            self.last_step_skipped = True
            self.last_stats = None                        # statistics of a skipped step are discarded
            self.amp.update()
            return None
        for fn in list(self._pre_step_hooks.values()):
            fn(self)
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for _, p in self.named if p.grad is not None], self.clip_grad_norm,
                                           foreach=True)
        if lr_scale == 1.0:
            try:
                return self.optimizer.step(closure) if closure else self.optimizer.step()
            finally:
                if self.amp.scaler is not None:
                    self.amp.update()
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = g["lr"] * lr_scale
        try:
            return self.optimizer.step(closure) if closure else self.optimizer.step()
        finally:
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr
            self.amp.update()

    def remove_hooks(self) -> None:
        self._release()
        if self.reducer is not None:
            self.reducer.close()
        if self._meas is not None:
            self._meas.remove_hooks()


def _check_counts(n_local: object, total_samples: object) -> None:
    for v, lo, what in ((n_local, 0, "begin(n_local={!r}, ...): n_local is this rank's micro-batch count in this "
                                     "iteration, an integer >= 0"),
                        (total_samples, 1, "begin(..., total_samples={!r}): the iteration's samples on all ranks, "
                                           "an integer >= 1")):
        try:
            ok = not isinstance(v, bool) and operator.index(v) >= lo      # type: ignore[arg-type]
        except TypeError:
            ok = False
        if not ok:
            raise ConfigError(what.format(v))


def _is_ddp(model: object) -> bool:
    from torch.nn.parallel import DistributedDataParallel
    return isinstance(model, DistributedDataParallel)


def _ddp_around(params: Sequence[torch.Tensor]) -> torch.nn.Module | None:
    """The script's DistributedDataParallel wrapper of these parameters, if it made one (else DDP would reduce
    each backward on its own, and the layer's reduction would count them again). One scan of the live objects,
    at the first ``begin`` on the torch backend without ``model=``; by type only (no attribute of a foreign
    object is read)."""
    from torch.nn.parallel import DistributedDataParallel
    ids = {id(p) for p in params}
    for o in gc.get_objects():
        if issubclass(type(o), DistributedDataParallel) and any(id(p) in ids for p in o.module.parameters()):
            return o
    return None
