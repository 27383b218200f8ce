"""Trainer.fit() is built on the public keep-your-loop layer (issue 57, item 3): every iteration of fit() is the calls a
script's own loop makes through ``hpc_jabas.Jabas`` (draw, begin, backward per micro-batch) and the
``HeterogeneousOptimizer`` (its step), and the Trainer's iteration reaches no reducer, collective or gradient
statistic but through that layer. So every fit() test exercises the layer.

- a run: one rank (the torch backend's own process group of one), the layer's public methods spied on (counted, the
  real methods run): each iteration goes through them exactly once (backward once per micro-batch), a measuring
  iteration's ``begin(measure=True)`` included, and the parameters equal an independent big-batch reference
  (plain SGD on each iteration's samples, float64: relative 1e-12);
- the source: trainer.py and the modules its iteration and epoch ends run (step_end, epoch_end, parts, rundir) import
  nothing from runtime/comm (the seam, the reducers, the backends) nor the gradient statistics, and touch no private
  attribute of the layer's objects nor an optimizer's ``reducer``.
"""
import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import hpc_jabas

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "hpc_jabas" / "runtime"
#: trainer.py and the modules fit() delegates its iteration's end, its epoch ends, its parts and run directory to
FIT_MODULES = ("trainer.py", "step_end.py", "epoch_end.py", "parts.py", "rundir.py")
LAYER = {"hpc_jabas.runtime.loop", "hpc_jabas.runtime.optim", "hpc_jabas.core.planning.sampler"}
SPIED = {"Jabas": ("draw", "begin", "backward"), "HeterogeneousOptimizer": ("begin", "step")}


class _Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: dict[str, list] = {}
        for cls_name, methods in SPIED.items():
            cls = getattr(hpc_jabas, cls_name)
            for m in methods:
                self._wrap(monkeypatch, cls, f"{cls_name}.{m}", m)

    def _wrap(self, monkeypatch, cls, key, m):
        real = getattr(cls, m)
        seen = self.calls.setdefault(key, [])

        def spy(obj, *args, **kw):
            out = real(obj, *args, **kw)
            seen.append((args, kw, out))
            return out
        monkeypatch.setattr(cls, m, spy)


def _fit(tmp_path, **kw):
    torch.manual_seed(0)
    X = torch.randn(70, 5, dtype=torch.float64)
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).long()
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()
    start = [p.detach().clone() for p in net.parameters()]
    recs = []

    class Keep(hpc_jabas.Callback):
        def on_step_end(self, trainer, rec):
            recs.append(rec)
    # backend auto: whichever backend this (test) process already runs, one rank either way
    cfg = hpc_jabas.JobConfig(run_dir=str(tmp_path), checkpoint=False, backend="auto", **kw)
    tr = hpc_jabas.Trainer(net, torch.optim.SGD(net.parameters(), lr=0.2), torch.utils.data.TensorDataset(X, y),
                           nn.CrossEntropyLoss(), config=cfg, callbacks=[Keep()])
    out = tr.fit()
    return net, start, X, y, out, recs


def _reference(net, start, X, y, draws, scales, lr=0.2):
    """Plain SGD on one big batch per iteration (the samples the iteration drew, the lr scale it stepped with),
    from the same start."""
    ref = [p.clone().requires_grad_(True) for p in start]
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()
    for ib, scale in zip(draws, scales, strict=True):
        idx = torch.as_tensor(ib.all_indices())
        with torch.no_grad():
            for p, r in zip(model.parameters(), ref):
                p.copy_(r)
        model.zero_grad()
        nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        with torch.no_grad():
            for p, r in zip(model.parameters(), ref):
                r -= lr * scale * p.grad
    got = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    want = torch.cat([r.detach().reshape(-1) for r in ref])
    return float((got - want).norm() / want.norm())


