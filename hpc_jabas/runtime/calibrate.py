"""The trainer's online calibration of the perf model (core/perf/calibration.py) and its error record.

Every rank fits its own correction every iteration from its own measured compute (``observe``, no
communication). On calibration rounds (the controller's decision rounds; every ``metrics_period``
iterations without a controller that has rounds), before the decision, at checkpoints and at the
end of ``fit`` every rank calls ``sync`` (collective): the fits are gathered, the calibrated view is
rebuilt in place (``view.profiles``: the planner, the batch space, the rebalancer and goodput share
that one PerfModel object), and rank 0 writes a ``perf_error`` record to metrics.jsonl: the mean
predicted iteration time of the iterations since the last round (the calibrated model as it was
during them, and the uncalibrated profile) against the measured one (max over ranks of iter_s).
At checkpoints rank 0 also writes ``calibration.json`` to the run directory (``job_perf_model``,
the auto-scaler and ``hpc-jabas plan --calibration`` read it).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.perf.calibration import CALIBRATION_FILE, Calibration, RankCalibration
from hpc_jabas.core.perf.perfmodel import PerfModel, calibrate_model, job_perf_model, rank_time
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.controller import AdaptiveController, BaseController
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.trust import check_file, check_profile_dir, write_atomic_nofollow

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.hooks import Controller
    from hpc_jabas.runtime.metrics import MetricsWriter

log = get_logger(__name__)


def check_calibration(cfg: JobConfig) -> None:
    """Before ``core.perfmodel.job_perf_model`` (pure: no owner checks there) reads ``cfg``'s run's
    ``calibration.json`` and the files of its ``profile_dir``: refused (UntrustedFileError) when another user
    owns them or others may write them."""
    if cfg.profile_dir:
        check_profile_dir(cfg.profile_dir)
    if cfg.calibrate:
        check_file(os.path.join(str(cfg.run_dir), CALIBRATION_FILE), "calibration")


WARMUP_ITERATIONS = 2       # the first iterations of a process (lazy initialisation) are not fitted


class Calibrator:
    """One rank's calibration. Built from the parts it reads (the config, the ranks' GPU types, this rank,
    the metrics writer); ``attach`` hands it, once the trainer has built them, the controller whose rounds
    it syncs on, the planner's declared speed factors and the iteration counter."""

    def __init__(self, cfg: JobConfig, gpu_types: Sequence[str], rank: int, metrics: MetricsWriter) -> None:
        self.cfg = cfg
        self.gpu_types = list(gpu_types)
        self.rank = rank
        self.world = len(self.gpu_types)
        self.metrics = metrics
        self.controller: Controller | None = None
        self.declared: list[float] | None = None       # the planner's declared speed factors (attach)
        self._iteration: Callable[[], int] = lambda: 0
        self.enabled = bool(cfg.calibrate)
        self.base: PerfModel | None = None
        self.view: PerfModel | None = None
        self.cal: Calibration | None = None       # every rank's fit as of the last sync
        self.mine: RankCalibration | None = None  # this rank's live fit
        self.window: list[list[float]] = []       # [it, predicted finish (view), (profile), iter_s, n]
        self.seen = 0
        self._warned = False

    def attach(self, controller: Controller | None, declared: list[float] | None,
               iteration: Callable[[], int]) -> None:
        """The trainer's parts built after this one: its controller, its planner's declared factors, its
        iteration count."""
        self.controller, self.declared, self._iteration = controller, declared, iteration

    def model(self) -> PerfModel:
        """The calibrated view (built once; what ``trainer.perf_model()`` returns)."""
        if self.view is None:
            cfg, types = self.cfg, self.gpu_types
            if cfg.profile_dir:
                check_profile_dir(cfg.profile_dir)      # as calibration.json: refused when others can write it
            self.base = job_perf_model(cfg, types, calibrated=False)
            b = self.base
            self.view = PerfModel(dict(b.profiles), b.allreduce, b.grad_bytes, b.overlap)
            if self.enabled:
                self._seed()
        return self.view

    def _declared(self) -> list[float]:
        d = self.declared
        return list(d) if d else [1.0] * self.world

    def _seed(self) -> None:
        path = os.path.join(str(self.cfg.run_dir), CALIBRATION_FILE)
        cal = None
        if os.path.isfile(path):
            check_file(path, "calibration")      # it steers the plans: refused (not ignored) when others can write it
            try:
                cal = Calibration.load(path).seeded(self.gpu_types)
                log.info("calibration seeded from %s", path)
            except ConfigError as e:
                log.warning("ignoring %s: %s", path, e)
        self._set(cal or Calibration.fresh(self.gpu_types))

    def _set(self, cal: Calibration) -> None:
        self.cal = cal
        self.mine = RankCalibration.from_state(cal.ranks[self.rank].state_dict())
        self._rebuild()

    def _rebuild(self) -> None:
        if self.cal is None or self.base is None or self.view is None:
            return
        self.cal.declared = self._declared()
        calibrate_model(self.view, self.cal, self.base)

    # -- every iteration, every rank -------------------------------------------------------------
    def observe(self, rec: StepRecord) -> None:
        if not self.enabled:
            return
        try:
            view = self.model()
            assert self.base is not None and self.mine is not None
            n, b, x = int(rec.n_local), int(rec.b), int(rec.x)
            g = self.gpu_types[self.rank]
            sf = self._declared()[self.rank]
            if n > 0:
                pb = self.base.profile(g)
                self.window.append([rec.it, rank_time(view.profile(g), b, n, x, sf), rank_time(pb, b, n, x, sf),
                                    rec.iter_s, n])
            else:
                self.window.append([rec.it, 0.0, 0.0, rec.iter_s, 0])
            self.seen += 1
            if n > 0 and self.seen > WARMUP_ITERATIONS and not rec.skipped:
                r = x - (n - 1) * b
                t = ((n - 1) * pb.time(b) + pb.time(r)) / sf
                self.mine.update(t, n, float(rec.compute_s))
        except ConfigError as e:          # e.g. a plan outside the profile: not fitted, said once (every rank
            if not self._warned:          # keeps syncing, so the collective calls stay in step)
                log.warning("rank %d: iteration not calibrated: %s", self.rank, e)
            self._warned = True

    def is_round(self, iteration: int) -> bool:
        """The controller's decision rounds when it has them (runtime/controller.py ``BaseController``),
        else every ``metrics_period`` iterations."""
        ctrl = self.controller
        if isinstance(ctrl, BaseController) and ctrl.has_rounds():
            return bool(ctrl.is_round(iteration))
        return iteration % max(1, int(self.cfg.metrics_period)) == 0

    # -- collective -------------------------------------------------------------------------------
    def sync(self, write: bool = False) -> None:
        """Every rank at the same point: gather the fits, rebuild the view, rank 0 records the error."""
        if not self.enabled or self.mine is None:
            return
        from hpc_jabas.runtime.comm import (
            seam as comm,  # not at import: the calibration's pure half runs without a backend
        )
        got = comm.allgather_object({"state": self.mine.state_dict(), "window": self.window}, name="hj.calib")
        self.window = []
        assert self.cal is not None
        old = self.cal
        self.cal = Calibration([RankCalibration.from_state(g["state"]) for g in got], self._declared(),
                               old.tail_scale)
        self._record([g["window"] for g in got], old)       # every rank: the tail scale; rank 0 writes
        self._rebuild()
        if isinstance(self.controller, AdaptiveController):
            self.controller.model_changed()       # goodput prices B with its batch space's times
        if write and self.rank == 0:
            try:
                write_atomic_nofollow(os.path.join(str(self.cfg.run_dir), CALIBRATION_FILE),
                                      self.cal.to_json().encode(), "calibration")    # never through a link
            except (OSError, ConfigError) as e:     # a full disk; a link planted after the run directory's check
                log.warning("calibration not written: %s", e)

    def _record(self, windows: list[list[list[float]]], old: Calibration) -> None:
        view = self.view
        if view is None or not windows or not all(len(w) == len(windows[0]) for w in windows) or not windows[0]:
            return
        assert self.base is not None and self.cal is not None
        pc = pb = ms = fin = tail_base = 0.0
        k = 0
        for rows in zip(*windows):
            npart = sum(1 for r in rows if r[4] > 0)
            if npart == 0:
                continue
            tail, tb = view.allreduce_tail(npart), self.base.allreduce_tail(npart)
            pc += max(r[1] for r in rows) + tail
            pb += max(r[2] for r in rows) + tb
            ms += max(r[3] for r in rows)
            fin += max(r[1] for r in rows)
            tail_base += tb
            k += 1
        if k == 0 or ms <= 0:
            return
        self.cal.observe_tail((ms - fin) / k, tail_base / k)
        if self.rank != 0:
            return
        pc, pb, ms = pc / k, pb / k, ms / k
        self.metrics.write({"type": "perf_error", "it": self._iteration(), "iterations": k,
                               "predicted_s": pc, "predicted_uncalibrated_s": pb, "measured_s": ms,
                               "error": abs(pc - ms) / ms, "error_uncalibrated": abs(pb - ms) / ms,
                               "factor": [rc.factor for rc in self.cal.ranks], "tail_scale": old.tail_scale,
                               "offset_s": [rc.offset for rc in self.cal.ranks]})

    # -- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        return self.cal.to_dict() if self.enabled and self.cal is not None else None

    def load_state_dict(self, d: dict[str, Any] | None) -> None:
        if not d or not self.enabled:
            return
        self.model()
        try:
            cal = Calibration.from_dict(d, "checkpoint calibration")
        except ConfigError as e:
            log.warning("checkpoint calibration ignored: %s", e)
            return
        same = len(cal.ranks) == self.world and [r.gpu for r in cal.ranks] == list(self.gpu_types)
        self._set(cal if same else cal.seeded(self.gpu_types))
        self.window = []
