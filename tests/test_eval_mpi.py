"""Distributed evaluation on 3 ranks equals one-process evaluation; ReduceLROnPlateau steps on rank 0's metric."""
import pytest
import torch
from mpi_util import run_ranks
from reference import make_data, make_model
from torch import nn

from hpc_jabas.runtime.evaluate import plateau_value, shard_range

SPEC = {"n": 96, "n_val": 101, "plan": "b=4 n=1,2,3", "epochs": 4, "lr": 0.1, "eval_batch": 7,
        "scores": [1.0, 1.0, 1.0, 0.5]}


def test_shards_cover_once_and_plateau_value():
    for n, w in ((101, 3), (2, 3), (0, 2), (10, 1)):
        got = [i for r in range(w) for i in shard_range(n, r, w)]
        assert got == list(range(n))
        assert max(len(shard_range(n, r, w)) for r in range(w)) - min(len(shard_range(n, r, w)) for r in range(w)) <= 1
    assert plateau_value(0.25, "loss") == 0.25 and plateau_value({"loss": 2, "acc": 1}, "acc") == 1.0
    with pytest.raises(Exception, match="eval_metric='x' is not in the evaluation result"):
        plateau_value({"loss": 1.0}, "x")


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_distributed_eval_equals_one_process_and_plateau_follows_rank0(backend):
    res = run_ranks("model_eval.py", SPEC, np_=3, backend=backend)
    assert [r["backend"] for r in res] == [backend] * 3
    X, y = make_data(SPEC["n_val"], seed=5).tensors
    model = make_model()
    # the lr each epoch's evaluation saw, replayed with torch's own ReduceLROnPlateau on rank 0's scores
    opt = torch.optim.SGD(model.parameters(), lr=SPEC["lr"])
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)
    lrs = []
    for s in SPEC["scores"]:
        lrs.append(opt.param_groups[0]["lr"])
        sched.step(s)
    assert len(set(lrs)) > 1
    for r in res:
        assert len(r["seen"]) == SPEC["epochs"]
        assert [e["lr"] for e in r["seen"]] == lrs and r["lr"] == opt.param_groups[0]["lr"]
        for e in range(SPEC["epochs"]):
            seen = r["seen"][e]
            assert seen["params"] == res[0]["seen"][e]["params"]
            model.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in seen["params"].items()})
            with torch.no_grad():
                out = model(X)
            loss = nn.functional.cross_entropy(out, y).item()
            acc = (out.argmax(1) == y).double().mean().item()
            ev = seen["ev"]
            assert ev["count"] == SPEC["n_val"]
            assert abs(ev["loss"] - loss) < 1e-12 and abs(ev["accuracy"] - acc) < 1e-12, (ev, loss, acc)
    assert res[0]["seen"][0]["ev"]["loss"] != res[0]["seen"][-1]["ev"]["loss"]       # it trained between epochs
