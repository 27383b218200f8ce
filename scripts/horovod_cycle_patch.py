"""Edit Horovod 0.28.1's background loop so that the ranks' cycles stay in phase (CPU builds; scripts/setup.sh).

Horovod's background thread sleeps until ``last_cycle_start + cycle_time`` and then negotiates with every other
rank in one MPI_Allreduce (``horovod/common/operations.cc: RunLoopOnce``). A rank that started its cycle
earlier waits in that allreduce, and Open MPI waits by spinning (``sched_yield``). All ranks leave the allreduce
together, but each sleeps relative to its *own* cycle start, so the rank that waited wakes early again: the
offset between the ranks never closes, and on cores shared by several ranks (CPU ranks, emulated GPU types) every
rank spins for most of every cycle. A 3-rank emulated run on 2 cores took 60 CPU-s in 38 s with the released
code and 20 CPU-s in 37 s with this edit (docs/toolchain.md).

The edit: sleep one cycle time from the *end* of the previous cycle (``start_time``, taken after its work),
so that ranks leaving a collective together start the next cycle together. A cycle then lasts its work plus
the cycle time (1 ms by default, ``HOROVOD_CYCLE_TIME``) instead of the larger of the two.

Usage: python scripts/horovod_cycle_patch.py HOROVOD_SOURCE_DIR   (exit 1 when the code is not as expected)
"""
from __future__ import annotations

import sys
from pathlib import Path

OLD = "  auto sleep_duration = state.last_cycle_start +\n"
NEW = "  auto sleep_duration = start_time +   // hpc-jabas: in phase (scripts/horovod_cycle_patch.py)\n"


def patch(src: Path) -> None:
    f = src / "horovod" / "common" / "operations.cc"
    text = f.read_text()
    if NEW in text:
        return
    if text.count(OLD) != 1:
        raise SystemExit(f"horovod_cycle_patch: {f} does not have the expected RunLoopOnce code; "
                         "this edit is written for Horovod 0.28.1")
    f.write_text(text.replace(OLD, NEW))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/horovod_cycle_patch.py HOROVOD_SOURCE_DIR")
    patch(Path(sys.argv[1]))
    print("horovod_cycle_patch: applied")
