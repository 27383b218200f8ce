"""hpc_jabas.runtime.headroom_probe against closed-form quadratics: a linear least-squares model, whose loss is
exactly quadratic with H = X'X / n, so g'Hg and the headroom are known in numpy; the loss one step of h x delta
later equals the loss now (the edge itself, measured by the model's own forward); Adam's preconditioned
direction from its state; two parameter groups; an attention model against a finite-difference Hessian-vector
product; buffers and .grad left as they were; an unsupported optimizer is one line."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpc_jabas.core.adaptive import headroom as hr
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.headroom_probe import probe_headroom


@pytest.fixture(autouse=True)
def _float64():
    """Exact closed forms need float64; the default dtype is put back for the other test files."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _lsq(seed=0, n=64, d=5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * rng.uniform(0.2, 3.0, d)
    y = X @ rng.standard_normal(d) + rng.standard_normal(n)
    model = torch.nn.Linear(d, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(rng.standard_normal((1, d))))
        model.bias.fill_(0.3)
    return model, torch.tensor(X), torch.tensor(y).unsqueeze(1), X, y


def _loss(out, t):
    return 0.5 * F.mse_loss(out, t)


def _numpy_g_H(model, X, y):
    """g and H of 0.5 mean (X~ theta - y)^2 with X~ = [X, 1], theta = [w, b] (the model's parameter order)."""
    Xa = np.hstack([X, np.ones((len(X), 1))])
    th = np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()])
    H = Xa.T @ Xa / len(X)
    g = Xa.T @ (Xa @ th - y) / len(X)
    return g, H


@pytest.mark.parametrize("lr,momentum", [(0.05, 0.9), (0.3, 0.0)])
def test_sgd_headroom_is_the_closed_form_and_the_edge_of_the_step(lr, momentum):
    model, Xt, yt, X, y = _lsq()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    pr = probe_headroom(model, _loss, Xt, yt, opt)
    g, H = _numpy_g_H(model, X, y)
    want = hr.headroom(hr.eps_max(g, H @ g), lr, momentum)
    assert want == pytest.approx(2 * (g @ g) / (g @ H @ g) * (1 - momentum) / lr, rel=1e-12)
    assert pr.h == pytest.approx(want, rel=1e-10)
    assert pr.eps_max == pytest.approx((g @ g) / (g @ H @ g), rel=1e-10)
    assert pr.eps_eff == pytest.approx(lr / (1 - momentum))
    # on a quadratic the step h x delta (delta = eps_eff g) lands exactly back on the loss it started from
    with torch.no_grad():
        before = _loss(model(Xt), yt).item()
        for p, gi in zip(model.parameters(), (g[:-1].reshape(1, -1), g[-1:])):
            p -= pr.h * pr.eps_eff * torch.tensor(gi)
        after = _loss(model(Xt), yt).item()
    assert after == pytest.approx(before, rel=1e-9)


