"""`hpc-jabas doctor`: what this machine has, and the command that fixes each missing piece."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys


def _run(cmd: list[str], timeout: float = 10.0) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(cmd)}: timed out after {timeout:.0f} s"


def check(out=sys.stdout) -> int:
    missing: list[str] = []
    say = lambda k, v: print(f"{k:<22} {v}", file=out)
    setup = "make setup   (runs scripts/setup.sh)"

    try:
        import torch
        dev = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
        say("torch", f"{torch.__version__}  device={dev}")
    except ImportError:
        say("torch", "MISSING")
        missing.append(f"torch is not installed: {setup}")

    try:
        from hpc_jabas.runtime import comm  # the one module that imports horovod
        info = comm.build_info()
        ctrl = [n for n, ok in (("MPI", info["mpi_built"]), ("Gloo", info["gloo_built"])) if ok]
        ops = [n for n, ok in (("MPI", info["mpi_built"]), ("Gloo", info["gloo_built"]),
                               ("NCCL", info["nccl_built"])) if ok]
        say("horovod", f"{info['version']}  frameworks=[PyTorch]  controllers={ctrl}  tensor_ops={ops}")
        for need in ("MPI", "Gloo"):
            if need not in ctrl:
                missing.append(f"horovod lacks the {need} controller: rebuild it with {setup}")
    except ImportError as e:
        say("horovod", f"MISSING ({e})")
        missing.append(f"horovod with PyTorch is not installed: {setup}")

    rc, text = _run(["mpirun", "--version"])
    if rc == 0:
        say("mpi", text.splitlines()[0])
    else:
        say("mpi", "MISSING (mpirun not found)")
        missing.append("mpirun not found: apt-get install -y openmpi-bin libopenmpi-dev")

    try:
        import mpi4py
        say("mpi4py", mpi4py.__version__)
    except ImportError:
        say("mpi4py", "MISSING")
        missing.append(f"mpi4py is not installed: {setup}")

    try:
        import submitit
        say("submitit", submitit.__version__)
    except ImportError:
        say("submitit", "MISSING")
        missing.append(f"submitit is not installed: {setup}")

    if shutil.which("sinfo") is None:
        say("slurm", "MISSING (sinfo not on PATH)")
        missing.append("sinfo not on PATH: apt-get install -y slurm-client (or `module load slurm` on a cluster)")
    else:
        rc, text = _run(["sinfo", "-h", "-o", "%P %a %D %T"], timeout=8)
        if rc == 0:
            parts = sorted({ln.split()[0] for ln in text.splitlines() if ln.strip()})
            say("slurm", f"controller reachable; partitions: {', '.join(parts) or '(none)'}")
        else:
            first = text.splitlines()[0] if text else f"exit {rc}"
            say("slurm", f"sinfo present, controller NOT reachable ({first}); local cluster: slurm/local/up.sh")

    lmod = os.environ.get("LMOD_CMD") or next(
        (p for p in ("/usr/share/lmod/lmod/libexec/lmod",) if os.path.exists(p)), None)
    say("lmod", f"present ({lmod})" if lmod else "not found (optional: apt-get install -y lmod)")

    for m in missing:
        print(f"missing: {m}", file=out)
    say("status", "OK" if not missing else f"{len(missing)} missing piece(s)")
    return 0 if not missing else 1
