"""The job entry point inside Slurm (or mpirun): build the user's task, resume, train, auto-scale.

    python -m hpc_jabas.runtime.launch SPEC.json        # a JobSpec written by hpc_jabas.slurm.executor
    python -m hpc_jabas.runtime.launch JOB.toml         # by hand: [job] task/chain_dir/method + config keys

Every rank runs this. The current mix is read from the ranks' Slurm partitions (allgather).
Returns (rank 0) a summary dict; submitit hands it back through its usual job objects.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

from hpc_jabas.core.jobspec import JobSpec
from hpc_jabas.core.loader import load_callable
from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.hooks import Callback
from hpc_jabas.slurm import chain as chainlog

log = get_logger(__name__)


def spec_from_file(path: str) -> JobSpec:
    p = Path(path)
    if p.suffix == ".json":
        return JobSpec.load(p)
    from hpc_jabas.core.config import read_toml
    d = read_toml(p, "job file")
    job = d.pop("job", None)
    if not job or "task" not in job or "chain_dir" not in job:
        raise ConfigError(f"job file {path!r} needs a [job] table with task = 'module:callable' and chain_dir")
    valid = ("task", "chain_dir", "method", "pythonpath", "python", "mix")
    bad = [k for k in job if k not in valid]
    if bad:
        raise ConfigError(f"job file {path!r}: unknown [job] key {bad[0]!r} (valid: {', '.join(valid)}); "
                          "training keys go in another table, e.g. [train]")
    return JobSpec(task=job["task"], config=d, chain_dir=str(Path(job["chain_dir"]).resolve()),
                   mix=job.get("mix") or {"unknown": 1}, method=job.get("method", "sbatch"),
                   pythonpath=job.get("pythonpath", []), python=job.get("python"))


def current_mix(comm) -> dict[str, int]:
    from hpc_jabas.slurm.cluster import rank_partition
    part = rank_partition(os.environ) or "local"
    return dict(sorted(Counter(comm.allgather_object(part, name="hj.mix")).items()))


def run_job(spec: JobSpec | dict) -> dict | None:
    if isinstance(spec, dict):
        spec = JobSpec.from_dict(spec)
    for p in spec.pythonpath:
        if p not in sys.path:
            sys.path.insert(0, p)
    from hpc_jabas.core.config import JobConfig
    from hpc_jabas.runtime import comm
    from hpc_jabas.runtime.lifecycle import EpochEndAutoscaler
    from hpc_jabas.runtime.trainer import Trainer

    parts = load_callable(spec.task, "task")()     # before Horovod's background thread starts polling
    comm.init()
    rank = comm.rank()
    mix = current_mix(comm)
    if "local" not in mix:
        spec = spec.with_mix(mix)
    job_id = os.environ.get("SLURM_HET_JOB_ID") or os.environ.get("SLURM_JOB_ID") or f"local-{os.getpid()}"
    cfgd = dict(spec.config)
    cfgd["run_dir"] = spec.run_dir
    cfgd.pop("job", None)
    cfg = JobConfig.from_dict(cfgd)
    submit_fn = None
    if "local" not in mix:
        from hpc_jabas.slurm.executor import submit_job
        submit_fn = submit_job
    hook = EpochEndAutoscaler(spec, submit_fn=submit_fn, job_id=job_id)
    t0 = time.time()
    restart = RestartOverheadCallback(spec.chain_dir, job_id, hook, trainer_start=t0)
    tr = Trainer(parts["model"], parts["optimizer"], parts["dataset"], parts["loss_fn"], config=cfg,
                 scheduler=parts.get("scheduler"), eval_fn=parts.get("eval_fn"), epoch_end_hook=hook,
                 scheduler_step=parts.get("scheduler_step", "epoch"), callbacks=[restart])
    resumed = restart.resumed = tr.maybe_resume()
    if rank == 0:
        chainlog.append(spec.chain_dir, "start", job_id=job_id, mix=mix, world=tr.world, epoch=tr.sampler.epoch,
                        iteration=tr.iteration, resumed=resumed, gpu_types=tr.gpu_types)
    res = tr.fit(resume=False)
    wall = time.time() - t0
    rates = {}
    try:
        from hpc_jabas.slurm.cluster import read_cluster
        if "local" not in mix:
            rates = read_cluster(hook.cfg.partition_types).billing
    except JabasError:
        rates = {}
    cost = sum(n * rates.get(p, 0.0) for p, n in mix.items()) * wall / 3600.0
    moved = tr.moved_to.to_dict() if tr.moved_to is not None else None
    if rank == 0:
        chainlog.append(spec.chain_dir, "end", job_id=job_id, epochs=tr.sampler.epoch, wall_s=wall, cost=cost,
                        state="moved" if moved else "finished", iteration=tr.iteration)
    summary = {"job_id": job_id, "mix": mix, "epoch": tr.sampler.epoch, "iteration": tr.iteration,
               "moved_to": moved, "params_sha": _params_digest(tr.model), "B": tr.B, **res}
    return summary if rank == 0 else None


class RestartOverheadCallback(Callback):
    """Rank 0, after the first iteration of a job that resumed after a move: the restart overhead
    (move's checkpoint -> now) goes to the auto-scaler's state and the chain log."""

    def __init__(self, chain_dir: str, job_id: str, hook, trainer_start: float):
        self.chain_dir, self.job_id, self.hook, self.trainer_start = chain_dir, job_id, hook, trainer_start
        self.resumed = False

    def on_first_step(self, trainer) -> None:
        if trainer.rank != 0 or not self.resumed:
            return
        moves = [e for e in chainlog.read(self.chain_dir)
                 if e["event"] == "move" and str(e.get("to_job")) == str(self.job_id)]
        if moves:
            overhead = time.time() - float(moves[-1]["checkpoint_time"])
            self.hook.record_restart(overhead)
            # since_move_s: move recorded -> this job's trainer built (Slurm queue + start-up)
            chainlog.append(self.chain_dir, "restart", job_id=self.job_id, overhead_s=overhead,
                            since_move_s=(self.trainer_start - float(moves[-1]["time"])))


def _params_digest(model) -> str:
    import hashlib
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        log.error("usage: python -m hpc_jabas.runtime.launch SPEC.json|JOB.toml")
        return 2
    try:
        run_job(spec_from_file(argv[0]))
    except JabasError as e:
        log.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
