"""HeterogeneousOptimizer and micro-batch step pieces that need no Horovod world: config keys, the
skip_synchronize guard, the loss-kind checks, (loss, weight) forwards, device-side statistics helpers."""
import pytest
import torch

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.gradstats import Measurement, mul_, sq_norms
from hpc_jabas.runtime.optim import HeterogeneousOptimizer
from hpc_jabas.runtime.step import micro_step, micro_step_sums


def test_config_keys_clip_grad_norm_and_amp():
    cfg = JobConfig().validate()
    assert cfg.clip_grad_norm is None and cfg.amp == "off"
    assert JobConfig(clip_grad_norm=1.5, amp="bf16").validate().clip_grad_norm == 1.5
    for bad in ({"clip_grad_norm": 0.0}, {"clip_grad_norm": -1.0}, {"amp": "fp8"}):
        with pytest.raises(ConfigError) as e:
            JobConfig(**bad).validate()
        assert "\n" not in str(e.value) and next(iter(bad)) in str(e.value)


def _opt(model, **kw):
    return HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                  overlap=False, **kw)


def test_step_inside_skip_synchronize_needs_synchronize_first():
    model = torch.nn.Linear(3, 2)
    opt = _opt(model)
    opt.begin(1, 4)
    opt.backward(model(torch.randn(4, 3)).pow(2).mean(), 4)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match="synchronize"), opt.skip_synchronize():
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))     # nothing stepped
    opt.remove_hooks()


def test_plain_and_weighted_losses_cannot_mix_in_an_iteration():
    model = torch.nn.Linear(3, 2)
    opt = _opt(model)
    opt.begin(2, 8)
    x = torch.randn(4, 3)
    opt.backward(model(x).pow(2).mean(), 4, weight=torch.tensor(7.0))
    with pytest.raises(ValueError, match="same kind"):
        opt.backward(model(x).pow(2).mean(), 4)
    opt.remove_hooks()
    with pytest.raises(ValueError, match="clip_grad_norm"):
        _opt(model, clip_grad_norm=0.0)


class _Recorder:
    """Stands for the optimizer: records what the step hands to backward."""

    def __init__(self):
        self.calls = []

    def backward(self, loss, count, weight=None):
        self.calls.append((count, None if weight is None else float(weight)))
        (loss * (float(weight) if weight is not None else count)).backward()


def test_micro_step_sums_token_weights_and_sample_counts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    w = [torch.tensor(3.0), 5]                         # a tensor weight and a number

    def fwd(m, batch):
        xb, yb, wb = batch
        return torch.nn.functional.cross_entropy(m(xb), yb), wb
    opt, sums = _Recorder(), None
    for (lo, hi), wb in zip(((0, 4), (4, 10)), w):
        sums = micro_step_sums(model, fwd, opt, (x[lo:hi], y[lo:hi], wb), hi - lo, "cpu", sums)
    assert opt.calls == [(4, 3.0), (6, 5.0)]
    with torch.no_grad():
        want = 3.0 * float(torch.nn.functional.cross_entropy(model(x[:4]), y[:4])) + \
            5.0 * float(torch.nn.functional.cross_entropy(model(x[4:]), y[4:]))
    assert float(sums.loss) == pytest.approx(want, rel=1e-6) and float(sums.weight) == 8.0
    assert not sums.loss.requires_grad
    plain = micro_step_sums(model, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), opt,
                            (x, y), 10, "cpu")
    assert plain.weight == 10.0                        # plain losses: the sample count, on the host
    assert float(micro_step(model, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), opt,
                            (x, y), 10, "cpu")) == pytest.approx(float(plain.loss))
    with pytest.raises(ValueError, match="tuple of 3"):
        micro_step_sums(model, lambda m, b: (1, 2, 3), opt, (x, y), 10, "cpu")


def test_device_statistics_helpers_match_float64():
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g, dtype=torch.float64),
          torch.randn(4, generator=g).to(torch.float16)]
    want = sum(float(t.double().pow(2).sum()) for t in ts)
    assert float(sq_norms(ts, torch.float64)) == pytest.approx(want, rel=1e-6)
    copy = [t.clone() for t in ts]
    mul_(copy, torch.tensor(-0.5, dtype=torch.float64))
    assert all(torch.allclose(c.double(), -0.5 * t.double(), rtol=1e-3) for c, t in zip(copy, ts))
    # GradStats from the host values: cos(H0, H1) by |H0 + H1|^2 = N^2 |g|^2, sq_micro / N, b = S / M
    h0, h1 = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64), torch.tensor([-0.5, 1.0, 2.0], dtype=torch.float64)
    N = 10.0
    g = (h0 + h1) / N
    st = Measurement.stats([4.0, 3, 6, 4, float(g @ g), float(h0 @ h0), float(h1 @ h1), N], S=10)
    assert st.similarity == pytest.approx(float(h0 @ h1 / (h0.norm() * h1.norm())), rel=1e-12)
    assert (st.sq_micro, st.b, st.M, st.half_samples) == (pytest.approx(0.4), pytest.approx(10 / 3), 3, (6, 4))


@pytest.mark.parametrize("misuse,says", [
    (lambda o, m: o.step(), "step() before begin()"),
    (lambda o, m: o.begin(-1, 8), "begin(n_local=-1, ...): n_local is this rank's micro-batch count"),
    (lambda o, m: o.begin(1, 0), "begin(..., total_samples=0): the iteration's samples on all ranks"),
    (lambda o, m: o.begin(True, 8), "begin(n_local=True, ...)"),
    (lambda o, m: (o.begin(1, 4), o.backward(m(torch.randn(4, 3)).sum(), 4), o.backward(m(torch.randn(4, 3)).sum(), 4)),
     "backward() called 2 times after begin(n_local=1, ...)"),
    (lambda o, m: (o.begin(2, 8), o.backward(m(torch.randn(4, 3)).sum(), 4), o.step()),
     "step() after 1 backward() call(s), but begin(n_local=2, ...) announced 2"),
    (lambda o, m: (o.begin(2, 8), o.backward(m(torch.randn(4, 3)).sum(), 4), o.begin(2, 8)),
     "begin() again before step(): the 1 backward() call(s) of this iteration were never stepped"),
])
def test_misuse_of_the_layer_is_one_config_error_line(misuse, says):
    """Each misuse of the iteration protocol is a ConfigError (one line, exit code 2 from a script:
    tests/test_public_layer.py, which also runs the one that needs a process without a backend) naming what was
    called and what is expected; nothing is stepped."""
    model = torch.nn.Linear(3, 1)
    opt = _opt(model)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError) as e:
        misuse(opt, model)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    opt.remove_hooks()
