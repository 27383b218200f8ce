"""Job configuration: one dataclass, loaded from TOML (tomllib) and/or flags; validated.

Unknown keys and impossible values raise ConfigError with one line naming the value and what
is valid (design.md invariant 7).
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hpc_jabas.core.policy import LR_RULES, POLICIES
from hpc_jabas.core.sampler import TAILS
from hpc_jabas.errors import ConfigError

PLANNERS = ("optimal", "lbbsp", "fixed")


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """A TOML file as a dict; a missing or malformed file is one clear ConfigError."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {str(p)!r} is not valid TOML: {e}") from None


@dataclass
class JobConfig:
    # data / loop
    epochs: int = 1
    batch: int = 256                  # initial global batch B
    micro_batch: int | None = None    # b; None: the planner chooses
    seed: int = 0
    tail: str = "shrink"
    run_dir: str = "runs/latest"
    # plan
    planner: str = "optimal"          # optimal (perf model) | lbbsp (speed-proportional) | fixed
    plan: str | None = None           # explicit "b=4 n=1,3,4" (planner=fixed)
    gpu_types: list[str] | None = None  # one per rank; None: from Slurm or 'v100'
    speeds: list[float] | None = None   # declared per-rank speeds (lbbsp)
    profile_dir: str | None = None
    # emulation
    emulate: bool = False
    emulate_base_s: float = 0.002
    emulate_per_sample_s: float = 0.0002
    slowdown: dict[int, str] = field(default_factory=dict)  # rank -> "factor=3,start=50"
    # adaptive batch size
    policy: str = "fixed"
    p: int = 100
    alpha: float = 0.1
    gamma: float = 0.1
    k: float = 1.0
    batch_min: int | None = None
    batch_max: int | None = None
    lr_rule: str = "sqrt"
    batch_ref: int | None = None
    # load balancing
    balance: str = "off"              # off | reactive | predictive
    p_balance: int = 10
    balance_threshold: float = 0.05
    # metrics / checkpoints
    metrics_period: int = 10
    checkpoint: bool = True
    keep_checkpoints: int = 3
    # auto-scaling (epoch end; Slurm)
    autoscale: dict = field(default_factory=dict)

    def validate(self) -> JobConfig:
        def need(cond, msg):
            if not cond:
                raise ConfigError(msg)
        need(isinstance(self.epochs, int) and self.epochs >= 1, f"epochs={self.epochs!r} must be an integer >= 1")
        need(isinstance(self.batch, int) and self.batch >= 1, f"batch={self.batch!r} must be an integer >= 1")
        need(self.micro_batch is None or (isinstance(self.micro_batch, int) and self.micro_batch >= 1),
             f"micro_batch={self.micro_batch!r} must be an integer >= 1")
        need(self.tail in TAILS, f"tail={self.tail!r} is unknown; valid: {', '.join(TAILS)}")
        need(self.planner in PLANNERS, f"planner={self.planner!r} is unknown; valid: {', '.join(PLANNERS)}")
        need(self.planner != "fixed" or self.plan, "planner='fixed' needs plan='b=... n=...'")
        need(self.policy in POLICIES, f"policy={self.policy!r} is unknown; valid: {', '.join(POLICIES)}")
        need(self.lr_rule in LR_RULES, f"lr_rule={self.lr_rule!r} is unknown; valid: {', '.join(LR_RULES)}")
        need(isinstance(self.p, int) and self.p >= 1,
             f"p={self.p!r} must be an integer >= 1 (iterations between decisions)")
        need(self.alpha > 0 and self.alpha < 1, f"alpha={self.alpha!r} must be in (0, 1)")
        need(-1 < self.gamma < 1, f"gamma={self.gamma!r} must be in (-1, 1)")
        need(self.k > 0, f"k={self.k!r} must be > 0")
        bmin = self.batch_min if self.batch_min is not None else self.batch
        bmax = self.batch_max if self.batch_max is not None else self.batch
        need(bmin >= 1, f"batch_min={bmin!r} must be >= 1")
        need(bmin <= bmax, f"batch_min={bmin} > batch_max={bmax}; need batch_min <= batch_max")
        need(bmin <= self.batch <= bmax, f"batch={self.batch} is outside [batch_min={bmin}, batch_max={bmax}]")
        need(self.balance in ("off", "reactive", "predictive"),
             f"balance={self.balance!r} is unknown; valid: off, reactive, predictive")
        need(isinstance(self.p_balance, int) and self.p_balance >= 1, f"p_balance={self.p_balance!r} must be >= 1")
        need(isinstance(self.metrics_period, int) and self.metrics_period >= 1,
             f"metrics_period={self.metrics_period!r} must be >= 1")
        return self

    @property
    def B_min(self) -> int:
        return self.batch_min if self.batch_min is not None else self.batch

    @property
    def B_max(self) -> int:
        return self.batch_max if self.batch_max is not None else self.batch

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, d: dict) -> JobConfig:
        flat = {}
        for k, v in d.items():
            if isinstance(v, dict) and k not in ("slowdown", "autoscale"):
                flat.update(v)   # allow [train], [adaptive], ... tables
            else:
                flat[k] = v
        flat = {k.replace("-", "_"): v for k, v in flat.items()}
        bad = [k for k in flat if k not in cls.keys()]
        if bad:
            raise ConfigError(f"unknown config key {bad[0]!r}; valid keys: {', '.join(cls.keys())}")
        if "slowdown" in flat:
            flat["slowdown"] = {int(k): v for k, v in flat["slowdown"].items()}
        return cls(**flat).validate()

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> JobConfig:
        d = read_toml(path)
        d.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def add_arguments(parser) -> None:
    """Flags for every JobConfig key (flags override the TOML file given by --config)."""
    g = parser.add_argument_group("hpc-jabas")
    g.add_argument("--config", help="TOML job configuration")
    g.add_argument("--epochs", type=int)
    g.add_argument("--batch", type=int, help="initial global batch size B")
    g.add_argument("--micro-batch", type=int, help="micro-batch size b (default: planner's choice)")
    g.add_argument("--seed", type=int)
    g.add_argument("--run-dir")
    g.add_argument("--planner", choices=PLANNERS)
    g.add_argument("--plan", help="explicit plan, e.g. 'b=4 n=1,3,4' (implies --planner fixed)")
    g.add_argument("--gpu-types", help="GPU type per rank, e.g. v100,p100,rtx2060")
    g.add_argument("--speeds", help="declared per-rank speeds for --planner lbbsp, e.g. 1,0.5,0.25")
    g.add_argument("--profile-dir")
    g.add_argument("--emulate", action="store_true", default=None, help="emulate the GPU types on CPU ranks")
    g.add_argument("--policy", choices=POLICIES)
    g.add_argument("--p", type=int, help="iterations between batch-size decisions")
    g.add_argument("--alpha", type=float)
    g.add_argument("--gamma", type=float)
    g.add_argument("--k", type=float)
    g.add_argument("--batch-min", type=int)
    g.add_argument("--batch-max", type=int)
    g.add_argument("--lr-rule", choices=LR_RULES)
    g.add_argument("--balance", choices=("off", "reactive", "predictive"))
    g.add_argument("--p-balance", type=int)
    g.add_argument("--slowdown", action="append",
                   help="RANK:factor=3,start=50[,end=..,kind=step|ramp|periodic] (repeatable)")
    g.add_argument("--no-checkpoint", action="store_true", default=None)


