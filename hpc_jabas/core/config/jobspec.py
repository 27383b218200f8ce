"""What a job in a resubmission chain runs: picklable (submitit) and JSON-able (sbatch)."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from hpc_jabas.core.config.textfile import read_json
from hpc_jabas.errors import ConfigError

#: the keys of a job file's [job] table
JOB_KEYS = ("task", "chain_dir", "method", "pythonpath", "python", "mix")
JOB_EXAMPLES = {"task": '"mymodule:build"', "chain_dir": '"/scratch/me/chain"', "method": '"sbatch"',
                "python": '"/home/me/venv/bin/python"'}


def check_job_table(job: Any, path: str | Path) -> dict[str, Any]:
    """A job file's raw [job] table: unknown keys (e.g. config keys written after the [job] header, which TOML
    puts inside that table) and values of the wrong type are one ConfigError line each, not a traceback later.
    ``hpc-jabas submit`` and the job's launcher both check it here."""
    if not isinstance(job, dict):
        raise ConfigError(f"job = {job!r} in {path} must be a [job] table")
    bad = [k for k in job if k not in JOB_KEYS]
    if bad:
        raise ConfigError(f"unknown [job] key {bad[0]!r} in {path}; valid: {', '.join(JOB_KEYS)} (training keys go "
                          "before the [job] header or in a [train] table: after a header TOML puts keys in that table)")
    for k in ("task", "chain_dir", "method", "python"):
        if k in job and not isinstance(job[k], str):
            raise ConfigError(f"[job] {k} = {job[k]!r} in {path} must be a string in quotes, e.g. "
                              f"{k} = {JOB_EXAMPLES[k]}")
    pp = job.get("pythonpath")
    if pp is not None and not (isinstance(pp, str) or isinstance(pp, list) and all(isinstance(x, str) for x in pp)):
        raise ConfigError(f"[job] pythonpath = {pp!r} in {path} must be a list of directories in quotes, "
                          'e.g. pythonpath = ["/home/me/project"]')
    if "mix" in job and not isinstance(job["mix"], dict):
        raise ConfigError(f"[job] mix = {job['mix']!r} in {path} must be a table, e.g. mix = {{ a100 = 1, v100 = 2 }}")
    return job


@dataclass(frozen=True)
class SlurmRequest:
    """The Slurm options given for a job's submissions (``hpc-jabas submit``'s flags, ``JobSpec(slurm=...)``, or
    the older ``JobSpec(extra={...})``). A field left None is the job config's [slurm] key, else the default:
    ``hpc_jabas.slurm.components.SlurmOptions.of(spec)`` resolves them and checks every value at once (one line
    for a bad value) before anything is written or submitted; the numbers may also be given in their flag
    forms ("60", 60.0)."""
    time_min: int | None = None                 # the [slurm] keys (core/config/sections.py JobConfig)
    signal_lead_s: int | None = None
    max_timeouts: int | None = None
    max_failures: int | None = None
    mem_per_task_mb: int | None = None          # memory per rank (default 512)
    job_name: str | None = None                 # default "hpc-jabas"
    account: str | None = None                  # Slurm names: letters, digits, _ . + -
    qos: str | None = None
    sbatch_args: list[str] | str | None = None  # --flag or --flag=value items (or one shell-quoted string of them)

    @classmethod
    def of(cls, given: SlurmRequest | Mapping[str, Any] | None) -> SlurmRequest:
        """From a mapping of option -> value (a JSON job spec's table, ``extra=``); an unknown option is one line."""
        if given is None:
            return cls()
        if isinstance(given, SlurmRequest):
            return given
        if not isinstance(given, Mapping):
            raise ConfigError(f"Slurm options {given!r} must be a table of option -> value, e.g. "
                              "{'account': 'proj-1'}")
        names = [f.name for f in dataclasses.fields(cls)]
        bad = [k for k in given if k not in names]
        if bad:
            raise ConfigError(f"unknown Slurm option {bad[0]!r}; valid: {', '.join(names)}")
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The options given (those not None)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass
class JobSpec:
    task: str                          # "module:callable" -> a hpc_jabas.Task (or the older dict)
    config: dict[str, Any]                     # JobConfig as a dict (its autoscale table drives the epoch-end choice)
    chain_dir: str                     # shared directory: run/ (metrics, checkpoints), chain.jsonl, jobs/
    mix: dict[str, int]                # partition -> GPUs this job runs on
    method: str = "submitit"           # how the next job is submitted: submitit | sbatch
    pythonpath: list[str] = field(default_factory=list)
    python: str | None = None          # interpreter for sbatch jobs (default: the submitting one)
    slurm: SlurmRequest = field(default_factory=SlurmRequest)   # the Slurm options given (a mapping is read)
    #: the older form of ``slurm``: a mapping of option -> value, read into ``slurm`` (over what it holds)
    extra: InitVar[Mapping[str, Any] | None] = None

    def __post_init__(self, extra: Mapping[str, Any] | None = None) -> None:
        self.slurm = SlurmRequest.of(self.slurm)
        if extra:
            if not isinstance(extra, Mapping):
                raise ConfigError(f"extra={extra!r} must be a table of Slurm option -> value, e.g. "
                                  "{'account': 'proj-1'}")
            self.slurm = SlurmRequest.of({**self.slurm.given(), **extra})
        if ":" not in self.task:
            raise ConfigError(f"task {self.task!r} must be 'module:callable', e.g. examples.train_digits:build")
        if self.method not in ("submitit", "sbatch"):
            raise ConfigError(f"method {self.method!r} is unknown; valid: submitit, sbatch")
        if not self.mix or any((not isinstance(v, int)) or v < 1 for v in self.mix.values()):
            raise ConfigError(f"mix {self.mix!r} is invalid; give partition -> GPU count >= 1, e.g. {{'v100': 2}}")

    @property
    def run_dir(self) -> str:
        return str(Path(self.chain_dir) / "run")

    def with_mix(self, mix: dict[str, int]) -> JobSpec:
        return dataclasses.replace(self, mix=dict(mix))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobSpec:
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        return cls.from_dict(read_json(path, "job spec", "the JSON job spec hpc-jabas submit wrote"))
