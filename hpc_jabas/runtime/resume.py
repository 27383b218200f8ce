"""The Checkpointer: one job's checkpoints, saved, loaded, resumed from and exported.

A checkpoint holds the model, the optimizer, the lr scheduler, the TrainState (runtime/persist/state.py:
iteration, B, plan, lr scale, pending decisions, the sampler's epoch and cursor), the controller's, the
decision protocol's, the epoch-end hook's and the calibration's states, and the RNG states. The
:class:`Checkpointer` is built from exactly these parts (typed; it never reads the trainer); rank 0
writes the file (runtime/persist/checkpoint.py: atomic, checksummed, readable by ``torch.load(weights_only=True)``),
every rank resumes from the one rank 0 found.

RNG states are per rank: ``st["rng"]["ranks"]`` is the list of every rank's own generators (torch's CPU
generator, numpy's, Python's ``random`` and, with CUDA, every device's ``torch.cuda.get_rng_state_all()``),
gathered to rank 0 when the checkpoint is written; rank r restores entry r on resume, so dropout, CPU-side
augmentation and any other draw continue on every rank exactly as without the interruption. A rank beyond
the saved list (a resume on more ranks) keeps its own generators. ``st["rng"]["torch"/"numpy"/"python"]``
(rank 0's) and ``["cuda"]`` (one state per rank, of its current device; None on CPU-only jobs) are kept as
well, as checkpoints of earlier versions held them: such a checkpoint (no "ranks") restores rank 0's CPU
states on every rank, as those versions did, and says so once. Before every checkpoint the BatchNorm running
buffers are averaged over the ranks (runtime/batchnorm.py), so the checkpoint holds the job's.
"""
from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hpc_jabas.errors import CheckpointError, ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.batchnorm import BufferAverager
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.persist import checkpoint as ckpt
from hpc_jabas.runtime.persist.dirlock import rank_error
from hpc_jabas.runtime.persist.state import Replan, TrainState
from hpc_jabas.runtime.safepoint import NonFiniteError, last_checkpoint_name
from hpc_jabas.trust import UntrustedFileError

log = get_logger(__name__)
HOOK_STATE = "hook-state.pt"     # the epoch-end hook's state after its decide step (next to the checkpoints)


class Stateful(Protocol):
    """A part whose state rides in the checkpoint."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class Metrics(Protocol):
    def write(self, rec: dict[str, Any]) -> None: ...


def cuda_rng_state() -> torch.Tensor | None:
    """This rank's CUDA generator state (its current device), None without CUDA."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def gather_cuda_rng() -> list[torch.Tensor | None] | None:
    """Collective: every rank's CUDA RNG state in rank order; None when no rank has CUDA."""
    states = list(comm.allgather_object(cuda_rng_state(), name="hj.cuda_rng"))
    return None if all(s is None for s in states) else states


def rng_states() -> dict[str, Any]:
    """This rank's own generators: torch's CPU one, numpy's, Python's ``random`` and every CUDA device's."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda_all": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def gather_rng() -> list[dict[str, Any]]:
    """Collective: every rank's :func:`rng_states`, in rank order."""
    return list(comm.allgather_object(rng_states(), name="hj.rng"))


def restore_rng(rng: dict[str, Any], rank: int) -> str:
    """This rank's generators from a checkpoint's ``rng`` entry: its own when the checkpoint holds them
    ("own"), rank 0's CPU states for a checkpoint of an earlier version ("rank 0"); "kept" for a rank beyond
    the saved ranks. The CUDA states per device, or the older per-rank current-device one."""
    ranks = rng.get("ranks")
    if ranks is not None:
        if rank >= len(ranks):
            return "kept"
        mine = ranks[rank]
        torch.set_rng_state(torch.as_tensor(mine["torch"], dtype=torch.uint8))
        np.random.set_state(tuple(mine["numpy"]))
        random.setstate(_py_state(mine["python"]))
        if mine.get("cuda_all") is not None and torch.cuda.is_available():
            states = [torch.as_tensor(x, dtype=torch.uint8).cpu() for x in mine["cuda_all"]]
            torch.cuda.set_rng_state_all(states[:torch.cuda.device_count()])
        return "own"
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(_py_state(rng["python"]))
    restore_cuda_rng(rng.get("cuda"), rank)
    return "rank 0"


def _py_state(st: Any) -> tuple:
    """Python's ``random`` state as ``random.setstate`` takes it (a checkpoint may hold its tuples as lists)."""
    version, internal, gauss = st
    return (version, tuple(internal), gauss)


