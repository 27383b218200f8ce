"""How often ``torch.compile`` recompiles the micro-batch loop when the micro-batch size b changes.

An adaptive run changes b with each new plan (and the epoch's last iteration takes what is left), so a compiled
model sees a few distinct input sizes. Each mode compiles a fresh copy of a small MLP and runs the same sequence
of micro-batch sizes through forward and backward, counting the graphs Dynamo compiled
(``torch._dynamo.utils.counters``) and the seconds spent in the first call of each new size:

* ``default``: ``torch.compile(model)`` (``dynamic=None``: the first size is specialised; the first change
  recompiles once with the batch dimension symbolic, then no more);
* ``static``: ``dynamic=False`` (one graph per distinct size);
* ``dynamic``: ``dynamic=True`` (symbolic from the start);
* ``marked``: ``dynamic=None`` with ``torch._dynamo.maybe_mark_dynamic(x, 0)`` on every micro-batch's inputs
  (what the Trainer does for a compiled model: runtime/step.py).

    python -m bench.compile_recompiles [--backend inductor|aot_eager|eager] [--quick]

The last line is key=value pairs: the graphs per mode and the sizes it saw.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch._dynamo
from torch import nn

#: micro-batch sizes as an adaptive run meets them: a plan, a move to a larger B, the epoch's short tail, a move
#: back down, and a size of 1 (specialised by Dynamo whatever the mode: 0 and 1 are never symbolic)
SIZES = [16] * 4 + [24] * 4 + [7] + [12] * 4 + [16] * 2 + [32] * 3


def run(mode: str, backend: str, sizes: list[int]) -> tuple[int, float, float]:
    """(graphs compiled, seconds in the first calls of new sizes, seconds in all calls) of one mode."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    kw = {"dynamic": False} if mode == "static" else {"dynamic": True} if mode == "dynamic" else {}
    cm = torch.compile(model, backend=backend, **kw)
    seen: set[int] = set()
    first_s = total_s = 0.0
    for b in sizes:
        x, y = torch.randn(b, 64), torch.randint(0, 10, (b,))
        if mode == "marked":
            torch._dynamo.maybe_mark_dynamic(x, 0)
            torch._dynamo.maybe_mark_dynamic(y, 0)
        t = time.perf_counter()
        nn.functional.cross_entropy(cm(x), y).backward()
        dt = time.perf_counter() - t
        total_s += dt
        if b not in seen:
            first_s += dt
            seen.add(b)
    graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return graphs, first_s, total_s


MODES = ("default", "static", "dynamic", "marked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    ap.add_argument("--quick", action="store_true", help="the aot_eager backend (no code generation)")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)        # one mode, in a process of its own
    args = ap.parse_args()
    backend = "aot_eager" if args.quick else args.backend
    if args.mode:
        print(json.dumps(run(args.mode, backend, SIZES)))
        return
    out: dict[str, object] = {"backend": backend, "sizes": len(set(SIZES))}
    # each mode in a fresh process with inductor's caches off: no mode reuses what another compiled
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    for mode in MODES:
        p = subprocess.run([sys.executable, "-m", "bench.compile_recompiles", "--mode", mode, "--backend", backend],
                           env=env, capture_output=True, text=True, check=True)
        graphs, first_s, total_s = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{mode:<8} graphs={graphs:<3d} first-call s={first_s:7.2f} all calls s={total_s:7.2f}", flush=True)
        out[f"{mode}_graphs"] = graphs
        out[f"{mode}_compile_s"] = round(first_s, 2)
    print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
