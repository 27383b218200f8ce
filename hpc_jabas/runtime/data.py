"""The input pipeline: this rank's micro-batches, from the user's Dataset or DataLoader.

    Trainer(model, opt, dataset, loss_fn)                     # a map-style Dataset: SyncFeed
    Trainer(model, opt, DataLoader(dataset, num_workers=4, pin_memory=True,
                                   persistent_workers=True), loss_fn)      # LoaderFeed

Every rank runs the same core sampler (core/planning/sampler.py: one seeded permutation per epoch, each
iteration cut into all ranks' micro-batches by the plan) and takes its own slice.

- ``SyncFeed`` (a Dataset): the micro-batch is fetched on the training thread when it is run: a
  TensorDataset (the data already in memory) by tensor indexing, anything else by ``dataset[i]``
  per sample and ``default_collate``. No lookahead: a decision applies at the next iteration.
- ``LoaderFeed`` (a DataLoader): a real ``torch.utils.data.DataLoader`` is built from the user's
  (its dataset, num_workers, pin_memory, prefetch_factor, persistent_workers, collate_fn,
  worker_init_fn, timeout, multiprocessing_context, generator) with a
  ``HeterogeneousBatchSampler`` as its batch sampler; the user's batch_size, shuffle, sampler,
  batch_sampler and drop_last are replaced (logged once: the plan sets the micro-batch sizes, the
  job's ``seed`` the order and ``tail`` the epoch end). Workers decode and augment ahead of the
  training thread; they are created once per epoch (once per job with persistent_workers), not
  when B or the plan changes.

Lookahead and decisions. The loader draws index lists ahead of the training thread: with W
workers and prefetch factor F, at most W*F lists beyond what the trainer has taken. The batch
sampler yields at least one item per iteration (an empty list, collated to None and skipped,
on an iteration where this rank has no micro-batch), so it has read the plan of at most W*F
iterations beyond the trainer's. The trainer's ``decision_lead`` is that W*F (the largest over
the ranks): controllers announce a decision for ``trainer.iteration + decision_lead``, the
sampler reads each iteration's plan from the announced schedule (runtime/persist/pending.py), and the
trainer applies the decision when it gets there, so every rank and its loader cut every
iteration alike, and no sample is skipped or repeated. Each batch the trainer takes is checked
against the index list the trainer's own sampler gives (a mismatch raises), and a decision for
an iteration the loader has already drawn raises.

Checkpoints hold the trainer's sampler (its position, not the loader's); after a resume, an
epoch start or anything else that moves the trainer, the loader restarts at the trainer's
position (iteration, epoch, cursor). Worker-side randomness (augmentation) is seeded per micro-batch when
the DataLoader has no generator of its own: each index list carries a seed made from the job's seed, the rank,
the epoch, the iteration's start cursor and the micro-batch's place in it (:class:`SeededIndices`), and the
worker seeds torch's, numpy's and Python's generators from it before it reads the micro-batch
(:class:`SeededDataset`). A micro-batch's augmentation is then a function of where it is in the run, not of
which worker read it or how long that worker has lived: a resume (at an epoch boundary or inside an epoch)
replays the same samples with the same draws, with ``persistent_workers=True`` too (persistent workers are
never reseeded by torch between epochs). With a ``generator`` of the user's the workers follow torch's
per-worker seeds from it, and a resume is exact for the samples but not for worker-side draws.

Preemption. Slurm's TERM (preemption, scancel) reaches every process of the job, the loader's workers
included; a worker killed by it made PyTorch raise "DataLoader worker ... is killed by signal" in the
training process before it could reach its safe point. A Trainer's workers therefore ignore TERM, INT,
USR1 and USR2 (:class:`QuietWorkerInit`, which then calls the user's ``worker_init_fn``): only the
training processes decide when to stop (runtime/safepoint.py). A worker that dies anyway after a stop
signal (SIGKILL, the out-of-memory killer) is not a failure: PyTorch's error is held back
(:class:`_SigchldGuard`) and the rest of the iteration's micro-batches are read on the training thread
(``dataset[i]`` and the collate function, the same samples in the same micro-batches), so the iteration
completes and the job checkpoints and stops at the safe point as a preemption. Without a stop signal a
dead worker is still an error.
"""
from __future__ import annotations

