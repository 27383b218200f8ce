"""`hpc-jabas doctor`: what this machine has, and the command that fixes each missing piece."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError


def _run(cmd: list[str], timeout: float = 10.0) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(cmd)}: timed out after {timeout:.0f} s"


def _slurm_offers(say, missing: list[str]) -> None:
    """What a job needs of the site's Slurm (docs/cluster.md): each partition's GPU type (typed GRES, or a
    partition named after a catalog type) and srun's PMIx plugin (the job scripts run ``srun --mpi=pmix``)."""
    from hpc_jabas.slurm.text import gpu_type_of, parse_gres
    rc, text = _run(["sinfo", "-h", "-o", "%P|%G"], timeout=8)
    types: dict[str, set[str]] = {}
    for ln in text.splitlines() if rc == 0 else []:
        part, _, gres = ln.strip().partition("|")
        found = {gpu_type_of(t) for t in parse_gres(gres) if t}
        types.setdefault(part.rstrip("*"), set()).update(t for t in found if t)
    for part, ts in types.items():
        if not ts and gpu_type_of(part):
            ts.add(f"{gpu_type_of(part)} (from the name)")
    shown = ", ".join(f"{part}={'+'.join(sorted(ts)) or '?'}" for part, ts in sorted(types.items()))
    say("slurm gpu types", shown or "(no partitions)")
    untyped = [part for part, ts in sorted(types.items()) if not ts]
    if untyped:
        say("", f"no GPU type for {', '.join(untyped)} (neither typed GRES nor a type's name): "
                "give gpu_types in the job file for jobs there")
    rc, text = _run(["srun", "--mpi=list"], timeout=8)
    plugins = sorted({w for ln in text.splitlines() for w in ln.split()
                      if ln.startswith(("\t", " ")) and w.isidentifier()}) if rc == 0 else []
    say("srun mpi plugins", ", ".join(plugins) if plugins else f"unknown ({text.splitlines()[0] if text else rc})")
    if rc == 0 and "pmix" not in plugins:
        missing.append("srun has no pmix plugin (srun --mpi=list): hpc-jabas's job scripts run srun --mpi=pmix; "
                       "ask the site for Slurm built with PMIx")


SETUP = "make setup   (runs scripts/setup.sh)"


def _check_torch(say, missing: list[str]) -> None:
    try:
        import torch
        dev = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
        say("torch", f"{torch.__version__}  device={dev}")
    except ImportError:
        say("torch", "MISSING")
        missing.append(f"torch is not installed: {SETUP}")


def _check_backends(say, missing: list[str]) -> None:
    """The backends (docs/backends.md): Horovod where it is installed, torch.distributed otherwise (backend
    auto), and what HPC_JABAS_BACKEND asks for."""
    from hpc_jabas.runtime.comm import seam as comm
    hvd_ok, why = comm.horovod_importable()
    if hvd_ok:
        from hpc_jabas.runtime.comm import horovod_backend as comm_horovod
        info = comm_horovod.build_info()
        ctrl = [n for n, ok in (("MPI", info["mpi_built"]), ("Gloo", info["gloo_built"])) if ok]
        ops = [n for n, ok in (("MPI", info["mpi_built"]), ("Gloo", info["gloo_built"]),
                               ("NCCL", info["nccl_built"])) if ok]
        say("horovod", f"{info['version']}  frameworks=[PyTorch]  controllers={ctrl}  tensor_ops={ops}")
        for need in ("MPI", "Gloo"):
            if need not in ctrl:
                missing.append(f"horovod lacks the {need} controller: rebuild it with {SETUP}")
    else:
        say("horovod", f"not installed (optional: backend auto uses torch.distributed; {why})")
    try:
        import torch.distributed as dist
        tops = [n for n, ok in (("Gloo", dist.is_available() and dist.is_gloo_available()),
                                ("NCCL", dist.is_available() and dist.is_nccl_available())) if ok]
        say("torch.distributed", f"backends={tops}")
        if not hvd_ok and "Gloo" not in tops:
            missing.append("torch.distributed lacks Gloo and Horovod is not installed: install a torch build "
                           "with distributed support (pip install torch)")
    except ImportError:
        pass
    asked = "auto"
    try:
        asked = settings.backend() or "auto"
        got = comm.resolve(asked)
        say("backend", f"{asked} -> {got}  (JobConfig backend, --backend, {comm.ENV})")
        if got == "horovod" and not hvd_ok:
            missing.append(f"{comm.ENV}={asked} but Horovod does not import: unset it (auto uses torch.distributed)")
    except ConfigError as e:
        say("backend", f"{comm.ENV}: not a backend")
        missing.append(str(e))


def _check_mpi_and_submitit(say, missing: list[str]) -> None:
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
        missing.append(f"mpi4py is not installed: {SETUP}")
    try:
        import submitit
        say("submitit", submitit.__version__)
    except ImportError:
        say("submitit", "MISSING")
        missing.append(f"submitit is not installed: {SETUP}")


def _check_slurm(say, missing: list[str]) -> None:
    if shutil.which("sinfo") is None:
        say("slurm", "MISSING (sinfo not on PATH)")
        missing.append("sinfo not on PATH: apt-get install -y slurm-client (or `module load slurm` on a cluster)")
        return
    rc, text = _run(["sinfo", "-h", "-o", "%P %a %D %T"], timeout=8)
    if rc == 0:
        parts = sorted({ln.split()[0] for ln in text.splitlines() if ln.strip()})
        say("slurm", f"controller reachable; partitions: {', '.join(parts) or '(none)'}")
        _slurm_offers(say, missing)
    else:
        first = text.splitlines()[0] if text else f"exit {rc}"
        say("slurm", f"sinfo present, controller NOT reachable ({first}); local cluster: slurm/local/up.sh")


def check(out=sys.stdout) -> int:
    """One line per piece this machine has (or lacks), then one ``missing:`` line per missing piece with the
    command that fixes it; 0 when nothing is missing, else 1."""
    missing: list[str] = []
    say = lambda k, v: print(f"{k:<22} {v}", file=out)
    _check_torch(say, missing)
    _check_backends(say, missing)
    _check_mpi_and_submitit(say, missing)
    _check_slurm(say, missing)
    lmod = os.environ.get("LMOD_CMD") or next(
        (p for p in ("/usr/share/lmod/lmod/libexec/lmod",) if os.path.exists(p)), None)
    say("lmod", f"present ({lmod})" if lmod else "not found (optional: apt-get install -y lmod)")
    from hpc_jabas.cli.extras import EXTRAS
    from hpc_jabas.cli.extras import missing as lacking
    for extra in EXTRAS:                          # optional: listed, never counted as missing
        lack = lacking(extra)
        say(f"extra [{extra}]", "present" if not lack else
            f"not installed (optional: pip install 'hpc-jabas[{extra}]' for {', '.join(lack)})")
    for m in missing:
        print(f"missing: {m}", file=out)
    say("status", "OK" if not missing else f"{len(missing)} missing piece(s)")
    return 0 if not missing else 1
