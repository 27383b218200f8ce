"""The Trainer's state, checkpoints and resume (a mixin of runtime/trainer.Trainer).

``state_dict``/``load_state_dict`` hold everything a resume needs (model, optimizer, scheduler,
sampler cursor, iteration, B, plan, controller, decisions, lifecycle hook, RNG states); rank 0
writes checkpoints (runtime/checkpoint.py), every rank resumes from the one rank 0 found.

RNG states: torch's CPU generator, numpy and Python's ``random`` are rank 0's (restored on every
rank). The CUDA generators are per rank: ``st["rng"]["cuda"]`` is the list of every rank's
``torch.cuda.get_rng_state()`` of its device (gathered to rank 0 when the checkpoint is written),
and rank r restores entry r on resume (a rank beyond the saved list keeps its own). On CPU-only
jobs it is None: there is no CUDA state to save. Before every checkpoint the BatchNorm running
buffers are averaged over the ranks (runtime/batchnorm.py), so the checkpoint holds the job's.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpc_jabas.errors import CheckpointError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime import checkpoint as ckpt
from hpc_jabas.runtime import comm
from hpc_jabas.runtime.progress import refuse_finished
from hpc_jabas.trust import UntrustedFileError

Trainer = Any      # runtime/trainer.Trainer (not imported: the trainer imports this module)

log = get_logger(__name__)
HOOK_STATE = "hook-state.pt"     # the epoch-end hook's state after its decide step (next to the checkpoints)


def cuda_rng_state() -> torch.Tensor | None:
    """This rank's CUDA generator state (its current device), None without CUDA."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def gather_cuda_rng() -> list[torch.Tensor | None] | None:
    """Collective: every rank's CUDA RNG state in rank order; None when no rank has CUDA."""
    states = list(comm.allgather_object(cuda_rng_state(), name="hj.cuda_rng"))
    return None if all(s is None for s in states) else states


def bn_average(tr: Trainer) -> bool:
    """Collective: the BatchNorm running buffers averaged over ranks by samples (runtime/batchnorm.py)."""
    from hpc_jabas.runtime.batchnorm import BufferAverager
    avg = tr.__dict__.get("_bn_averager")
    if avg is None or avg.model is not tr.model:
        avg = tr.__dict__["_bn_averager"] = BufferAverager(tr.model)
    return bool(avg(tr.samples_local, tr.iteration))


def state_dict(tr: Trainer, cuda_rng: list | None = None) -> dict:
    """``cuda_rng``: every rank's CUDA RNG state (gather_cuda_rng); by default this rank's only."""
    if cuda_rng is None and torch.cuda.is_available():
        cuda_rng = [cuda_rng_state()]
    return {"model": tr.model.state_dict(), "optimizer": tr.opt.optimizer.state_dict(),
            "scheduler": tr.scheduler.state_dict() if tr.scheduler is not None else None,
            **tr.state.state_dict(),      # sampler, iteration, B, plan, lr_scale, pending (runtime/state.py)
            "controller": tr.controller.state_dict() if tr.controller is not None else None,
            "world": tr.world, "gpu_types": tr.gpu_types, "decisions": tr.decisions.state_dict(),
            "lifecycle": tr.epoch_end_hook.state_dict() if tr.epoch_end_hook is not None else None,
            "calibration": tr.calib.state_dict() if getattr(tr, "calib", None) is not None else None,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": cuda_rng}}


def load_state_dict(tr: Trainer, st: dict) -> None:
    tr.model.load_state_dict(st["model"])
    tr.opt.optimizer.load_state_dict(st["optimizer"])
    if tr.scheduler is not None and st.get("scheduler") is not None:
        tr.scheduler.load_state_dict(st["scheduler"])
    tr.state.load_state_dict(st, tr.world, replan=lambda B: tr.planner_fn(B, None))
    if tr.controller is not None and st.get("controller") is not None:
        tr.controller.load_state_dict(st["controller"])
    if tr.epoch_end_hook is not None and st.get("lifecycle"):
        tr.epoch_end_hook.load_state_dict(dict(st["lifecycle"]))
    tr.decisions.load_state_dict(st.get("decisions") or {})
    if getattr(tr, "calib", None) is not None:
        tr.calib.load_state_dict(st.get("calibration"))
    torch.set_rng_state(st["rng"]["torch"])
    np.random.set_state(st["rng"]["numpy"])
    random.setstate(st["rng"]["python"])
    restore_cuda_rng(st["rng"].get("cuda"), tr.rank)


def restore_cuda_rng(states: list | None, rank: int) -> bool:
    """Rank ``rank``'s saved CUDA generator state back into its device; False when there is none to restore."""
    if not states or not torch.cuda.is_available() or rank >= len(states) or states[rank] is None:
        return False
    torch.cuda.set_rng_state(torch.as_tensor(states[rank], dtype=torch.uint8).cpu())
    return True


def finite_weights(tr: Trainer) -> bool:
    """Every parameter and buffer is finite (one host read; identical on every rank after the step)."""
    ts = [t.detach() for t in tr.model.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()]
    if not ts:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in ts]).all())


