"""examples/train_lm.py on 2 ranks: the token-count weighted update equals one process's token-mean
big-batch step (varying lengths, micro-batches of different token counts)."""
import json
import subprocess

import pytest
import torch
from mpi_util import PY, ROOT, mpi_env

from examples.train_lm import lm_forward, lm_terms, make_data, make_model, make_optimizer
from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler

N, PLAN, LR = 48, "b=4 n=1,3", 0.05


def reference(token_weighted: bool = True) -> dict:
    """One process, one batch of B sequences per iteration: token-mean loss (or the sample-weighted mean
    of the micro-batches' token means, the wrong alternative)."""
    ds = make_data(N)
    X, L = ds.tensors
    model = make_model()
    opt = make_optimizer("sgd", model, LR)
    sampler = HeterogeneousSampler(N, seed=0)
    plan = Plan.parse(PLAN)
    while not sampler.epoch_done(plan.B):
        ib = sampler.next(plan)
        opt.zero_grad()
        if token_weighted:
            i = torch.as_tensor(ib.all_indices(), dtype=torch.long)
            loss_sum, _, ntok = lm_terms(model, (X[i], L[i]))
            loss = loss_sum / ntok
        else:
            loss = sum(lm_forward(model, (X[torch.as_tensor(m)], L[torch.as_tensor(m)]))[0] * len(m)
                       for r in ib.micro for m in r) / ib.total
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.mpi
def test_tiny_lm_example_token_weighted_equals_one_process(tmp_path):
    run_dir, summary = tmp_path / "run", tmp_path / "summary.json"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY, "examples/train_lm.py", "-q",
           "--n", str(N), "--n-val", "40", "--plan", PLAN, "--epochs", "1", "--optimizer", "sgd", "--lr", str(LR),
           "--run-dir", str(run_dir), "--summary", str(summary)]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    res = json.loads(summary.read_text())
    assert 100_000 <= res["params"] <= 1_000_000 and res["iterations"] == N // Plan.parse(PLAN).B
    assert res["evals"][0]["count"] == int((make_data(40, seed=1).tensors[1] - 1).sum())    # token-weighted eval
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    st = torch.load(ckpts[-1], weights_only=False)
    ref, wrong = reference(True), reference(False)
    assert max((ref[k] - wrong[k]).abs().max().item() for k in ref) > 1e-4      # the weighting matters here
    for k, v in ref.items():
        assert torch.allclose(st["model"][k], v, atol=1e-5, rtol=0), (k, (st["model"][k] - v).abs().max())