import atexit
import os
import random
import signal
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler, IndexArray, IterationBatch
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger

log = get_logger(__name__)

Position = tuple[int, int, int]            # (iteration, epoch, cursor) at an iteration's start


def tensor_fetch(dataset: Any) -> Callable[[IndexArray], Any]:
    """Fast path for TensorDataset-like datasets; else collate dataset[i]."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        def fetch_tensors(idx: IndexArray) -> Any:
            i = torch.as_tensor(idx, dtype=torch.long)
            return tuple([t[i] for t in tensors])
        return fetch_tensors

    def fetch(idx: IndexArray) -> Any:
        items = [dataset[int(i)] for i in idx]
        return torch.utils.data.default_collate(items)
    return fetch


def check_dataset(ds: Any) -> int:
    """The dataset's length; one ConfigError line when heterogeneous batching cannot index it."""
    if isinstance(ds, IterableDataset):
        raise ConfigError(f"dataset {type(ds).__name__} is a torch IterableDataset, which cannot be sampled by index; "
                          "every rank cuts the same permutation of sample indices, so give a map-style Dataset "
                          "(__len__ and __getitem__) or a DataLoader over one")
    try:
        n = len(ds)
    except TypeError:
        raise ConfigError(f"dataset {type(ds).__name__} has no len(); give a map-style Dataset "
                          "(__len__ and __getitem__) or a DataLoader over one") from None
    if not hasattr(ds, "__getitem__"):
        raise ConfigError(f"dataset {type(ds).__name__} has no __getitem__; give a map-style Dataset "
                          "(__len__ and __getitem__) or a DataLoader over one")
    return int(n)


class _Collate:
    """The user's collate_fn; an empty index list (this rank idles that iteration) collates to None."""

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn

    def __call__(self, items: list[Any]) -> Any:
        return self.fn(items) if len(items) else None


class SeededIndices(list):
    """A micro-batch's index list with the seed its worker draws from (``seed``; None: not seeded)."""

    seed: int | None = None


def micro_seed(seed: int, rank: int, epoch: int, start: int, k: int) -> int:
    """The seed of micro-batch ``k`` of the iteration starting at ``start`` of ``epoch`` on ``rank``."""
    return int(np.random.SeedSequence([seed, rank, epoch, start, k]).generate_state(1)[0])


class SeededDataset(Dataset):
    """The user's dataset as the workers read it: before a micro-batch, in a worker, torch's, numpy's and
    Python's generators are seeded from its :class:`SeededIndices` seed (on the training thread, never)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def __getitems__(self, idx: list[int]) -> list[Any]:
        seed = getattr(idx, "seed", None)
        if seed is not None and torch.utils.data.get_worker_info() is not None:
            torch.manual_seed(seed)
            np.random.seed(seed)
            random.seed(seed)
        many = getattr(self.dataset, "__getitems__", None)
        return list(many(list(idx))) if callable(many) else [self.dataset[int(i)] for i in idx]


class HeterogeneousBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's micro-batch index lists, iteration after iteration, to the end of an epoch.

    ``plan_at(iteration)`` gives each iteration's plan (the trainer's announced schedule). Every
    iteration yields this rank's micro-batches in order, or one empty list when it has none.
    ``records`` holds (iteration, epoch, start, indices or None) of every list drawn and not
    yet taken (LoaderFeed takes them in order); ``drawn`` is the last iteration whose plan was read.
    """

    def __init__(self, num_samples: int, rank: int, seed: int = 0, tail: str = "shrink",
                 plan_at: Callable[[int], Plan] | None = None, seeded: bool = False) -> None:
        self.sampler = HeterogeneousSampler(num_samples, seed=seed, tail=tail)
        self.rank, self.seed, self.seeded = rank, seed, seeded      # seeded: lists carry their worker seed
        self.plan_at = plan_at
        self.start: Position = (0, 0, 0)
        self.records: deque[tuple[int, int, int, IndexArray | None]] = deque()
        self.drawn = -1
        self.next_pos: Position | None = self.start       # where the live iterator draws next; None: epoch over

    def position(self) -> Position | None:
        """The (iteration, epoch, cursor) of the next list the loader hands out (None: the epoch is over)."""
        if self.records:
            it, epoch, start, _ = self.records[0]
            return it, epoch, start
        return self.next_pos

    def __iter__(self) -> Iterator[list[int]]:
        it, epoch, cursor = self.start
        self.records.clear()
        self.drawn = it - 1
        self.next_pos = self.start
        return self._draw(it, epoch, cursor)

    def _draw(self, it: int, epoch: int, cursor: int) -> Iterator[list[int]]:
        if self.plan_at is None:
            raise RuntimeError("HeterogeneousBatchSampler.plan_at is not set (the Trainer sets it)")
        s = self.sampler
        s.epoch, s.cursor = epoch, cursor
        while True:
            plan = self.plan_at(it)
            self.drawn = max(self.drawn, it)
            if s.epoch_done(plan.B):
                self.next_pos = None
                return
            ib = s.next(plan)
            mine = ib.micro[self.rank]
            self.next_pos = (it + 1, s.epoch, s.cursor)
            if not mine:
                self.records.append((it, ib.epoch, ib.start, None))
                yield []
            for k, idx in enumerate(mine):
                self.records.append((it, ib.epoch, ib.start, idx))
                out = SeededIndices(idx.tolist())
                if self.seeded:
                    out.seed = micro_seed(self.seed, self.rank, ib.epoch, ib.start, k)
                yield out
            it += 1


