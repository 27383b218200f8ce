"""The torch backend under srun on the real local Slurm cluster, without an MPI plugin (``--mpi=none``): the
ranks meet at the step's first node (its NodeAddr from scontrol: the local nodes' names do not resolve) on a
port derived from the job and step ids, across two nodes. The plugin's way (``--mpi=pmix``, a heterogeneous
step) runs in tests/test_slurm_lifecycle.py's hand-submitted chain; mpirun and torchrun in
tests/test_backend_torch.py and tests/test_backend_rendezvous.py."""
import json

import pytest
from mpi_util import PY, ROOT, WORKERS

pytestmark = pytest.mark.slurm


def test_srun_without_mpi_plugin_two_nodes(slurm_cluster):
    r = slurm_cluster.run("srun", "-p", "v100", "-N", "2", "-n", "3", "--mpi=none", "-t", "2",
                          f"--chdir={ROOT}", f"--export=ALL,PYTHONPATH={ROOT}", PY,
                          str(WORKERS / "torch_comm_worker.py"), check=False, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = sorted((json.loads(ln[2:]) for ln in r.stdout.splitlines() if ln.startswith("@@")),
                  key=lambda d: d["rank"])
    assert [(d["rank"], d["size"], d["launcher"]) for d in rows] == [(k, 3, "srun") for k in range(3)]
    assert max(d["max_err"] for d in rows) == 0.0
    assert all(d["gathered"] == [0, 1, 4] and d["broadcast"] == "x" and d["ragged"] == [0, 0, 1, 0, 1, 2]
               for d in rows)