def save_checkpoint(tr: Trainer) -> str | None:
    """All ranks call; rank 0 writes (the state is identical on every rank). Non-finite weights are never
    written: every rank stops (safepoint.NonFiniteError) and the last finite checkpoint stays."""
    tr.flush_metrics()
    bn_average(tr)                      # every rank the same BatchNorm buffers in the checkpoint
    if tr.cfg.checkpoint and not finite_weights(tr):
        from hpc_jabas.runtime.dirlock import rank_error
        from hpc_jabas.runtime.safepoint import NonFiniteError, last_checkpoint_name
        if tr.rank == 0:
            tr.metrics.write({"type": "nonfinite_stop", "it": tr.iteration, "weights": True})
        raise rank_error(NonFiniteError, f"training diverged: the weights after iteration {tr.iteration - 1} are "
                         f"not finite numbers; stopped without checkpointing them ({last_checkpoint_name(tr)}); "
                         "lower the learning rate, check the data, or use clip_grad_norm", tr.rank)
    cuda_rng = gather_cuda_rng() if tr.cfg.checkpoint else None
    path = None
    tr.last_checkpoint_time = time.time()
    tr._periodic.mark(tr.iteration)
    if tr.rank == 0 and tr.cfg.checkpoint:
        path = ckpt.save_in(tr.ckpt_dir, state_dict(tr, cuda_rng), tr.sampler.epoch, tr.iteration,
                            keep=tr.cfg.keep_checkpoints)
    return comm.broadcast_object(str(path) if path else None, name="hj.ckpt")


def save_hook_state(tr: Trainer, checkpoint: str | None) -> None:
    """Rank 0, after the epoch-end hook decided: its state, tied to the checkpoint it follows."""
    if tr.epoch_end_hook is not None and checkpoint is not None:
        ckpt.save(tr.ckpt_dir / HOOK_STATE, {"checkpoint": Path(checkpoint).name,
                                               "state": tr.epoch_end_hook.state_dict()})


def load_hook_state(tr: Trainer, st: dict, path: Path) -> None:
    """Rank 0, on resume: the hook's post-decide state replaces the checkpoint's when it follows it."""
    side = tr.ckpt_dir / HOOK_STATE
    if not side.exists():
        return
    try:
        hs = ckpt.load(side)
    except CheckpointError as e:
        log.warning("ignoring the epoch-end hook's state: %s", e)
        return
    if hs.get("checkpoint") == path.name:
        st["lifecycle"] = hs["state"]


def lock_run_dir(tr: Trainer, wait_s: float = 0.0) -> None:
    """Collective: rank 0 holds the run directory for the process's life; a second writer is refused."""
    from hpc_jabas.runtime.dirlock import lock_on_rank0
    lock_on_rank0(tr.run_dir, tr.rank, "run directory", wait_s=wait_s)


def maybe_resume(tr: Trainer, epochs: int | None = None) -> bool:
    """Resume from the run_dir's latest checkpoint; a finished one stops the job (progress.refuse_finished)."""
    tr.lock_run_dir()
    found, err = None, None
    if tr.rank == 0:
        try:
            found = ckpt.load_latest(tr.ckpt_dir, log=log.warning)
            if found:
                load_hook_state(tr, found[0], found[1])
        except (CheckpointError, UntrustedFileError) as e:
            # every checkpoint bad, or one that others could have written: every rank stops with rank 0's line
            err = (type(e).__name__, str(e))
    st, err = comm.broadcast_object((found[0] if found else None, err), name="hj.resume")
    if err:
        from hpc_jabas.runtime.dirlock import rank_error
        raise rank_error(UntrustedFileError if err[0] == "UntrustedFileError" else CheckpointError, err[1], tr.rank)
    if st is None:
        return False
    tr.load_state_dict(st)
    tr.resumed_from = str(found[1]) if found else "broadcast"
    refuse_finished(tr, epochs or tr.cfg.epochs)
    if tr.rank == 0:
        log.info("resumed from %s at epoch %d, cursor %d, iteration %d, B=%d", tr.resumed_from,
                 tr.sampler.epoch, tr.sampler.cursor, tr.iteration, tr.B)
        tr.metrics.write({"type": "resume", "it": tr.iteration, "epoch": tr.sampler.epoch,
                            "cursor": tr.sampler.cursor, "world": tr.world, "B": tr.B,
                            "plan": str(tr.plan), "from": tr.resumed_from})
    return True