def restore_cuda_rng(states: list | None, rank: int) -> bool:
    """Rank ``rank``'s saved CUDA generator state back into its device; False when there is none to restore."""
    if not states or not torch.cuda.is_available() or rank >= len(states) or states[rank] is None:
        return False
    torch.cuda.set_rng_state(torch.as_tensor(states[rank], dtype=torch.uint8).cpu())
    return True


#: keys a resume takes from the checkpoint, not from this run's configuration (the sampler's order)
KEPT_ON_RESUME = ("seed", "tail")


def describe_tensors(sd: dict[str, Any]) -> str:
    n = sum(int(t.numel()) for t in sd.values() if torch.is_tensor(t))
    return f"{len(sd)} tensors, {n} values"


def model_difference(saved: dict[str, Any], mine: dict[str, Any]) -> str | None:
    """The first difference between a checkpoint's model state_dict and this model's; None when they fit."""
    for k in mine:
        if k not in saved:
            return f"{k!r} is not in the checkpoint"
        a, b = saved[k], mine[k]
        if torch.is_tensor(a) and torch.is_tensor(b) and tuple(a.shape) != tuple(b.shape):
            return f"{k!r} is {list(a.shape)} there, {list(b.shape)} here"
    extra = [k for k in saved if k not in mine]
    return f"{extra[0]!r} is only in the checkpoint" if extra else None


#: what a resume restores from a Trainer checkpoint (state.TrainState's keys included)
REQUIRED_KEYS = ("model", "optimizer", "sampler", "iteration", "B", "plan", "lr_scale", "rng")


def optimizer_difference(saved_cls: str | None, saved: dict[str, Any], cls: str, mine: dict[str, Any]) -> str | None:
    """The first difference between a checkpoint's optimizer (its class name when recorded, its state_dict) and
    this run's; None when this run's optimizer can load it."""
    if saved_cls and saved_cls != cls:
        return f"{saved_cls} there, {cls} here"
    groups, my_groups = list(saved.get("param_groups") or []), list(mine.get("param_groups") or [])
    if len(groups) != len(my_groups):
        return f"{len(groups)} parameter group(s) there, {len(my_groups)} here"
    for i, (g, h) in enumerate(zip(groups, my_groups)):
        if len(g.get("params", [])) != len(h.get("params", [])):
            return f"parameter group {i} has {len(g.get('params', []))} parameters there, {len(h['params'])} here"
        keys, my_keys = set(g) - {"params"}, set(h) - {"params"}
        if keys != my_keys:
            only = sorted(keys - my_keys) or sorted(my_keys - keys)
            side = "there" if keys - my_keys else "here"
            return f"parameter group {i}'s settings differ ({', '.join(only)} only {side}: another optimizer)"
    return None


def finite_weights(model: torch.nn.Module) -> bool:
    """Every parameter and buffer is finite (one host read; identical on every rank after the step)."""
    ts = [t.detach() for t in model.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()]
    if not ts:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in ts]).all())


