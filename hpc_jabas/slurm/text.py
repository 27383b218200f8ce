"""Slurm's text, pure: parsing what scontrol, sinfo, sacct and sbatch print (no subprocess here).

* ``scontrol show node|partition|job -o``: one ``Key=value`` record a line -> :func:`parse_oneliner`,
  :func:`parse_scontrol`.
* GRES and TRES strings (``gpu:a100:2(S:0-1)``, ``cpu=1,gres/gpu=1``, ``GRES/gpu=4.0``): :func:`parse_gres`,
  :func:`parse_alloc_gpus`, :func:`parse_billing`; node states: :func:`node_usable`; host lists
  (``gpuv[1-2]``): :func:`expand_hostlist`.
* ``sacct -P`` rows, heterogeneous-job components (``123+1``) and steps (``123+1.batch``) included:
  :func:`parse_sacct`, :func:`split_job_id`, :func:`base_state` ("CANCELLED by 0" -> "CANCELLED").
* ``sbatch --parsable`` output -> the job id: :func:`parse_sbatch_id`.

The sbatch text hpc-jabas writes is rendered in :mod:`hpc_jabas.slurm.sbatch`.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from hpc_jabas.core.config import gpus
from hpc_jabas.errors import ConfigError

#: node flags/states that keep a node from taking a new job (lower case, '*' = not responding)
UNUSABLE = frozenset({"down", "drain", "drained", "draining", "fail", "failing", "maint", "reserved",
                      "not_responding", "invalid_reg", "inval", "future", "unknown", "error",
                      "reboot_requested", "reboot_issued", "powering_down", "power_down", "no_respond",
                      "perfctrs", "blocked"})


# ---- scontrol -o records, GRES, TRES, node states, host lists --------------------------------
_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:.]*=|\s*$)")


def parse_oneliner(line: str) -> dict[str, str]:
    """``scontrol -o`` record 'Key=value Key2=value with spaces ...' -> dict."""
    return {m.group(1): m.group(2) for m in _KV.finditer(line.strip())}


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """``scontrol show node|partition|job -o`` output -> one dict a record (a hetjob: one per component)."""
    return [parse_oneliner(ln) for ln in text.splitlines() if ln.strip()]


_GRES_ITEM = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+[KMG]?))?(?:\(.*\))?$")


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on sep outside parentheses/brackets."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _count(text: str | None) -> int:
    if not text:
        return 1
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1], 1)
    return int(text.rstrip("KMG")) * mult


def parse_gres(text: str | None) -> dict[str | None, int]:
    """'gpu:a100:2(S:0-1),mps:400' -> {'a100': 2}; 'gpu:2' -> {None: 2}; '(null)' -> {}.

    Only ``gpu`` GRES are counted; used-GRES strings ('gpu:a100:1(IDX:0)') parse the same way.
    """
    out: dict[str | None, int] = {}
    if not text or text in ("(null)", "N/A", "none"):
        return out
    for item in split_top(text):
        m = _GRES_ITEM.match(item)
        if not m or m.group("name") != "gpu":
            continue
        t, c = m.group("type"), m.group("count")
        if t is not None and c is None and t.isdigit():   # 'gpu:2': the count sits in the type slot
            t, c = None, t
        out[t] = out.get(t, 0) + _count(c)
    return out


def parse_alloc_gpus(alloc_tres: str | None) -> int | None:
    """'cpu=1,mem=512M,gres/gpu=1' -> 1; None when AllocTRES does not track gres/gpu."""
    if alloc_tres is None:
        return None
    total = None
    for item in split_top(alloc_tres):
        k, _, v = item.partition("=")
        if k.strip().lower() == "gres/gpu":
            total = int(float(v))
    return total if total is not None else (0 if alloc_tres.strip() == "" else None)


def parse_billing(weights: str | None, gpu_type: str | None = None) -> float | None:
    """TRESBillingWeights 'CPU=1.0,GRES/gpu=4.0' (or 'GRES/gpu:a100=4') -> 4.0; None if no GPU weight."""
    if not weights or weights in ("(null)", "N/A"):
        return None
    generic, typed = None, {}
    for item in split_top(weights):
        k, _, v = item.partition("=")
        k = k.strip().lower()
        if not k.startswith("gres/gpu"):
            continue
        try:
            w = float(re.sub(r"[KMGTP]$", "", v.strip(), flags=re.I))
        except ValueError:
            continue
        if k == "gres/gpu":
            generic = w
        elif k.startswith("gres/gpu:"):
            typed[k.split(":", 1)[1]] = w
    if gpu_type is not None:
        for t, w in typed.items():
            try:
                if gpus.normalize(t) == gpu_type:
                    return w
            except ConfigError:
                if t == gpu_type:
                    return w
    if generic is not None:
        return generic
    if len(typed) == 1:
        return next(iter(typed.values()))
    return None


def node_usable(state: str) -> bool:
    s = state.strip().lower()
    if not s or s.endswith("*") or "*" in s:
        return False
    parts = {p.strip("*~#!%$@^-") for p in s.split("+")}
    return not (parts & UNUSABLE)


def expand_hostlist(text: str) -> list[str]:
    """Slurm hostlist 'gpuv[1-2,05-06],gpua1' -> ['gpuv1', 'gpuv2', 'gpuv05', 'gpuv06', 'gpua1']."""
    out: list[str] = []
    for item in split_top(text or ""):
        out.extend(_expand_one(item))
    return out


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    names = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if hi:
            width = len(lo)
            names += [f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            names.append(lo)
    return [head + n + rest for n in names for rest in _expand_one(tail)]


def gpu_type_of(raw: str | None) -> str | None:
    """The catalog GPU type a GRES type name or partition name stands for; None when it is none."""
    if raw is None:
        return None
    try:
        return gpus.normalize(raw)
    except ConfigError:
        return None


# ---- sacct -P ---------------------------------------------------------------------------------
SACCT_FIELDS = ("JobID", "State", "Start", "End", "Partition", "NodeList")
_JOB_ID = re.compile(r"^(?P<job>\d+(?:_\d+)?)(?:\+(?P<comp>\d+))?(?:\.(?P<step>.+))?$")


@dataclass(frozen=True)
class SacctRow:
    """One sacct record: ``job`` the job's id (a heterogeneous job's leader id), ``component`` its
    het-job component (``123+1`` -> 1; None for a plain job), ``step`` the step (``123.batch`` ->
    "batch"; None for the job's own record), ``fields`` every column by name."""
    job: str
    component: int | None
    step: str | None
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return base_state(self.fields.get("State", ""))


def split_job_id(text: str) -> tuple[str, int | None, str | None] | None:
    """'123' -> ('123', None, None); '123+1' -> ('123', 1, None); '123+0.batch' -> ('123', 0, 'batch');
    '45_3.0' -> ('45_3', None, '0'); anything else -> None."""
    m = _JOB_ID.match(text.strip())
    if m is None:
        return None
    comp = m.group("comp")
    return m.group("job"), (int(comp) if comp is not None else None), m.group("step")


def base_state(state: str) -> str:
    """sacct's state without its remark: 'CANCELLED by 0' -> 'CANCELLED'; '' -> ''."""
    return (state.split() or [""])[0].rstrip("+")


def parse_sacct(text: str, fields: Sequence[str] = SACCT_FIELDS, header: bool = False) -> list[SacctRow]:
    """``sacct -P -o <fields>`` output (``-n``: no header; ``header=True`` reads the names from the
    first line) -> one :class:`SacctRow` a record, in order; unreadable lines are skipped."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if header:
        if not lines:
            return []
        fields, lines = lines[0].split("|"), lines[1:]
    out = []
    for ln in lines:
        cols = ln.split("|")
        if len(cols) < len(fields):
            continue
        rec = {k: v.strip() for k, v in zip(fields, cols)}
        ids = split_job_id(rec.get("JobID", ""))
        if ids is None:
            continue
        out.append(SacctRow(ids[0], ids[1], ids[2], rec))
    return out


# ---- sbatch --parsable ------------------------------------------------------------------------
def parse_sbatch_id(stdout: str) -> str | None:
    """``sbatch --parsable`` prints 'JOBID' or 'JOBID;CLUSTER' -> 'JOBID'; None when no id is there."""
    line = next((ln.strip() for ln in stdout.splitlines() if ln.strip()), "")
    jid = line.split(";")[0].strip()
    return jid if re.fullmatch(r"\d+", jid) else None
