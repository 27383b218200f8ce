"""The torch.distributed backend (runtime/comm/torch_backend.py) on 3 real mpirun ranks with Horovod made unimportable,
so that backend = "auto" must pick torch and nothing on its path may need Horovod. One launch runs every
scenario (tests/workers/backend_worker.py: train_worker.py's cases):

* equivalence to one big batch: Adam across a plan change and a B change in which rank 0 has no micro-batch
  (its gradients start in parameter order, the others' in the backward's), and per-rank micro-batch sizes;
* allocation invariance of an adaptive run: the similarity policy (measurement iterations: the ``hj.m``
  stream) on two GPU mixes gives the same B trajectory and the same parameters;
* rebalancing: a rank slowed 3x (emulated) loses share; the run still equals one process fed the same batches.

The comparison of the two backends' parameters on the adaptive case is in docs/backends.md.
"""
import pytest
import torch
from mpi_util import run_ranks_cases
from reference import reference_run
from test_equivalence import CASES, PER_RANK, assert_params_close, case_spec

from hpc_jabas.core.config import gpus

#: the adaptive case: test_adaptive_invariance_mpi.py's, shorter
ADAPTIVE = {"planner": "optimal", "micro_batch": 8, "policy": "similarity", "p": 5, "gamma": 0.3,
            "alpha": 0.25, "batch_min": 24, "batch_max": 256, "lr_rule": "sqrt"}
MIXES = (["v100", "p100", "rtx2060"], ["a100", "a100", "v100"])
ADAPTIVE_STEPS = 40
TYPES = ["v100", "p100", "rtx2060"]


def adaptive_spec(mix, run_dir) -> dict:
    return {"optimizer": "momentum", "lr": 0.05, "plan": "b=8 n=3,3,2", "steps": ADAPTIVE_STEPS, "n": 2048,
            "checkpoint": False, "run_dir": str(run_dir), "gpu_types": mix, "config": ADAPTIVE}


def balance_spec(run_dir) -> dict:
    return {"optimizer": "momentum", "lr": 0.02, "plan": "b=4 n=22,15,11", "steps": 16, "n": 4096,
            "checkpoint": False, "run_dir": str(run_dir), "emulate": True, "gpu_types": TYPES,
            "config": {"planner": "lbbsp", "micro_batch": 4, "balance": "reactive", "p_balance": 5,
                       "slowdown": {"0": "factor=3,start=5"}, "emulate_base_s": 0.016,
                       "emulate_per_sample_s": 0.0012}}


def max_param_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two runs' parameters."""
    return max(float((torch.tensor(v, dtype=torch.float64) - torch.tensor(b[k], dtype=torch.float64)).abs().max())
               for k, v in a.items())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("torch_backend")
    specs = {"equal": case_spec(*CASES[3]), "per_rank": PER_RANK,
             "mix0": adaptive_spec(MIXES[0], base / "mix0"), "mix1": adaptive_spec(MIXES[1], base / "mix1"),
             "balance": balance_spec(base / "balance")}
    res = run_ranks_cases("backend_worker.py", list(specs.values()), np_=3, timeout=600)
    return {k: (specs[k], r) for k, r in zip(specs, res)}


@pytest.mark.mpi
def test_torch_backend_without_horovod(runs):
    for _, res in runs.values():
        assert [r["backend"] for r in res] == ["torch"] * 3
    last = runs["balance"][1]
    assert [r["horovod_modules"] for r in last] == [[], [], []]
    assert {r["controller"] for r in last} == {"mpirun"}      # rank and size from Open MPI, address over mpi4py


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["equal", "per_rank"])
def test_torch_backend_equals_one_big_batch(runs, case):
    spec, res = runs[case]
    ref = reference_run(spec)
    init = reference_run(dict(spec, steps=0))
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-3      # the run moved the parameters
    for r in res:
        assert r["iterations"] == spec["steps"]
        assert_params_close(r["params"], ref)
    if case == "equal":      # rank 0 had no micro-batch from step 15 on: fewer samples than the others
        assert res[0]["samples_local"] < res[1]["samples_local"]


@pytest.mark.mpi
def test_torch_backend_adaptive_allocation_invariance(runs):
    a, b = runs["mix0"][1][0], runs["mix1"][1][0]
    Bs_a, Bs_b = [h["B"] for h in a["history"]], [h["B"] for h in b["history"]]
    assert len(Bs_a) == ADAPTIVE_STEPS
    assert Bs_a == Bs_b
    assert len(set(Bs_a)) >= 2, f"the policy did not move B: {sorted(set(Bs_a))}"
    assert [h["plan"] for h in a["history"]] != [h["plan"] for h in b["history"]]
    for k, v in a["params"].items():
        pa, pb = torch.tensor(v, dtype=torch.float64), torch.tensor(b["params"][k], dtype=torch.float64)
        err = float((pa - pb).abs().max() / (pa.abs().max() + 1e-12))
        assert err <= 1e-9, f"{k}: relative difference {err:.2e}"
    for r in runs["mix0"][1][1:]:
        assert r["history"] == a["history"]


@pytest.mark.mpi
def test_torch_backend_rebalances(runs):
    spec, res = runs["balance"]
    hist = res[0]["history"]
    for r in res[1:]:
        assert r["history"] == hist
    assert {h["B"] for h in hist} == {192}
    speeds = [gpus.get(t).relative_speed for t in TYPES]
    slowed = [speeds[0] / 3] + speeds[1:]
    want = slowed[0] / sum(slowed)
    n_after = [int(x) for x in hist[-1]["plan"].split("n=")[1].split(",")]
    assert n_after[0] / sum(n_after) == pytest.approx(want, rel=0.15), (hist[-1]["plan"], want)
    n_before = [int(x) for x in hist[4]["plan"].split("n=")[1].split(",")]
    assert n_before[0] / sum(n_before) > 1.5 * want
    ref = reference_run(dict(spec, schedule={str(h["it"]): h["plan"] for h in hist}))
    for r in res:
        assert_params_close(r["params"], ref)


@pytest.mark.mpi
def test_horovod_and_torch_give_the_same_run(runs, tmp_path):
    """The adaptive case once more on the Horovod backend (the warm rank pool): the same B trajectory, and the
    same parameters up to float reduction order (float64 here: Horovod fuses the gradients into one buffer,
    torch's buckets are laid out in the backward's order)."""
    spec = dict(runs["mix0"][0], run_dir=str(tmp_path / "hvd"), config=dict(ADAPTIVE, backend="horovod"))
    hvd = run_ranks_cases("train_worker.py", [dict(spec, shutdown=True)], np_=3, timeout=600)[0]
    tch = runs["mix0"][1]
    assert [r["backend"] for r in hvd] == ["horovod"] * 3
    Bs_h, Bs_t = [h["B"] for h in hvd[0]["history"]], [h["B"] for h in tch[0]["history"]]
    assert Bs_h == Bs_t and len(set(Bs_h)) >= 2
    assert [h["plan"] for h in hvd[0]["history"]] == [h["plan"] for h in tch[0]["history"]]
    diff = max(max_param_diff(h["params"], t["params"]) for h, t in zip(hvd, tch))
    scale = max(float(torch.tensor(v, dtype=torch.float64).abs().max()) for v in tch[0]["params"].values())
    print(f"horovod vs torch: B trajectory {sorted(set(Bs_t))} ({len(Bs_t)} iterations), largest parameter "
          f"difference {diff:.3e} (largest parameter {scale:.3f})")
    assert diff <= 1e-10 * max(scale, 1.0)
