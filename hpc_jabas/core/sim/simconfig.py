"""What the simulator reads: a cluster, a job, the gradient statistics over training, a queue model. Pure.

``hpc-jabas simulate CLUSTER.toml JOB.toml`` (core/sim/simulate.py runs it; docs/simulator.md). Every
problem in a file is one ConfigError line naming the file, the key and what is valid.

Cluster file: top-level ``name``, ``restart_s`` (checkpoint -> first iteration of the next job, what a
move costs in time and, at the new mix's rate, in money); one ``[[partition]]`` table per partition
(``name``, ``gpu`` a catalog type, ``nodes``, ``gpus_per_node``, ``rate`` per GPU-hour: a billing weight
or a price, default the catalog's; ``wait``: its queue wait distribution); ``[queue]`` (``seed``,
``period_s``: the queue state is redrawn every period of simulated time; ``trace``: a CSV of
``time_s,partition,wait_s`` rows instead of the distributions; ``estimate``: what a queue-aware
decision sees, ``exact`` (the wait the job then has: a perfect ``sbatch --test-only``) or ``mean``).

Job file: the data (``samples`` per epoch, ``epochs``), the batch (``batch`` B0, ``batch_min``,
``batch_max``, ``micro_batch``, ``p``), the initial ``mix`` (default: every GPU of the cluster),
``stop`` ("progress": train until the statistical progress of ``epochs`` epochs at B0 is made,
each sample counting E(B) = (B_noise + B0) / (B_noise + B); "samples": exactly ``epochs`` epochs),
``seed``; ``[model]`` (the perf model: ``profile_dir``, or the emulated model of ``base_s``,
``per_sample_s`` on a V100, ``b_list``, ``grad_mb``, ``bandwidth_gbs``, ``overlap`` and one relative
speed per GPU type in ``[model.speeds]``; and what a run costs besides its iterations, measured on a
run of the same job: ``measure_factor`` (>= 1, default 1: a measurement iteration of an adaptive policy
takes this many times a normal one) and ``epoch_end_s`` (seconds per epoch end: evaluation, checkpoint;
default 0)); ``[gradstats]`` (the curve, below); ``[policy]``
(``gamma``, ``alpha``, ``ramp_at``, ``ramp_factor``, ``warmup``, and goodput's ``measure_every``: a
noise-only measurement every N iterations between decisions, each drawn as a decision's and given to the
policy, priced as a normal iteration; ``noise_memory``: its estimate's memory in samples); ``[autoscale]``
(``max_gpus``, ``min_gpus``, ``max_partitions``, ``unit`` (0: whole nodes), ``exact_upto``, ``margin``,
``restart_prior_s``, ``budget`` (default: the SimiGrad row's cost), ``max_queue_wait_s``,
``max_nodes``, ``max_evals``: the search's work caps, ``forecast_history``: decisions the
forecaster sees).

Gradient statistics (``[gradstats] curve``), the noise scale B_noise(u) at training progress u in [0, 1]:

- ``mccandlish``: B_noise grows as the loss falls (McCandlish et al. 2018, "An Empirical Model of
  Large-Batch Training": B_noise ~ 1 / loss over a run). B_noise(u) = b_start / L(u), L(u) = l_end +
  (1 - l_end) exp(-u / tau), l_end = b_start / b_end: b_start at the start, towards b_end at the end.
- ``merrill``: the rise-then-plateau of the critical batch size that Merrill et al. (2025, "Critical
  Batch Size Revisited") measured on OLMo: B(u) = b_min + (b_plateau - b_min) (1 - exp(-u / u_rise)).
  The shape is theirs; the numbers are parameters, not their fit.
- ``trace``: a recorded run's ``metrics.jsonl`` (``path``): its decision records' ``stats.b_noise``
  (or, without one, the noise scale the similarity implies), u = the share of the run's samples trained
  before each decision (iteration / last iteration for a file without iteration records). The policies
  then get the run's own measurements at that progress (the records' fresh ``g2``, ``s`` as the run's
  policy got them, or in older files the smoothed ``G2``, ``S_trace``; and ``similarity``; interpolated
  between records), not the model below; a ``measure_every`` measurement between decisions replays the
  run's measured iteration nearest in progress (its iteration records' norms).

From B_noise the policies get what they measure: the goodput policy (|G|^2, tr(Sigma)) = (1, B_noise);
the similarity policy the expected cosine of two half-batch means of B/2 samples each,
B / (B + 2 B_noise); both times a lognormal measurement noise of ``noise`` (sigma, seeded).
"""
from __future__ import annotations

