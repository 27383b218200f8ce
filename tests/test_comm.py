"""Foundation: weighted allreduce over 3 real Horovod ranks, with the MPI and the Gloo controller."""
import pytest
from mpi_util import run_ranks

VALUES = [1.0, 2.0, 3.0]
WEIGHTS = [5, 11, 16]            # sample counts; equal weighting would give 2.0, not 2.34375


@pytest.fixture(scope="module")
def launched() -> dict:
    """One 3-rank run per launcher (the mpirun one also serves the object collectives' test)."""
    cache: dict = {}

    def get(launcher: str) -> list[dict]:
        if launcher not in cache:
            cache[launcher] = run_ranks("comm_worker.py", {"values": VALUES, "weights": WEIGHTS}, np_=3,
                                        launcher=launcher)
        return cache[launcher]
    return get


@pytest.mark.mpi
@pytest.mark.parametrize("launcher,controller", [("mpirun", "mpi"), ("gloo", "gloo")])
def test_weighted_allreduce(launched, launcher, controller):
    res = launched(launcher)
    expected = sum(v * w for v, w in zip(VALUES, WEIGHTS)) / sum(WEIGHTS)
    assert expected == pytest.approx(2.34375)
    for r in res:
        assert r["size"] == 3
        assert r["controller"] == controller
        assert r["device"] == "cpu"
        for x in r["weighted_mean"]:
            assert x == pytest.approx(expected, rel=1e-12)
            assert abs(x - sum(VALUES) / 3) > 0.3   # a wrong (equal) weighting would fail


@pytest.mark.mpi
def test_object_collectives_round_trip(launched):
    res = launched("mpirun")
    for r in res:
        assert r["broadcast"] == {"from": 0, "payload": [1, 2, {"x": "y"}]}
        assert r["gathered"] == [{"rank": k, "sq": k * k} for k in range(3)]
        assert r["uneven"] == [0, 500, 1000]                         # every rank's own length, in rank order
        assert r["rows"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
        assert r["params"] == [1.0]                                  # rank 0's parameters on every rank