#: what a Trainer's DataLoader workers ignore: the job's stop signals are for the training processes
WORKER_IGNORED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class QuietWorkerInit:
    """The ``worker_init_fn`` of a Trainer's DataLoader workers: ignore :data:`WORKER_IGNORED`, then call the
    user's own ``worker_init_fn`` (picklable: the workers may be spawned)."""

    def __init__(self, user_fn: Callable[[int], Any] | None = None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        for s in WORKER_IGNORED:
            signal.signal(s, signal.SIG_IGN)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _stop_signalled() -> bool:
    from hpc_jabas.runtime.safepoint import stop_signals
    return bool(stop_signals().signum)


class _SigchldGuard:
    """Wraps PyTorch's SIGCHLD handler (which raises in the training thread, at any point, when a worker
    dies): after a stop signal its error is held back; the feed finds the dead worker when it next reads."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner

    def __call__(self, signum: int, frame: Any) -> None:
        try:
            self.inner(signum, frame)
        except RuntimeError:
            if not _stop_signalled():
                raise


def _guard_sigchld() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    cur = signal.getsignal(signal.SIGCHLD)
    if callable(cur) and not isinstance(cur, _SigchldGuard):
        signal.signal(signal.SIGCHLD, _SigchldGuard(cur))


def _worker_died(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "DataLoader worker" in str(e)


def end_workers(it: Any) -> None:
    """End a DataLoader iterator's workers now: PyTorch's own shutdown (the workers exit on their own), then
    SIGKILL for any still alive. Needed because the workers ignore TERM, which is what PyTorch's and
    multiprocessing's exit paths send (PyTorch's iterator internals, torch 2.x: ``_workers``,
    ``_shutdown_workers``; missing ones are skipped)."""
    workers = list(getattr(it, "_workers", None) or [])
    shutdown = getattr(it, "_shutdown_workers", None)
    if callable(shutdown):
        try:
            shutdown()
        except Exception:        # noqa: BLE001  (a broken iterator: the kill below still ends its workers)
            pass
    for w in workers:
        try:
            if w.is_alive():
                os.kill(w.pid, signal.SIGKILL)
                w.join(5)
        except (OSError, ValueError, AssertionError):
            pass


_LIVE: weakref.WeakSet[LoaderFeed] = weakref.WeakSet()


@atexit.register
def _end_all_workers() -> None:
    """At exit (before multiprocessing's own exit handler, which would join workers that ignore its TERM)."""
    for feed in list(_LIVE):
        feed.close()


class SyncFeed:
    """A Dataset: micro-batches fetched on the training thread (no lookahead)."""

    lead = 0

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.fetch = tensor_fetch(dataset)

    def attach(self, plan_at: Callable[[int], Plan]) -> None:
        pass

    def begin(self, iteration: int, ib: IterationBatch) -> None:
        pass

    def check_ahead(self, at_iteration: int) -> None:
        pass

    def close(self) -> None:
        pass


class LoaderFeed:
    """A DataLoader driven by a HeterogeneousBatchSampler (module docstring)."""

    def __init__(self, dataset: Dataset, kwargs: dict[str, Any], rank: int, seed: int, tail: str) -> None:
        self.dataset: Any = dataset
        self.rank = rank
        self.seed = seed
        kw = dict(kwargs)
        self._own_generator = kw.get("generator") is None
        if self._own_generator:
            kw["generator"] = torch.Generator()
        nw = int(kw.get("num_workers", 0))
        seeded = self._own_generator and nw > 0        # worker draws seeded per micro-batch (module docstring)
        self.batch_sampler = HeterogeneousBatchSampler(check_dataset(dataset), rank, seed=seed, tail=tail,
                                                       seeded=seeded)
        kw["collate_fn"] = _Collate(kw.get("collate_fn") or torch.utils.data.default_collate)
        self._collate = kw["collate_fn"]
        if nw > 0:
            kw["worker_init_fn"] = QuietWorkerInit(kw.get("worker_init_fn"))
        self.loader = DataLoader(SeededDataset(dataset) if seeded else dataset, batch_sampler=self.batch_sampler,
                                 **kw)
        self.direct = False          # a worker died after a stop signal: read on this thread up to the stop
        _LIVE.add(self)
        self.lead = int(kw.get("prefetch_factor") or 2) * nw if nw > 0 else 0
        self._it: Iterator[Any] | None = None
        self._iteration = -1

    def attach(self, plan_at: Callable[[int], Plan]) -> None:
        self.batch_sampler.plan_at = plan_at

    def begin(self, iteration: int, ib: IterationBatch) -> None:
        """The trainer starts ``iteration`` (``ib``: its cut): position the loader there, take an idle marker."""
        pos = (iteration, ib.epoch, ib.start)
        self._iteration = iteration
        if self.direct:
            return
        if self._it is None or self.batch_sampler.position() != pos:
            self._restart(pos)
        if not ib.micro[self.rank]:
            self._take(None)

    def fetch(self, idx: IndexArray) -> Any:
        """The next batch; it must be the micro-batch ``idx`` of the current iteration."""
        if self.direct:
            return self._read_here(idx)
        return self._take(idx)

    def _read_here(self, idx: IndexArray) -> Any:
        """The micro-batch read on this thread, as a worker would (the dataset's items, the collate function)."""
        return self._collate([self.dataset[int(i)] for i in idx])

    def check_ahead(self, at_iteration: int) -> None:
        """A decision for ``at_iteration`` arrives: the loader must not have read that iteration's plan."""
        if self._it is not None and at_iteration <= self.batch_sampler.drawn:
            raise RuntimeError(f"rank {self.rank}: a decision for iteration {at_iteration} arrived after the "
                               f"DataLoader drew iteration {self.batch_sampler.drawn} (lookahead {self.lead}); "
                               "decisions must be announced for trainer.iteration + trainer.decision_lead or later")

    def close(self) -> None:
        """End the live iterator and its workers (persistent ones too: they ignore TERM, see end_workers);
        the next begin restarts."""
        it, self._it = self._it, None
        if it is not None and int(self.loader.num_workers) > 0:
            if getattr(self.loader, "_iterator", None) is it:      # persistent workers: the loader keeps it
                self.loader._iterator = None
            end_workers(it)
        self.direct = False

    def _restart(self, pos: Position) -> None:
        self._it = None                        # the old iterator's workers shut down first
        self.batch_sampler.start = pos
        if self._own_generator:
            gen = self.loader.generator
            assert gen is not None
            gen.manual_seed(int(np.random.SeedSequence([self.seed, self.rank, pos[1], pos[2]]).generate_state(1)[0]))
        self._it = iter(self.loader)
        if int(self.loader.num_workers) > 0:
            _guard_sigchld()                   # PyTorch installs its SIGCHLD handler with the first workers

    def _take(self, idx: IndexArray | None) -> Any:
        assert self._it is not None
        try:
            batch = next(self._it)
        except StopIteration:
            raise RuntimeError(f"rank {self.rank}: the DataLoader ended inside iteration {self._iteration}") from None
        except (RuntimeError, EOFError, OSError) as e:
            # a worker killed while its batch was in flight fails the unpickling of that batch (EOFError,
            # ConnectionError from the shared-memory handover) instead of PyTorch's "worker ... killed"
            died = _worker_died(e) if isinstance(e, RuntimeError) else True
            if not (died and _stop_signalled()):
                raise
            log.warning("rank %d: a DataLoader worker died after the stop signal (%s); reading the rest of "
                        "iteration %d here, then stopping at the safe point", self.rank, e, self._iteration)
            self.close()                       # the other workers end too
            self.direct = True
            return None if idx is None else self._read_here(idx)
        it, _, _, want = self.batch_sampler.records.popleft()
        same = want is None and idx is None or (want is not None and idx is not None and np.array_equal(want, idx))
        if it != self._iteration or not same:
            raise RuntimeError(f"rank {self.rank}: the DataLoader is out of step at iteration {self._iteration}: "
                               f"it gave iteration {it}'s micro-batch {want} where the trainer runs {idx}")
        return batch


def loader_kwargs(dl: DataLoader) -> tuple[dict[str, Any], list[str]]:
    """What a DataLoader over our batch sampler keeps of ``dl``, and what of it is replaced."""
    collate = dl.collate_fn
    if collate is torch.utils.data.default_convert:        # batch_size=None: no batching of its own
        collate = torch.utils.data.default_collate
    kw: dict[str, Any] = {"num_workers": dl.num_workers, "collate_fn": collate, "pin_memory": dl.pin_memory,
                          "timeout": dl.timeout, "worker_init_fn": dl.worker_init_fn,
                          "multiprocessing_context": dl.multiprocessing_context, "generator": dl.generator,
                          "persistent_workers": dl.persistent_workers}
    if dl.num_workers > 0:
        kw["prefetch_factor"] = dl.prefetch_factor
    if getattr(dl, "pin_memory_device", ""):
        kw["pin_memory_device"] = dl.pin_memory_device
    replaced = []
    if dl.batch_size not in (1, None):
        replaced.append(f"batch_size={dl.batch_size}")
    if isinstance(dl.sampler, RandomSampler):
        replaced.append("shuffle=True")
    elif not isinstance(dl.sampler, SequentialSampler):
        replaced.append(f"sampler={type(dl.sampler).__name__}")
    if dl.batch_size is None and dl.batch_sampler is not None:
        replaced.append(f"batch_sampler={type(dl.batch_sampler).__name__}")
    if dl.drop_last:
        replaced.append("drop_last=True")
    if not getattr(dl, "in_order", True):
        replaced.append("in_order=False")
    return kw, replaced


def check_input(data: Any) -> int:
    """The Trainer's ``dataset`` argument (a Dataset or a DataLoader over one): its sample count, or a ConfigError."""
    return check_dataset(data.dataset if isinstance(data, DataLoader) else data)


def make_feed(data: Any, rank: int, seed: int, tail: str) -> SyncFeed | LoaderFeed:
    """The feed for the Trainer's ``dataset`` argument: a Dataset or a DataLoader (module docstring)."""
    if isinstance(data, DataLoader):
        check_dataset(data.dataset)
        kw, replaced = loader_kwargs(data)
        if replaced and rank == 0:
            log.warning("the DataLoader's %s: replaced by the heterogeneous batch sampler (micro-batch sizes from "
                        "the plan, order from seed=%d, tail=%s)", ", ".join(replaced), seed, tail)
        return LoaderFeed(data.dataset, kw, rank, seed, tail)
    check_dataset(data)
    return SyncFeed(data)


def agreed_lead(lead: int) -> int:
    """Collective: the decision lead every rank uses, the largest lookahead of any rank's loader."""
    from hpc_jabas.runtime.comm import seam as comm
    return max(int(x) for x in comm.allgather_object(int(lead), name="hj.lead"))