import csv
import json
import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpc_jabas.core.adaptive.policy import DEFAULT_GOODPUT_WARMUP, default_batch_range
from hpc_jabas.core.adaptive.stats import noise_scale_terms
from hpc_jabas.core.config import gpus as catalog
from hpc_jabas.core.config import textfile
from hpc_jabas.core.config.schema import Section, key, like, read_table
from hpc_jabas.core.config.sections import AutoscaleConfig, JobConfig
from hpc_jabas.core.config.textfile import read_text
from hpc_jabas.errors import ConfigError

CURVES = ("mccandlish", "merrill", "trace")
WAIT_DISTS = ("none", "fixed", "exponential", "lognormal")
STOPS = ("progress", "samples")


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    return textfile.read_toml(path, what, "a TOML file")


# ---------------------------------------------------------------- the queue

@dataclass(frozen=True)
class WaitDist:
    """A partition's queue wait (s): none, fixed (``mean_s``), exponential (``mean_s``) or lognormal
    (``median_s``, ``sigma``)."""

    dist: str = "none"
    mean_s: float = 0.0
    median_s: float = 0.0
    sigma: float = 1.0

    def draw(self, rng: np.random.Generator) -> float:
        if self.dist == "none":
            return 0.0
        if self.dist == "fixed":
            return self.mean_s
        if self.dist == "exponential":
            return float(rng.exponential(self.mean_s)) if self.mean_s > 0 else 0.0
        return float(self.median_s * math.exp(self.sigma * float(rng.standard_normal())))

    @property
    def mean(self) -> float:
        if self.dist == "lognormal":
            return self.median_s * math.exp(self.sigma ** 2 / 2)
        return 0.0 if self.dist == "none" else self.mean_s


@dataclass
class WaitKeys(Section):
    """A partition's ``wait`` table."""
    dist: str = key("none", "queue wait distribution", choices=WAIT_DISTS)
    mean_s: float = key(0.0, "mean wait (fixed, exponential), seconds", lo=0.0)
    median_s: float = key(0.0, "median wait (lognormal), seconds", lo=0.0)
    sigma: float = key(1.0, "lognormal sigma", lo=0.0)


@dataclass
class PartitionKeys(Section):
    """One ``[[partition]]`` table."""
    name: str = key("", "partition name")
    gpu: str = key("", "GPU type (catalog name)")
    nodes: int = key(1, "nodes", lo=1)
    gpus_per_node: int = key(4, "GPUs per node", lo=1)
    rate: float | None = key(None, "rate per GPU-hour (billing weight or price)", lo=0.0, shown="the catalog's")
    wait: dict[str, Any] | None = key(None, "queue wait distribution table", shown="none")


@dataclass
class QueueKeys(Section):
    """The cluster file's ``[queue]`` table."""
    seed: int = key(0, "seed of the queue's waits", lo=0)
    period_s: float = key(3600.0, "the waits are redrawn every period of simulated time", lo=0.0, lo_open=True)
    trace: str | None = key(None, "CSV of time_s,partition,wait_s rows", shown="none")
    estimate: str = key("exact", "what a queue-aware decision sees", choices=("exact", "mean"))


@dataclass
class ClusterKeys(Section):
    """The cluster file's top level."""
    name: str = key("cluster", "the cluster's name")
    restart_s: float = key(60.0, "checkpoint -> first iteration of the next job (s)", lo=0.0)
    partition: Any = key(None, "[[partition]] tables")
    queue: dict[str, Any] = key({}, "[queue] table")


def _wait(d: Any, where: str) -> WaitDist:
    if d is None:
        return WaitDist()
    k = read_table(WaitKeys, d, where)
    dist = k.dist
    out = WaitDist(dist, k.mean_s, k.median_s, k.sigma)
    if dist in ("fixed", "exponential") and "mean_s" not in d or dist == "lognormal" and "median_s" not in d:
        raise ConfigError(f"{where}: dist={dist!r} needs {'median_s' if dist == 'lognormal' else 'mean_s'}")
    return out