class Checkpointer:
    """Saves, loads and resumes one job's state; ``export`` writes a checkpoint's model weights alone.

    ``state``, ``model``, ``optimizer`` (the torch optimizer) and the optional ``scheduler``,
    ``controller``, ``decisions``, ``hook`` (the epoch-end hook) and ``calibration`` are the parts saved;
    ``gpu_types`` (one per rank) the world they were saved on; ``replan(B)`` plans B for this world when a
    checkpoint comes from another rank count. ``enabled=False`` (``checkpoint = false``): nothing is
    written, the collectives still run on every rank."""

    def __init__(self, state: TrainState, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 ckpt_dir: Path, rank: int, gpu_types: Sequence[str], replan: Replan,
                 metrics: Metrics, enabled: bool = True, keep: int = 3, scheduler: Any = None,
                 controller: Stateful | None = None, decisions: Stateful | None = None,
                 hook: Stateful | None = None, calibration: Stateful | None = None,
                 config: dict[str, Any] | None = None, flag_name: Callable[[str], str] | None = None) -> None:
        model = ckpt.plain_module(model)         # a torch.compile wrapper: the module it compiles (its keys)
        self.state, self.model, self.optimizer, self.scheduler = state, model, optimizer, scheduler
        self.config = config                     # the job's keys (JobConfig.to_dict), saved to compare on resume
        # how the script's command line names a key (JobConfig.flag_name): error lines name what the script has
        self.flag_name = flag_name or (lambda k: "--" + k.replace("_", "-"))
        self.changed: dict[str, Any] = {}        # on resume: what was kept from the checkpoint, what applied
        self.controller, self.decisions, self.hook, self.calibration = controller, decisions, hook, calibration
        self.ckpt_dir, self.rank, self.gpu_types = Path(ckpt_dir), rank, list(gpu_types)
        self.replan, self.metrics, self.enabled, self.keep = replan, metrics, enabled, keep
        self.bn = BufferAverager(model)
        self.saved_at: float | None = None      # wall clock of the last save (every rank)
        self.resumed_from: str | None = None    # the checkpoint resume() loaded (every rank), None: none

    @classmethod
    def of(cls, tr: Any) -> Checkpointer:
        """The Trainer's: its TrainState, model, torch optimizer, scheduler, controller, decision channel, epoch-end
        hook and calibration, saved under its run directory's checkpoints/ as its configuration says."""
        cfg = tr.cfg
        return cls(tr.state, tr.model, tr.opt.optimizer, ckpt_dir=tr.ckpt_dir, rank=tr.rank, gpu_types=tr.gpu_types,
                   replan=lambda B: tr.planner.plan(B, None), metrics=tr.metrics, enabled=cfg.checkpoint,
                   keep=cfg.keep_checkpoints, scheduler=tr.scheduler, controller=tr.controller,
                   decisions=tr.decisions, hook=tr.epoch_end_hook, calibration=tr.calib, config=cfg.to_dict(),
                   flag_name=cfg.flag_name)

    @property
    def world(self) -> int:
        return len(self.gpu_types)

    # ---- the state --------------------------------------------------------------------------
    def state_dict(self, cuda_rng: list | None = None, ranks_rng: list[dict] | None = None) -> dict[str, Any]:
        """``ranks_rng``: every rank's generators (gather_rng); by default this rank's only (a one-rank view).
        ``cuda_rng``: every rank's current-device CUDA state (what earlier versions read); by default from
        ``ranks_rng``."""
        if ranks_rng is None:
            ranks_rng = [rng_states()]
        if cuda_rng is None and torch.cuda.is_available():
            cuda_rng = [r["cuda_all"][torch.cuda.current_device()] if r.get("cuda_all") else None
                        for r in ranks_rng]
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "optimizer_class": type(self.optimizer).__name__,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                **self.state.state_dict(),       # sampler, iteration, B, plan, lr_scale, pending
                "controller": self.controller.state_dict() if self.controller is not None else None,
                "world": self.world, "gpu_types": self.gpu_types,
                "config": self.config, "model_name": type(self.model).__name__,
                "decisions": self.decisions.state_dict() if self.decisions is not None else {},
                "lifecycle": self.hook.state_dict() if self.hook is not None else None,
                "calibration": self.calibration.state_dict() if self.calibration is not None else None,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                        "cuda": cuda_rng, "ranks": ranks_rng}}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt.plain_state(st["model"]))
        self.optimizer.load_state_dict(st["optimizer"])
        if self.scheduler is not None and st.get("scheduler") is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        self.state.load_state_dict(st, self.world, self.replan)
        if self.controller is not None and st.get("controller") is not None and "policy" not in self.changed.get(
                "applied", {}):          # another policy starts afresh from the checkpoint's B
            self.controller.load_state_dict(st["controller"])
        if self.hook is not None and st.get("lifecycle"):
            self.hook.load_state_dict(dict(st["lifecycle"]))
        if self.decisions is not None:
            self.decisions.load_state_dict(st.get("decisions") or {})
        if self.calibration is not None:
            self.calibration.load_state_dict(st.get("calibration"))
        how = restore_rng(st["rng"], self.rank)
        if how == "rank 0" and self.rank == 0:
            log.warning("this checkpoint (an earlier hpc-jabas version) holds rank 0's random generators only: "
                        "every rank continues from them, so random draws (dropout) differ from an "
                        "uninterrupted run")

    # ---- saving -----------------------------------------------------------------------------
    def average_buffers(self, samples_local: int) -> bool:
        """Collective: the BatchNorm running buffers averaged over ranks by samples (runtime/batchnorm.py)."""
        return bool(self.bn(samples_local, self.state.iteration))

    def save(self, samples_local: int) -> str | None:
        """All ranks call; rank 0 writes (the state is identical on every rank); the path, on every rank.
        Non-finite weights are never written: every rank stops (safepoint.NonFiniteError), the last finite
        checkpoint stays."""
        it = self.state.iteration
        self.average_buffers(samples_local)        # every rank the same BatchNorm buffers in the checkpoint
        if self.enabled and not finite_weights(self.model):
            if self.rank == 0:
                self.metrics.write({"type": "nonfinite_stop", "it": it, "weights": True})
            raise rank_error(NonFiniteError, f"training diverged: the weights after iteration {it - 1} are not "
                             f"finite numbers; stopped without checkpointing them "
                             f"({last_checkpoint_name(self.ckpt_dir, self.enabled)}); lower the learning rate, check "
                             "the data, or use clip_grad_norm", self.rank)
        ranks_rng = gather_rng() if self.enabled else None
        path, err = None, None
        self.saved_at = time.time()
        if self.rank == 0 and self.enabled:
            try:      # a full disk, a planted link: one line on every rank, the earlier checkpoints intact
                path = ckpt.save_in(self.ckpt_dir, self.state_dict(ranks_rng=ranks_rng), self.state.epoch, it,
                                    keep=self.keep, log=log.warning)
            except (CheckpointError, ConfigError) as e:
                err = (type(e).__name__, str(e))
        path, err = comm.broadcast_object((str(path) if path else None, err), name="hj.ckpt")
        if err:
            cls = ckpt.DiskFullError if err[0] == "DiskFullError" else CheckpointError
            if self.rank == 0:
                self.metrics.write({"type": "checkpoint_failed", "it": it, "error": err[1]})
            raise rank_error(cls, err[1], self.rank)
        return path

    def save_hook_state(self, checkpoint: str | None) -> None:
        """Rank 0, after the epoch-end hook decided: its state, tied to the checkpoint it follows."""
        if self.hook is not None and checkpoint is not None:
            ckpt.save(self.ckpt_dir / HOOK_STATE, {"checkpoint": Path(checkpoint).name,
                                                   "state": self.hook.state_dict()})

    def _hook_state(self, st: dict[str, Any], path: Path) -> None:
        """Rank 0, on resume: the hook's post-decide state replaces the checkpoint's when it follows it."""
        side = self.ckpt_dir / HOOK_STATE
        if not side.exists():
            return
        try:
            hs = ckpt.load(side)
        except CheckpointError as e:
            log.warning("ignoring the epoch-end hook's state: %s", e)
            return
        if hs.get("checkpoint") == path.name:
            st["lifecycle"] = hs["state"]

    # ---- resuming ---------------------------------------------------------------------------
    def resume(self) -> str | None:
        """Collective: load the newest good checkpoint rank 0 finds (every rank the same); where it came from,
        None when there is none. Every checkpoint bad, or one others could have written: every rank raises
        with rank 0's line."""
        found, err = None, None
        if self.rank == 0:
            try:
                found = ckpt.load_latest(self.ckpt_dir, log=log.warning)
                if found:
                    self._hook_state(found[0], found[1])
            except (CheckpointError, UntrustedFileError) as e:
                err = (type(e).__name__, str(e))
        src = str(found[1]) if found else None
        st, err, src = comm.broadcast_object((found[0] if found else None, err, src), name="hj.resume")
        if err:
            raise rank_error(UntrustedFileError if err[0] == "UntrustedFileError" else CheckpointError, err[1],
                             self.rank)
        if st is None:
            return None
        try:                                     # the same checks on every rank: rank 0 says the line
            self._check_layout(st, src)
            self._check_model(st, src)
            self._check_optimizer(st, src)
            self.changed = self._check_config(st, src)
        except (CheckpointError, ConfigError) as e:
            raise rank_error(type(e), str(e), self.rank) from None
        self.load_state_dict(st)
        self.resumed_from = src if found else "broadcast"
        return self.resumed_from

    def _check_layout(self, st: Any, src: str) -> None:
        """The checkpoint holds every part a resume restores (a payload written by hpc-jabas's Trainer), else one
        line naming what is missing."""
        if not isinstance(st, dict):
            raise CheckpointError(f"{src} is not an hpc-jabas training checkpoint (it holds a "
                                  f"{type(st).__name__}, not the Trainer's state); give this run its own "
                                  f"{self.flag_name('run_dir')}")
        missing = [k for k in REQUIRED_KEYS if k not in st]
        if missing:
            raise CheckpointError(f"{src} lacks {', '.join(map(repr, missing))}, which a resume restores: it was not "
                                  "written by hpc-jabas's Trainer, or it was edited; move it out of the checkpoint "
                                  "directory to resume from the one before it, or give a new "
                                  f"{self.flag_name('run_dir')}")

    def _check_optimizer(self, st: dict[str, Any], src: str) -> None:
        """The checkpoint's optimizer is this run's: the same class (when recorded), the same number of parameter
        groups, each with as many parameters, and the same hyperparameter names; else one line naming the
        difference (torch would fail with a traceback, or load one optimizer's settings into another)."""
        saved, mine = st.get("optimizer") or {}, self.optimizer.state_dict()
        cls = type(self.optimizer).__name__
        diff = optimizer_difference(st.get("optimizer_class"), saved, cls, mine)
        if diff is None:
            return
        raise CheckpointError(f"{src} holds the state of another optimizer than this script's: {diff}. Resume with "
                              f"the optimizer that run used, or give a new {self.flag_name('run_dir')} to start over "
                              f"with {cls}")

    def _check_model(self, st: dict[str, Any], src: str) -> None:
        """The checkpoint holds this model (the same tensor names and shapes), else one line naming both."""
        saved, mine = ckpt.plain_state(st.get("model") or {}), self.model.state_dict()
        diff = model_difference(saved, mine)
        if diff is None:
            return
        theirs = f"{st.get('model_name') or 'a model'} ({describe_tensors(saved)})"
        raise CheckpointError(f"{src} holds another model than this script's: {theirs} vs "
                              f"{type(self.model).__name__} ({describe_tensors(mine)}); {diff}. Give this run its "
                              f"own {self.flag_name('run_dir')}, or resume that one with the model it trained")

    def _check_config(self, st: dict[str, Any], src: str) -> dict[str, Any]:
        """The keys that differ from the checkpoint's run: batch is refused (a resume keeps the run's B); the seed
        and tail are kept (the sampler's order continues); every other key is applied. Said by rank 0."""
        saved, now = st.get("config"), self.config
        if not saved or not now:
            return {}                            # a checkpoint of an earlier version, or a Checkpointer without one
        diff = {k: (saved[k], now[k]) for k in now if k in saved and saved[k] != now[k] and k != "run_dir"}
        if "batch" in diff:
            old, new = diff["batch"]
            raise ConfigError(f"{src} was trained from batch={old} (B={st.get('B')} at this checkpoint) and this run "
                              f"asks batch={new}: a resume keeps its run's B; drop {self.flag_name('batch')} to "
                              f"resume, or give a new {self.flag_name('run_dir')} to start over with batch={new}")
        kept = {k: v for k, v in diff.items() if k in KEPT_ON_RESUME}
        applied = {k: v for k, v in diff.items() if k not in KEPT_ON_RESUME}
        if diff and self.rank == 0:
            text = [f"kept from the checkpoint: {', '.join(f'{k}={o!r} (not {n!r})' for k, (o, n) in kept.items())}"
                    ] if kept else []
            text += [f"applied: {', '.join(f'{k} {o!r} -> {n!r}' for k, (o, n) in applied.items())}"] if applied else []
            if "policy" in applied:
                text.append(f"the policy {applied['policy'][1]!r} starts afresh from B={st.get('B')}")
            log.info("resuming %s with changed settings: %s", src, "; ".join(text))
        return {"kept": {k: o for k, (o, _) in kept.items()}, "applied": {k: n for k, (_, n) in applied.items()}}

    def announce_resume(self, source: str) -> None:
        """Rank 0: the log line and the ``resume`` record of metrics.jsonl."""
        if self.rank != 0:
            return
        s = self.state
        log.info("resumed from %s at epoch %d, cursor %d, iteration %d, B=%d", source, s.epoch, s.cursor,
                 s.iteration, s.B)
        self.metrics.write({"type": "resume", "it": s.iteration, "epoch": s.epoch, "cursor": s.cursor,
                            "world": self.world, "B": s.B, "plan": str(s.plan), "from": source,
                            "changed": self.changed})

    # ---- exporting --------------------------------------------------------------------------
    @staticmethod
    def model_weights(path: Path) -> dict[str, torch.Tensor]:
        """The ``model`` entry of a verified checkpoint (ConfigError when it is not a Trainer checkpoint)."""
        try:
            st = ckpt.load(path)
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
        model = st.get("model") if isinstance(st, dict) else None
        if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
            raise ConfigError(f"{str(path)!r} is not an hpc-jabas training checkpoint (no 'model' state_dict in it)")
        return ckpt.plain_state(model)        # the plain model's keys, a compiled model's checkpoint of old too

    @classmethod
    def export(cls, path: Path, out: Path) -> dict[str, torch.Tensor]:
        """Checkpoint ``path``'s model weights to ``out`` as a plain ``torch.save`` of the state_dict (replaced
        atomically); ``model.load_state_dict(torch.load(out, weights_only=True))`` reads it."""
        state = cls.model_weights(path)
        buf = io.BytesIO()
        torch.save(state, buf)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, out)
        return state
