"""BatchNorm with b pinned on 3 ranks: equivalent to one process running the same micro-batches;
running buffers averaged over ranks, weighted by samples, before a checkpoint."""
import sys
from pathlib import Path

import pytest
import torch
from mpi_util import run_ranks
from torch import nn

from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))
from model_bn import make_data, make_model  # noqa: E402

SPEC = {"n": 192, "b": 4, "B0": 24, "schedule": {"3": 36}, "steps": 6, "lr": 0.05,
        "gpu_types": ["v100", "p100", "v100"]}


def reference(history):
    """One process: the same micro-batches (BN statistics per micro-batch), sample-weighted sum / S."""
    ds = make_data(SPEC["n"])
    X, y = ds.tensors
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=SPEC["lr"], momentum=0.9)
    sampler = HeterogeneousSampler(len(ds), seed=0)
    for h in history:
        ib = sampler.next(Plan.parse(h["plan"]))
        opt.zero_grad()
        total = torch.zeros((), dtype=torch.float64)
        for rank_micro in ib.micro:
            for idx in rank_micro:
                i = torch.as_tensor(idx, dtype=torch.long)
                total = total + nn.functional.cross_entropy(model(X[i]), y[i]) * len(idx)
        (total / ib.total).backward()
        opt.step()
    return model


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_batchnorm_pinned_b_equivalence_and_buffer_averaging(tmp_path, backend):
    res = run_ranks("model_bn.py", dict(SPEC, run_dir=str(tmp_path / "run")), np_=3, backend=backend)
    assert [r["backend"] for r in res] == [backend] * 3
    hist = res[0]["history"]
    plans = [Plan.parse(h["plan"]) for h in hist]
    assert all(p.bs == (4, 4, 4) for p in plans) and plans[0].B == 24 and plans[-1].B == 36   # b pinned, B moved
    assert all(r["history"] == hist for r in res)
    ref = reference(hist)
    for r in res:
        for k, v in ref.named_parameters():
            got = torch.tensor(r["params"][k], dtype=torch.float64)
            assert torch.allclose(got, v.detach(), atol=1e-5, rtol=0), (r["rank"], k, (got - v).abs().max())
    # buffers: different per rank before, equal after, and the sample-weighted mean of the ranks' buffers
    w = torch.tensor([float(r["samples_local"]) for r in res], dtype=torch.float64)
    assert w.sum() == sum(p.B for p in plans) and len(set(w.tolist())) > 1
    for j in range(len(res[0]["before"])):
        per = torch.stack([torch.tensor(r["before"][j], dtype=torch.float64) for r in res])
        if per.dim() > 1:
            assert (per[0] - per[1]).abs().max() > 1e-6           # they had drifted apart
        want = (per * w.reshape(-1, *[1] * (per.dim() - 1))).sum(0) / w.sum()
        if j % 3 == 2:                                            # num_batches_tracked: rounded
            want = want.round()
        for r in res:
            assert torch.allclose(torch.tensor(r["after"][j], dtype=torch.float64), want, atol=1e-12, rtol=0)
            assert r["after"][j] == res[0]["after"][j]
    # the checkpoint (plain torch.load) holds the averaged buffers; no CUDA RNG state on CPU
    st = torch.load(res[0]["checkpoint"], weights_only=False)
    bn = st["model"]
    assert torch.allclose(bn["1.running_mean"], torch.tensor(res[0]["after"][0], dtype=torch.float64))
    assert int(bn["1.num_batches_tracked"]) == int(res[0]["after"][2])
    assert st["rng"]["cuda"] is None and st["iteration"] == SPEC["steps"]