def test_every_fit_iteration_runs_through_the_public_layer(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    net, start, X, y, out, recs = _fit(tmp_path, batch=16, epochs=2, planner="fixed", plan="b=4 n=4")
    it = out["iterations"]
    c = spy.calls
    assert it == len(recs) == 10                  # 70 samples: 4 iterations of 16, then the tail of 6, twice
    for key in ("Jabas.draw", "Jabas.begin", "HeterogeneousOptimizer.begin", "HeterogeneousOptimizer.step"):
        assert len(c[key]) == it, key
    assert len(c["Jabas.backward"]) == sum(r.n_local for r in recs) == 2 * (4 * 4 + 2)
    assert [ib.total for _, _, ib in c["Jabas.draw"]] == [r.samples for r in recs]
    assert {kw.get("lr_scale") for _, kw, _ in c["HeterogeneousOptimizer.step"]} == {1.0}
    assert _reference(net, start, X, y, [ib for _, _, ib in c["Jabas.draw"]], [1.0] * it) <= 1e-12


def test_a_measuring_fit_iteration_is_the_layers_begin_with_measure(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    net, start, X, y, out, recs = _fit(tmp_path, batch=16, epochs=3, policy="similarity", planner="optimal", p=2,
                                       batch_min=8, batch_max=32)
    measured = [kw.get("measure", False) for _, kw, _ in spy.calls["Jabas.begin"]]
    assert measured == [r.measure for r in recs] and sum(measured) >= 3
    assert all(r.stats is not None for r in recs if r.measure)
    scales = [kw["lr_scale"] for _, kw, _ in spy.calls["HeterogeneousOptimizer.step"]]
    assert len(scales) == len(recs) and len({ib.total for _, _, ib in spy.calls["Jabas.draw"]}) >= 2   # B moved
    assert _reference(net, start, X, y, [ib for _, _, ib in spy.calls["Jabas.draw"]], scales) <= 1e-12


def test_a_script_drives_its_own_iterations_with_the_calls_fit_makes(tmp_path):
    """The public calls fit() makes, in a script: ``Jabas.over`` a HeterogeneousOptimizer and a HeterogeneousSampler,
    ``draw``, ``begin`` (every other iteration measuring), ``backward`` per micro-batch, the optimizer's ``step``:
    the big-batch reference (1e-12), a measurement's statistics on the measuring iterations only."""
    me = hpc_jabas.init()                 # auto: the backend this (test) process already runs, if any
    torch.manual_seed(0)
    X = torch.randn(40, 5, dtype=torch.float64)
    y = (X[:, 0] > 0).long()
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()
    start = [p.detach().clone() for p in net.parameters()]
    opt = hpc_jabas.HeterogeneousOptimizer(torch.optim.SGD(net.parameters(), lr=0.2), net.named_parameters())
    sampler = hpc_jabas.HeterogeneousSampler(len(X), seed=3)
    jabas = hpc_jabas.Jabas.over(opt, sampler, hpc_jabas.Plan(4, (3,)), rank=me.rank, world=me.size,
                                 data=torch.utils.data.TensorDataset(X, y))
    draws, stats = [], []
    while not sampler.epoch_done(jabas.B):
        batch = jabas.draw()
        step = jabas.begin(batch, measure=len(draws) % 2 == 0 and batch.total == jabas.B)
        for xb, yb in step:
            with jabas.micro(), jabas.autocast():
                jabas.backward(nn.functional.cross_entropy(net(xb), yb), len(xb))
        opt.step()
        draws.append(batch)
        stats.append(opt.last_stats)
    assert [ib.total for ib in draws] == [12, 12, 12, 4]
    assert [s is not None for s in stats] == [True, False, True, False]
    assert all(s.M == 3 and s.S == 12 and s.similarity is not None for s in stats if s is not None)
    assert _reference(net, start, X, y, draws, [1.0] * len(draws)) <= 1e-12


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_fit_reaches_no_reducer_collective_or_statistic_but_through_the_layer():
    bad = []
    for name in FIT_MODULES:
        tree = ast.parse((RUNTIME / name).read_text())
        for mod in _imports(tree):
            if mod.startswith(("hpc_jabas.runtime.comm.seam", "hpc_jabas.runtime.comm.reducer",
                               "hpc_jabas.runtime.comm.torch_backend", "hpc_jabas.runtime.comm.horovod_backend",
                               "hpc_jabas.runtime.gradstats")) or mod == "hpc_jabas.runtime.comm.seam":
                bad.append(f"{name} imports {mod}")
            if mod in ("hpc_jabas.runtime.comm", "hpc_jabas.runtime.comm.seam"):
                bad.append(f"{name} imports {mod}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("reducer", "use_reducer", "make_reducer"):
                bad.append(f"{name}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr in ("opt", "jabas", "optimizer", "sampler") and node.attr.startswith("_"):
                bad.append(f"{name}:{node.lineno} reads the layer's private .{node.value.attr}.{node.attr}")
    assert bad == []
    trainer = _imports(ast.parse((RUNTIME / "trainer.py").read_text()))
    assert {"hpc_jabas.runtime.loop.Jabas", "hpc_jabas.runtime.optim.HeterogeneousOptimizer",
            "hpc_jabas.core.planning.sampler.HeterogeneousSampler"} <= trainer
    assert LAYER <= {m.rsplit(".", 1)[0] for m in trainer} | trainer


def test_the_trainers_iteration_is_the_layers_calls():
    """train_step draws and begins through ``self.jabas``, runs each micro-batch's backward through it and steps
    the HeterogeneousOptimizer: the same calls, in that order, as a script's loop."""
    tree = ast.parse((RUNTIME / "trainer.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    step = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "train_step")
    calls = [(n.lineno, ast.unparse(n.func)) for n in ast.walk(step) if isinstance(n, ast.Call)]
    order = [f for _, f in sorted(calls) if f in ("self.jabas.draw", "self.jabas.begin", "self.opt.step")]
    assert order == ["self.jabas.draw", "self.jabas.begin", "self.opt.step"]
    local = {}                                   # a local name -> what train_step assigned it (tuples unpacked)
    for n in ast.walk(step):
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            t, v = n.targets[0], n.value
            pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
            local.update({ast.unparse(a): ast.unparse(b) for a, b in pairs})
    micro = next(n for n in ast.walk(step) if isinstance(n, ast.Call) and ast.unparse(n.func) == "micro_step_sums")
    backward_by = ast.unparse(micro.args[2])     # micro_step_sums(model, forward_fn, opt, ...) calls opt.backward
    assert local.get(backward_by, backward_by) == "self.jabas"
    n_class = cls.end_lineno - cls.lineno + 1
    assert n_class <= 400, n_class
