"""The forecast's Gaussian process without scikit-learn (issue 59, item 6): the numpy fit (core/autoscale/forecast.py,
``_fit_gp_numpy``) against scikit-learn's GaussianProcessRegressor, the independent reference, on the same data.
Where both reach the likelihood's maximum the two means agree to 1e-3 of the data's range; the numpy fit never
ends at a lower likelihood than scikit-learn's on these histories."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.need import need

from hpc_jabas.core.autoscale.forecast import GP_BOUNDS, _gp_hyper, _gp_lml, gp_forecast

need("sklearn")                 # set-up installs it (the [forecast] extra): in CI a missing one fails


def _histories():
    rng = np.random.default_rng(0)
    t = np.arange(0, 3000, 100.0)
    yield "ramp", t[:21], 100 + 0.1 * t[:21]
    yield "noisy ramp", t, 100 + 0.1 * t + rng.normal(0, 8, len(t))
    yield "growth", t, 64 + 200 * (1 - np.exp(-t / 900)) + rng.normal(0, 3, len(t))
    yield "swing", t[:24], 200 + 80 * np.sin(t[:24] / 350) + rng.normal(0, 4, 24)


def _sklearn_fit(x, y):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    kernel = (ConstantKernel(1.0, GP_BOUNDS[0]) * RBF(1.0, GP_BOUNDS[1]) + WhiteKernel(1e-2, GP_BOUNDS[2]))
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=0, n_restarts_optimizer=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp.fit(x[:, None], y)
    return gp


@pytest.mark.parametrize("name,ts,ys", list(_histories()), ids=[h[0] for h in _histories()])
def test_the_numpy_gp_agrees_with_scikit_learns(name, ts, ys):
    tq = np.arange(ts[-1] + 100, ts[-1] + 1100, 100.0)
    sk = gp_forecast(ts, ys, tq, use_sklearn=True)
    own = gp_forecast(ts, ys, tq, use_sklearn=False)
    assert np.max(np.abs(sk - own)) <= 1e-3 * np.ptp(ys), (name, sk, own)
    # the likelihood by hand equals scikit-learn's at its fitted hyperparameters, and the numpy fit's is no lower
    x = (ts - ts[0]) / (ts[-1] - ts[0])
    y = (ys - ys.mean()) / ys.std()
    gp = _sklearn_fit(x, ys)
    assert _gp_lml(x, y, gp.kernel_.theta)[0] == pytest.approx(gp.log_marginal_likelihood_value_, abs=1e-6)
    assert _gp_hyper(x, y)[1] >= gp.log_marginal_likelihood_value_ - 1e-6


def test_a_constant_history_is_its_value_either_way():
    ts, ys = np.arange(5) * 100.0, np.full(5, 256.0)
    for use in (True, False):
        assert list(gp_forecast(ts, ys, [600.0, 900.0], use_sklearn=use)) == [256.0, 256.0]