@dataclass(frozen=True)
class Partition:
    name: str
    gpu: str
    nodes: int
    gpus_per_node: int
    rate: float
    wait: WaitDist = field(default_factory=WaitDist)

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class QueueModel:
    """The wait a job submitted at simulated time t on a mix has: the largest of its partitions' waits
    (a heterogeneous job starts when its last component does). The waits at t come from the partitions'
    distributions, redrawn every ``period_s`` from a generator seeded by (seed, partition, period): the
    same for every strategy at the same time (common random numbers), whatever was asked before. With a
    ``trace`` (time_s, partition, wait_s rows), a partition's wait at t is its last row at or before t."""

    partitions: dict[str, Partition]
    seed: int = 0
    period_s: float = 3600.0
    trace: dict[str, tuple[list[float], list[float]]] | None = None
    estimate: str = "exact"

    def part_wait(self, part: str, t: float) -> float:
        if self.trace is not None:
            ts, ws = self.trace.get(part, ([], []))
            i = bisect_right(ts, t) - 1
            return ws[i] if i >= 0 else 0.0
        k = int(t // self.period_s) if self.period_s > 0 else 0
        idx = sorted(self.partitions).index(part)
        rng = np.random.default_rng([self.seed, idx, k])
        return self.partitions[part].wait.draw(rng)

    def wait(self, mix: Mapping[str, int], t: float) -> float:
        return max((self.part_wait(p, t) for p, n in mix.items() if n), default=0.0)

    def expected(self, mix: Mapping[str, int], t: float) -> float:
        """What a queue-aware decision sees at t: the wait itself ('exact') or the distributions' means."""
        if self.estimate == "exact" or self.trace is not None:
            return self.wait(mix, t)
        return max((self.partitions[p].wait.mean for p, n in mix.items() if n), default=0.0)


def _read_trace(path: Path, parts: Mapping[str, Partition]) -> dict[str, tuple[list[float], list[float]]]:
    if not path.is_file():
        raise ConfigError(f"queue trace {str(path)!r} does not exist; give a CSV of time_s,partition,wait_s rows")
    rows: dict[str, list[tuple[float, float]]] = {}
    text = read_text(path, "queue trace", "a CSV of time_s,partition,wait_s rows")
    for i, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or row[0].strip().startswith("#") or row[0].strip() == "time_s":
            continue
        try:
            t, part, w = float(row[0]), row[1].strip(), float(row[2])
        except (ValueError, IndexError):
            raise ConfigError(f"queue trace {str(path)!r}, line {i}: {row!r} is not time_s,partition,wait_s") \
                from None
        if part not in parts or not (w >= 0 and math.isfinite(w) and math.isfinite(t)):
            raise ConfigError(f"queue trace {str(path)!r}, line {i}: unknown partition {part!r} or bad wait; "
                              f"partitions: {', '.join(sorted(parts))}")
        rows.setdefault(part, []).append((t, w))
    out = {}
    for p, rs in rows.items():
        rs.sort()
        out[p] = ([t for t, _ in rs], [w for _, w in rs])
    return out


@dataclass
class Cluster:
    name: str
    partitions: dict[str, Partition]
    restart_s: float
    queue: QueueModel

    #: partition -> its GPU type, GPU count, rate per GPU-hour and GPUs per node, in partition-name order
    types: dict[str, str] = field(init=False)
    capacity: dict[str, int] = field(init=False)
    rates: dict[str, float] = field(init=False)
    units: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        ps = sorted(self.partitions.items())
        self.types = {p: q.gpu for p, q in ps}
        self.capacity = {p: q.size for p, q in ps}
        self.rates = {p: q.rate for p, q in ps}
        self.units = {p: q.gpus_per_node for p, q in ps}


def cluster_from_dict(d: Mapping[str, Any], where: str = "cluster", base: Path | None = None) -> Cluster:
    k = read_table(ClusterKeys, d, where)
    plist = k.partition
    if not isinstance(plist, list) or not plist:
        raise ConfigError(f"{where}: no [[partition]] table; give at least one (name, gpu, nodes, gpus_per_node)")
    parts: dict[str, Partition] = {}
    for i, pd in enumerate(plist):
        pw = f"{where}: partition {i + 1}"
        pk = read_table(PartitionKeys, pd, pw)
        name = pk.name
        if not name or name in parts:
            raise ConfigError(f"{pw}: name={name!r} is missing or repeated; every partition needs its own name")
        gpu = catalog.normalize(pk.gpu)
        rate = pk.rate if pk.rate is not None else catalog.get(gpu).price_per_hour
        parts[name] = Partition(name, gpu, pk.nodes, pk.gpus_per_node, float(rate),
                                _wait(pk.wait, f"{pw} ({name}) wait"))
    qk = read_table(QueueKeys, k.queue, f"{where}: [queue]")
    trace = None
    if qk.trace is not None:
        tp = Path(qk.trace)
        trace = _read_trace(tp if tp.is_absolute() or base is None else base / tp, parts)
    queue = QueueModel(parts, qk.seed, qk.period_s, trace, qk.estimate)
    return Cluster(k.name, parts, k.restart_s, queue)


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(read_toml(path, "cluster file"), f"cluster file {str(path)!r}", Path(path).parent)


# ---------------------------------------------------------------- gradient statistics

@dataclass(frozen=True)
class NoiseCurve:
    """B_noise at training progress u in [0, 1] (module docstring), plus the measurement noise."""

    kind: str
    params: dict[str, float]
    noise: float = 0.2
    trace: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    #: ``trace`` only: the recorded run's own measurements at the same points, (|G|^2, tr(Sigma), similarity,
    #: fresh) per decision (None where a record lacks one; fresh: the decision had a new measurement),
    #: replayed as they were instead of modelled from B_noise
    measured: tuple[tuple[float | None, float | None, float | None, bool], ...] | None = None
    #: ``trace`` only: every measured iteration's (u after it, |G|^2, tr(Sigma)) from the run's iteration records,
    #: what a simulated ``measure_every`` measurement between decisions replays (``between_at``)
    between: tuple[tuple[float, float, float], ...] = ()

    def between_at(self, u: float) -> tuple[float, float] | None:
        """The recorded iteration measurement (|G|^2, tr(Sigma)) nearest progress u (None: none recorded)."""
        if not self.between:
            return None
        k = min(range(len(self.between)), key=lambda i: abs(self.between[i][0] - float(u)))
        return self.between[k][1], self.between[k][2]

    def measured_at(self, u: float) -> tuple[float | None, float | None, float | None, bool]:
        """The recorded (|G|^2, tr(Sigma), similarity, fresh) at progress u. ``fresh`` is the nearest record's:
        a decision the run took without a new measurement is replayed without one (|G|^2 = tr(Sigma) = None,
        its similarity as recorded); otherwise each term is interpolated over the records that have it (None:
        no record has it, or not a trace)."""
        if self.trace is None or self.measured is None:
            return None, None, None, True
        u = min(max(float(u), 0.0), 1.0)
        us = self.trace[0]
        k = min(range(len(us)), key=lambda i: abs(us[i] - u))
        if not self.measured[k][3]:
            return None, None, self.measured[k][2], False
        out: list[float | None] = []
        for j in range(3):
            xs = [x for x, m in zip(us, self.measured) if m[j] is not None and (j == 2 or m[3])]
            vs = [float(v) for m in self.measured if (v := m[j]) is not None and (j == 2 or m[3])]
            out.append(float(np.interp(u, xs, vs)) if xs else None)
        return out[0], out[1], out[2], True

    def at(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        q = self.params
        if self.kind == "mccandlish":
            l_end = q["b_start"] / q["b_end"]
            return q["b_start"] / (l_end + (1.0 - l_end) * math.exp(-u / q["tau"]))
        if self.kind == "merrill":
            return q["b_min"] + (q["b_plateau"] - q["b_min"]) * (1.0 - math.exp(-u / q["u_rise"]))
        assert self.trace is not None
        us, bs = self.trace
        return float(np.interp(u, us, bs))


def read_noise_trace(path: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(u, B_noise) of a run's metrics.jsonl decision records (module docstring)."""
    us, bs, _ = read_stats_trace(path)
    return us, bs


def read_iteration_measurements(path: Path) -> tuple[tuple[float, float, float], ...]:
    """(u after the iteration, |G|^2, tr(Sigma)) of every iteration record of a run's metrics.jsonl that measured
    both (stats.noise_scale_terms of its norms), u in the run's samples as ``read_stats_trace`` places them."""
    per_it: dict[int, tuple[int, dict[str, Any] | None]] = {}
    for line in read_text(path, "gradstats trace", "a run's metrics.jsonl").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("type") == "iteration" and isinstance(r.get("it"), int) \
                and isinstance(r.get("samples"), int):
            st = r.get("stats")
            per_it[r["it"]] = (r["samples"], st if isinstance(st, dict) else None)
    total = sum(n for n, _ in per_it.values())
    out, acc = [], 0
    for i in sorted(per_it):
        n, st = per_it[i]
        acc += n
        if st is None or not total:
            continue
        try:
            g2, s = noise_scale_terms(st["b"], st["sq_micro"], st["S"], st["sq_global"])
        except (ConfigError, KeyError, TypeError):
            continue                                  # one micro-batch, or not a measurement of both norms
        if math.isfinite(g2) and math.isfinite(s):
            out.append((min(acc / total, 1.0), g2, s))
    return tuple(out)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def read_stats_trace(path: Path) -> tuple[tuple[float, ...], tuple[float, ...],
                                          tuple[tuple[float | None, float | None, float | None, bool], ...]]:
    """(u, B_noise, (|G|^2, tr(Sigma), similarity, fresh)) of a run's metrics.jsonl decision records (fresh:
    the decision had a new measurement; always True in older files without ``g2``/``s``). u is the share of
    the run's samples trained before the decision (its iteration records' ``samples``: the progress the
    simulator counts in), or iteration / last iteration when the file has no iteration records."""
    if not path.is_file():
        raise ConfigError(f"gradstats trace {str(path)!r} does not exist; give a run's metrics.jsonl")
    pts: list[tuple[int, float, tuple[float | None, float | None, float | None, bool]]] = []
    per_it: dict[int, int] = {}
    for line in read_text(path, "gradstats trace", "a run's metrics.jsonl").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue                                  # a torn last line of a live run
        if not isinstance(r, dict):
            continue
        if r.get("type") == "iteration" and isinstance(r.get("it"), int) and isinstance(r.get("samples"), int):
            per_it[r["it"]] = r["samples"]            # a resumed run's repeated iteration counts once
        st = r.get("stats") if r.get("type") == "decision" else None
        if not isinstance(st, dict):
            continue
        it = r.get("at_iteration", r.get("it"))
        if not isinstance(it, int):
            continue
        bn, sim, B = _finite(st.get("b_noise")), _finite(st.get("similarity")), r.get("B")
        if "g2" in st or "s" in st:                   # the decision's fresh estimates, as its policy got them
            g2, s = _finite(st.get("g2")), _finite(st.get("s"))
            fresh = g2 is not None and s is not None
        else:                                         # an older file: the controller's smoothed terms
            g2, s = _finite(st.get("G2")), _finite(st.get("S_trace"))
            fresh = True
        meas = (g2, s, sim if sim is not None and 0 < sim < 1 else None, fresh)
        if bn is not None and bn > 0:
            pts.append((int(it), bn, meas))
        elif sim is not None and 0 < sim < 1 and isinstance(B, (int, float)):
            pts.append((int(it), float(B) * (1 - sim) / (2 * sim), meas))
    if len(pts) < 2:
        raise ConfigError(f"gradstats trace {str(path)!r} has {len(pts)} decision(s) with a noise scale or a "
                          "similarity; it needs at least 2")
    pts.sort(key=lambda x: x[0])
    total = sum(per_it.values())
    if total > 0:
        its = sorted(per_it)
        cum, acc = {}, 0
        for i in its:
            cum[i] = acc                              # samples trained before iteration i
            acc += per_it[i]
        us = tuple(min(cum.get(i, acc if i > its[-1] else 0) / total, 1.0) for i, _, _ in pts)
    else:
        last = max(pts[-1][0], 1)
        us = tuple(i / last for i, _, _ in pts)
    return us, tuple(b for _, b, _ in pts), tuple(m for _, _, m in pts)


#: each curve's own keys in ``[gradstats]`` (besides ``curve`` and ``noise``, which every curve has)
CURVE_KEYS: dict[str, tuple[str, ...]] = {"mccandlish": ("b_start", "b_end", "tau"),
                                          "merrill": ("b_min", "b_plateau", "u_rise"), "trace": ("path",)}


@dataclass
class CurveKeys(Section):
    """``[gradstats]``: the curve, its measurement noise and every curve's own keys (``CURVE_KEYS`` says
    which are whose; a key of another curve is refused by :func:`noise_curve`)."""
    curve: str = key("mccandlish", "the curve", choices=CURVES)
    noise: float = key(0.2, "lognormal measurement noise (sigma)", lo=0.0)
    b_start: float = key(256.0, "mccandlish: B_noise at the start", lo=0.0, lo_open=True)
    b_end: float = key(8192.0, "mccandlish: B_noise towards the end", lo=0.0, lo_open=True)
    tau: float = key(0.3, "mccandlish: progress scale of the loss's fall", lo=0.0, lo_open=True)
    b_min: float = key(64.0, "merrill: critical batch at the start", lo=0.0, lo_open=True)
    b_plateau: float = key(4096.0, "merrill: critical batch's plateau", lo=0.0, lo_open=True)
    u_rise: float = key(0.15, "merrill: progress scale of the rise", lo=0.0, lo_open=True)
    path: str = key("", "trace: a recorded run's metrics.jsonl")


def noise_curve(d: Any, where: str, base: Path | None = None) -> NoiseCurve:
    k = read_table(CurveKeys, d, where)
    own = CURVE_KEYS[k.curve]
    alien = sorted(str(n) for n in (d or {}) if n not in ("curve", "noise", *own))
    if alien:
        raise ConfigError(f"{where}: {', '.join(alien)} is no key of curve {k.curve!r}; its keys: curve, noise, "
                          f"{', '.join(own)}")
    if k.curve == "trace":
        tp = Path(k.path)
        path = tp if tp.is_absolute() or base is None else base / tp
        us, bs, measured = read_stats_trace(path)
        return NoiseCurve(k.curve, {}, k.noise, (us, bs), measured, read_iteration_measurements(path))
    return NoiseCurve(k.curve, {n: float(getattr(k, n)) for n in own}, k.noise, None)


# ---------------------------------------------------------------- the job

# The job file's tables, declared with the job configuration's schema (core/config/schema.py): a key the trainer's
# JobConfig also has is declared as its field there (``like``: the same help, bounds and default, from
# core/config/defaults.py), so both read it the same way; the simulator's own keys are declared here.

@dataclass
class JobKeys(Section):
    """The job file's top level: the data, the batch, the initial mix, when the run stops."""
    name: str = key("job", "the job's name")
    samples: int = key(50_000, "samples per epoch", lo=1)
    epochs: int = like(JobConfig, "epochs", 10)
    batch: int = like(JobConfig, "batch")
    batch_min: int | None = like(JobConfig, "batch_min")
    batch_max: int | None = like(JobConfig, "batch_max")
    micro_batch: int | None = like(JobConfig, "micro_batch")
    p: int | None = like(JobConfig, "p")
    mix: dict[str, int] | None = key(None, "initial mix, partition = GPU count", lo=0, shown="every GPU")
    stop: str = key("progress", "progress: until the statistical progress of epochs epochs at B0; samples: "
                                "exactly epochs epochs", choices=STOPS)
    seed: int = like(JobConfig, "seed")
    model: dict[str, Any] = key({}, "[model] table")
    gradstats: dict[str, Any] = key({}, "[gradstats] table")
    policy: dict[str, Any] = key({}, "[policy] table")
    autoscale: dict[str, Any] = key({}, "[autoscale] table")


@dataclass
class ModelKeys(Section):
    """[model] the perf model: a profile directory or the emulated model; what a run costs besides its
    iterations."""
    profile_dir: str | None = like(JobConfig, "profile_dir")
    base_s: float = key(0.004, "emulated model: seconds per micro-batch on a V100", lo=0.0)
    per_sample_s: float = key(0.0025, "emulated model: seconds per sample on a V100", lo=0.0)
    b_list: list[int] = key([8, 16, 32, 64, 128, 256], "emulated model: the profiled micro-batch sizes", lo=1)
    grad_mb: float = key(100.0, "emulated model: gradient size (MB)", lo=0.0)
    bandwidth_gbs: float = key(10.0, "emulated model: allreduce bandwidth (GB/s)", lo=0.0, lo_open=True)
    overlap: float = key(0.0, "emulated model: share of the allreduce hidden behind the backward", lo=0.0, hi=1.0)
    speeds: dict[str, float] = key({}, "emulated model: speed per GPU type relative to a V100", lo=0.0,
                                   lo_open=True)
    measure_factor: float = key(1.0, "a measurement iteration's time / a normal one's", lo=1.0)
    epoch_end_s: float = key(0.0, "seconds per epoch end (evaluation, checkpoint)", lo=0.0)


@dataclass
class RuleKeys(Section):
    """[policy] the batch-size policies' parameters (the trainer's [adaptive] keys and defaults)."""
    gamma: float = like(JobConfig, "gamma")
    alpha: float = like(JobConfig, "alpha")
    ramp_at: list[float] = like(JobConfig, "ramp_at")
    ramp_factor: float = like(JobConfig, "ramp_factor")
    warmup: int = key(DEFAULT_GOODPUT_WARMUP, "goodput: fresh measurements before the first move", lo=0)
    measure_every: int | None = like(JobConfig, "measure_every")
    noise_memory: float | None = like(JobConfig, "noise_memory")
    kappa: float = like(JobConfig, "kappa")
    noise_trend: bool = like(JobConfig, "noise_trend")
    headroom_probe: int = like(JobConfig, "headroom_probe")
    headroom_every: int = like(JobConfig, "headroom_every")


@dataclass
class MoveKeys(Section):
    """[autoscale] the epoch-end search (the trainer's [autoscale] keys; defaults that differ say why)."""
    max_gpus: int | None = like(AutoscaleConfig, "max_gpus", None, shown="every GPU of the cluster")
    min_gpus: int = like(AutoscaleConfig, "min_gpus")
    max_partitions: int | None = like(AutoscaleConfig, "max_partitions", None, shown="no limit")
    unit: int = like(AutoscaleConfig, "unit", 0)           # 0: a partition's node size
    exact_upto: int = like(AutoscaleConfig, "exact_upto")
    margin: float = like(AutoscaleConfig, "margin")
    restart_prior_s: float = like(AutoscaleConfig, "restart_prior_s")
    budget: float | None = like(AutoscaleConfig, "budget", shown="the SimiGrad row's cost")
    max_queue_wait_s: float | None = like(AutoscaleConfig, "max_queue_wait_s")
    max_nodes: int | None = key(None, "the search's work cap: nodes expanded", lo=1, shown="the search's")
    max_evals: int | None = key(None, "the search's work cap: mixes priced", lo=1, shown="the search's")
    brute_max: int = key(0, "list every mix when the cluster has at most this many (0: branch-and-bound)", lo=0)
    forecast_history: int = key(32, "decisions the forecaster sees", lo=1)


@dataclass
class Job:
    samples: int
    epochs: int
    batch: int
    batch_min: int
    batch_max: int
    micro_batch: int | None
    p: int | None
    mix: dict[str, int] | None
    stop: str
    seed: int
    model: ModelKeys
    gradstats: NoiseCurve
    policy: RuleKeys
    autoscale: MoveKeys
    name: str = "job"


def job_from_dict(d: Mapping[str, Any], where: str = "job", base: Path | None = None) -> Job:
    t = read_table(JobKeys, d, where)
    B = t.batch
    # the trainer's range for an adaptive policy whose bounds are unset (core/adaptive/policy.py default_batch_range); a
    # fixed-B strategy runs at batch whatever the range
    rng = default_batch_range("similarity", B, t.batch_min, t.batch_max, samples_per_epoch=t.samples,
                              min_micro_batch=t.micro_batch or 1)
    lo, hi = (rng.lo, rng.hi) if rng is not None else (t.batch_min or B, t.batch_max or B)
    if not lo <= B <= hi:
        raise ConfigError(f"{where}: need batch_min <= batch <= batch_max, got {lo}, {B}, {hi}")
    return Job(samples=t.samples, epochs=t.epochs, batch=B, batch_min=lo, batch_max=hi, micro_batch=t.micro_batch,
               p=t.p, mix=None if t.mix is None else {str(p): int(n) for p, n in t.mix.items() if n},
               stop=t.stop, seed=t.seed, model=read_table(ModelKeys, d.get("model"), f"{where}: [model]"),
               gradstats=noise_curve(d.get("gradstats"), f"{where}: [gradstats]", base),
               policy=read_table(RuleKeys, d.get("policy"), f"{where}: [policy]"),
               autoscale=read_table(MoveKeys, d.get("autoscale"), f"{where}: [autoscale]"), name=t.name)


def load_job(path: str | Path) -> Job:
    return job_from_dict(read_toml(path, "job file"), f"job file {str(path)!r}", Path(path).parent)