def test_adam_direction_comes_from_its_state():
    model, Xt, yt, X, y = _lsq(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for _ in range(3):
        opt.zero_grad()
        _loss(model(Xt), yt).backward()
        opt.step()
    pr = probe_headroom(model, _loss, Xt, yt, opt)
    g, H = _numpy_g_H(model, X, y)
    v = np.concatenate([opt.state[p]["exp_avg_sq"].numpy().ravel() for p in model.parameters()])
    d = g / (np.sqrt(v / (1 - 0.99 ** 3)) + 1e-8)
    assert pr.h == pytest.approx(2 * (g @ d) / (0.01 * d @ H @ d), rel=1e-9)
    # before any step: the sign-like first direction g / (|g| + eps)
    fresh = torch.optim.AdamW(model.parameters(), lr=0.01)
    d0 = g / (np.abs(g) + 1e-8)
    assert probe_headroom(model, _loss, Xt, yt, fresh).h == pytest.approx(2 * (g @ d0) / (0.01 * d0 @ H @ d0),
                                                                        rel=1e-9)


def test_two_groups_scale_the_step_per_group():
    model, Xt, yt, X, y = _lsq(seed=2)
    opt = torch.optim.SGD([{"params": [model.weight], "lr": 0.1, "momentum": 0.5},
                           {"params": [model.bias], "lr": 0.02}])
    pr = probe_headroom(model, _loss, Xt, yt, opt)
    g, H = _numpy_g_H(model, X, y)
    delta = g * np.array([0.2] * 5 + [0.02])
    assert pr.h == pytest.approx(2 * (g @ delta) / (delta @ H @ delta), rel=1e-10)
    assert pr.eps_eff == pytest.approx(0.2)


def test_reduce_averages_the_two_scalars_once():
    model, Xt, yt, _, _ = _lsq(seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    alone = probe_headroom(model, _loss, Xt, yt, opt)
    seen = []

    def other_rank(x):          # another rank whose probe batch gave (3 g'delta, 5 delta'H delta)
        seen.append(x.clone())
        return (x + x * torch.tensor([3.0, 5.0])) / 2
    pr = probe_headroom(model, _loss, Xt, yt, opt, reduce=other_rank)
    assert len(seen) == 1 and seen[0].shape == (2,)
    assert pr.h == pytest.approx(2 * (4 * alone.gd) / (6 * alone.dhd), rel=1e-12)


class _Attn(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.norm = torch.nn.BatchNorm1d(d)
        self.out = torch.nn.Linear(d, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        return self.out(self.norm(a.mean(dim=1)))


def test_attention_model_against_a_finite_difference_hvp_and_nothing_left_changed():
    torch.manual_seed(0)
    model = _Attn()
    x, t = torch.randn(16, 6, 8), torch.randint(0, 3, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    buffers = [b.clone() for b in model.buffers()]
    pr = probe_headroom(model, F.cross_entropy, x, t, opt)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    params = list(model.parameters())

    def grad_at(shift):
        with torch.no_grad():
            for p, s in zip(params, shift):
                p.add_(s)
        gs = torch.autograd.grad(F.cross_entropy(model(x), t), params)
        with torch.no_grad():
            for p, s in zip(params, shift):
                p.sub_(s)
        for b, s in zip(model.buffers(), buffers):
            b.copy_(s)
        return gs
    g = grad_at([torch.zeros_like(p) for p in params])
    delta = [pr.eps_eff * gi for gi in g]
    tau = 1e-5
    gp, gm = grad_at([tau * d for d in delta]), grad_at([-tau * d for d in delta])
    dhd = sum(((a - b) / (2 * tau) * d).sum().item() for a, b, d in zip(gp, gm, delta))
    gd = sum((gi * d).sum().item() for gi, d in zip(g, delta))
    assert pr.gd == pytest.approx(gd, rel=1e-9)
    assert pr.dhd == pytest.approx(dhd, rel=1e-5)
    assert math.isfinite(pr.h) and pr.h == pytest.approx(2 * gd / dhd, rel=1e-5)


def test_an_optimizer_without_a_probe_is_one_line():
    model, Xt, yt, _, _ = _lsq()
    with pytest.raises(ConfigError, match="optimizer=RMSprop") as e:
        probe_headroom(model, _loss, Xt, yt, torch.optim.RMSprop(model.parameters(), lr=0.01))
    assert "\n" not in str(e.value)


SCRIPT = '''
import json, sys
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hpc_jabas.runtime.headroom_probe import probe_headroom

torch.set_default_dtype(torch.float64)
dist.init_process_group("gloo")
rank = dist.get_rank()
rng = np.random.default_rng(10 + rank)                   # each rank its own probe batch
X = torch.tensor(rng.standard_normal((32, 4)) * (1 + rank))
y = torch.tensor(rng.standard_normal((32, 1)))
torch.manual_seed(0)                                     # the same weights on every rank
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss = lambda o, t: 0.5 * F.mse_loss(o, t)
own = probe_headroom(model, loss, X, y, opt, reduce=lambda x: x)
both = probe_headroom(model, loss, X, y, opt)
json.dump({"own": [own.gd, own.dhd, own.h], "both": [both.gd, both.dhd, both.h]},
          open(f"rank{rank}.json", "w"))
dist.barrier()                                           # no rank tears Gloo down while the other still talks
dist.destroy_process_group()
'''


def test_two_ranks_under_torchrun_average_the_two_scalars(tmp_path):
    (tmp_path / "probe.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "PYTHONPATH"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    p = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "probe.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    r = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    gd, dhd = (r[0]["own"][0] + r[1]["own"][0]) / 2, (r[0]["own"][1] + r[1]["own"][1]) / 2
    assert r[0]["own"][2] != pytest.approx(r[1]["own"][2], rel=1e-3)        # the ranks' batches differ
    for k in range(2):
        assert r[k]["both"][:2] == pytest.approx([gd, dhd], rel=1e-12)
        assert r[k]["both"][2] == pytest.approx(2 * gd / dhd, rel=1e-12)
