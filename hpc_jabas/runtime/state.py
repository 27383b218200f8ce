"""The training state a job carries from iteration to iteration, and from one job of a chain to the next.

``TrainState`` is one typed value: the iterations done, the B and plan in force, the lr scale, the
decisions announced but not in force yet (runtime/pending.py) and the sampler (core/sampler.py: the
epoch, the cursor in its permutation). Beside the model, the optimizer and the parts' own states it is
what a checkpoint holds (runtime/resume.py); its ``state_dict`` keeps the checkpoint's top-level keys
(``iteration``, ``B``, ``plan``, ``lr_scale``, ``pending``, ``sampler``), so checkpoints of earlier
versions load unchanged.

Every rank holds the same TrainState: decisions are applied at the iteration they name
(docs/design.md, section 3), so the state changes at the same iteration everywhere.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpc_jabas.core.decision import Decision
from hpc_jabas.core.planning import Plan
from hpc_jabas.core.sampler import HeterogeneousSampler
from hpc_jabas.runtime.pending import PendingDecisions

Replan = Callable[[int], Plan]     # B -> a plan of B for this job's ranks


@dataclass
class TrainState:
    """``iteration`` iterations done; ``B``, ``plan``, ``lr_scale`` in force; ``pending``: announced decisions;
    ``sampler``: the epoch and the cursor of the sample order; ``samples``: the samples trained on since the run
    began."""

    B: int
    plan: Plan
    sampler: HeterogeneousSampler
    iteration: int = 0
    lr_scale: float = 1.0
    pending: PendingDecisions = field(default_factory=PendingDecisions)
    si_carry: float = 0.0     # AdaScale: the fraction of a scheduler step not taken yet (scheduler_steps)
    samples: int = 0          # samples trained on since the run began (over every job and resume of it)
    # an lr warm-up (batch_start = "knee"): (iterations W, starting factor r0); the step's lr scale is lr_scale x
    # r0 + (1 - r0) min(1, (iteration + 1) / W). None: none
    lr_warmup: tuple[int, float] | None = None

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def cursor(self) -> int:
        return self.sampler.cursor

    def announced(self) -> tuple[int, Plan, float]:
        """(B, plan, lr_scale) as announced so far: the last pending decision's, else those in force."""
        d = self.pending.latest()
        return (d.B, d.plan, d.lr_scale) if d is not None else (self.B, self.plan, self.lr_scale)

    def apply_due(self) -> None:
        """Put in force every pending decision due at the current iteration (the last one wins)."""
        for d in self.pending.due(self.iteration):
            self.B, self.plan, self.lr_scale = d.B, d.plan, d.lr_scale

    def plan_at(self, iteration: int) -> Plan:
        """The plan in force at ``iteration`` (>= the current one), pending decisions included."""
        return self.pending.plan_at(iteration, self.plan)

    def add(self, d: Decision) -> None:
        """File an announced decision; it is put in force by :meth:`apply_due`."""
        self.pending.add(d)

    def lr_factor(self) -> float:
        """The lr warm-up's factor at the current iteration (1 without a warm-up or past it)."""
        if self.lr_warmup is None:
            return 1.0
        w, r0 = self.lr_warmup
        return r0 + (1.0 - r0) * min(1.0, (self.iteration + 1) / w)

    def scheduler_steps(self, scale_invariant: bool) -> int:
        """How often a scheduler stepped per iteration steps after this iteration: once, or under AdaScale
        (``scale_invariant``) the iteration's gain, lr_scale, in scale-invariant iterations, with the fraction
        carried to the next iteration (and through checkpoints)."""
        if not scale_invariant:
            return 1
        self.si_carry += self.lr_scale
        n = int(self.si_carry)
        self.si_carry -= n
        return n

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries for this state (plain containers: core/planning's and core/decision's dicts)."""
        return {"sampler": self.sampler.state_dict(), "iteration": self.iteration, "B": self.B,
                "plan": self.plan.to_dict(), "lr_scale": self.lr_scale, "pending": self.pending.state_dict(),
                "si_carry": self.si_carry, "samples": self.samples,
                "lr_warmup": None if self.lr_warmup is None else list(self.lr_warmup)}

    def load_state_dict(self, st: dict[str, Any], world: int, replan: Replan) -> None:
        """Back from a checkpoint. A plan saved for another rank count (a job on another allocation) is
        replaced by ``replan(B)``: the same B, planned for this job's ``world`` ranks."""
        self.sampler.load_state_dict(st["sampler"])
        self.iteration = int(st["iteration"])
        self.B = int(st["B"])
        self.lr_scale = float(st["lr_scale"])
        self.si_carry = float(st.get("si_carry", 0.0))       # absent in checkpoints of earlier versions
        warm = st.get("lr_warmup")                            # absent in checkpoints of earlier versions: none
        self.lr_warmup = None if not warm else (int(warm[0]), float(warm[1]))
        # absent in checkpoints of earlier versions: the epochs done and the cursor (exact with tail "shrink")
        self.samples = int(st.get("samples", self.sampler.epoch * self.sampler.num_samples + self.sampler.cursor))
        plan = Plan.from_dict(st["plan"])
        self.plan = plan if plan.world_size == world else replan(self.B)
        # decisions announced ahead of the loader, not in force yet (the sampler above is the position)
        self.pending.load_state_dict(st.get("pending") or [], world, replan=replan)