def from_args(args) -> JobConfig:
    d: dict = {}
    if getattr(args, "config", None):
        d = read_toml(args.config)
    flat = JobConfig.from_dict(d).to_dict() if d else {}
    for k in ("epochs", "batch", "micro_batch", "seed", "run_dir", "planner", "plan", "profile_dir", "emulate",
              "policy", "p", "alpha", "gamma", "k", "batch_min", "batch_max", "lr_rule", "balance", "p_balance"):
        v = getattr(args, k, None)
        if v is not None:
            flat[k] = v
    if getattr(args, "gpu_types", None):
        flat["gpu_types"] = [s for s in args.gpu_types.split(",") if s]
    if getattr(args, "speeds", None):
        try:
            flat["speeds"] = [float(s) for s in args.speeds.split(",") if s]
        except ValueError:
            raise ConfigError(f"--speeds {args.speeds!r} must be numbers separated by commas, "
                              "e.g. 1,0.5,0.25") from None
    if getattr(args, "plan", None) and not getattr(args, "planner", None):
        flat["planner"] = "fixed"
    if getattr(args, "slowdown", None):
        sd = {}
        for s in args.slowdown:
            r, _, spec = s.partition(":")
            if not r.isdigit() or not spec:
                raise ConfigError(f"--slowdown {s!r} must be RANK:factor=...,start=..., e.g. 2:factor=3,start=50")
            sd[int(r)] = spec
        flat["slowdown"] = sd
    if getattr(args, "no_checkpoint", None):
        flat["checkpoint"] = False
    return JobConfig.from_dict(flat)
