"""``hpc_jabas.Jabas(policy=...)``: the script's own loop runs fit()'s batch-size policies (runtime/loop_policy.py).

tests/workers/jabas_policy_user.py is copied into a clean directory and run as a user runs it (``import hpc_jabas``,
the backend from ``hpc_jabas.init()``): on one rank, its B trajectory and the lr its torch optimizer stepped with
are checked against an independent replay (ramp: the schedule's closed form; noise-scale: the core policy fed the
worker's measured statistics in fit()'s order, and the lr rule's formula); on two ranks under mpirun, on both
backends, every rank runs the same B trajectory and a save after iteration 5 resumed in fresh objects ends with
bit-identical parameters (noise-scale on both, similarity on torch: the suite's time). Bad input is one line.
"""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_jabas.core.adaptive.policies import Observation, PolicyState, make_policy
from hpc_jabas.core.adaptive.stats import NoiseScale, noise_scale_terms
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import job_perf_model
from hpc_jabas.core.planning import proportional_plan
from hpc_jabas.core.planning.space import planner_space
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.loop_policy import LoopPolicy
from tests.mpi_util import mpi_env

USER = Path(__file__).resolve().parent / "workers" / "jabas_policy_user.py"
PY = sys.executable
LR, B0, LO, HI, P, MB = 0.05, 16, 8, 64, 2, 4


def run_user(tmp_path: Path, policies: str, ranks: int, backend: str = "torch") -> dict[str, list[dict]]:
    """{policy: [rank 0's out, rank 1's, ...]} of one run of the worker over the comma-separated ``policies``."""
    shutil.copy(USER, tmp_path / USER.name)
    cmd = [PY] if ranks == 1 else ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), PY]
    p = subprocess.run([*cmd, USER.name, policies, "."], cwd=tmp_path, env=mpi_env(backend), capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout[-3000:] + p.stderr[-5000:]
    return {pol: [json.loads((tmp_path / f"out.{r}.{pol}.json").read_text()) for r in range(ranks)]
            for pol in policies.split(",")}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> dict[str, list[dict]]:
    """One process on one rank runs both policies (one interpreter start for both tests)."""
    return run_user(tmp_path_factory.mktemp("one_rank"), "ramp,noise-scale", 1)


def check_lr(run: dict, rule) -> None:
    """The lr each step ran with: the user's lr x the rule's scale of that iteration's B (fit()'s lr_scale)."""
    Bs = [i["B"] for i in run["its"]]
    assert len(run["lr"]) == len(Bs)
    for lr, B in zip(run["lr"], Bs):
        assert lr == pytest.approx(LR * rule(B), rel=1e-12)


def test_ramp_takes_the_schedules_b_and_sqrt_lr_on_one_rank(one_rank):
    (d,) = one_rank["ramp"]
    run = d["whole"]
    n, epochs, at = run["n"], 2, (0.25, 0.5)
    Bs = [i["B"] for i in run["its"]]
    want, seen, B = [], 0, B0
    for done, it in enumerate(run["its"], start=1):        # independent: the ramp's closed form, every p iterations
        want.append(B)
        seen += it["samples"]
        if done % P == 0:
            k = sum(1 for f in at if seen / (n * epochs) >= f)
            B = min(HI, max(LO, B0 * 2 ** k))
    assert Bs == want and Bs[:6] == [16, 16, 16, 16, 32, 32] and 64 in Bs
    check_lr(run, lambda B: math.sqrt(B / B0))            # ramp's "auto" lr rule: sqrt(B / batch)
    assert d["resumed"]["params_hex"] == run["params_hex"]


def test_noise_scale_decides_as_the_core_policy_replayed_on_the_measured_statistics(one_rank):
    (d,) = one_rank["noise-scale"]
    run = d["whole"]
    # the replay: the core policy and space built here, fed the worker's statistics in fit()'s controller order
    pol = make_policy("noise-scale", B0=B0, B_min=LO, B_max=HI, p=P, kappa=4.0)
    pol.start(run["n"])
    pm = job_perf_model(JobConfig(micro_batch=MB), ["v100"], calibrated=False)
    space = planner_space(LO, HI, MB, lambda B: proportional_plan(B, MB, (1.0,)),
                          lambda plan: pm.iteration_time(plan, ["v100"], None))
    ema, since, B, want = NoiseScale(), 0, B0, []
    for done, it in enumerate(run["its"], start=1):
        want.append(B)
        st = it["stats"]
        assert st is not None, f"iteration {done} measured nothing (measure_every=1)"
        since += it["samples"]
        g2, s = noise_scale_terms(st["b"], st["sq_micro"], st["S"], st["sq_global"])
        ema.update(st["b"], st["sq_micro"], st["S"], st["sq_global"])
        if done % P:
            if pol.observe(Observation(g2=g2, s=s, samples=since)):
                since = 0
            continue
        got, since = since, 0
        B = pol.decide(PolicyState(B=B, iteration=done, b_noise=ema.b_noise, g2=g2, s=s, samples=got), space).B
    assert [i["B"] for i in run["its"]] == want and len(set(want)) > 1      # it moved B, as the replay did
    check_lr(run, lambda B: B / B0)                     # noise-scale's "auto" lr rule: linear
    assert d["resumed"]["params_hex"] == run["params_hex"]


@pytest.mark.parametrize("backend,policies", [("torch", "noise-scale,similarity"), ("horovod", "noise-scale")])
def test_two_ranks_run_one_trajectory_and_resume_bit_identical(tmp_path, backend, policies):
    runs = run_user(tmp_path, policies, 2, backend)
    for d in runs.values():
        check_two_ranks(d, backend)


def check_two_ranks(d: list[dict], backend: str) -> None:
    """Both ranks ran rank 0's decisions, and the run cut after iteration 5 and resumed ends where the whole did."""
    for r in d:
        assert r["whole"]["backend"] == backend
        assert r["whole"]["trajectory"] == d[0]["whole"]["trajectory"] == r["resumed"]["trajectory"]
        assert [i["B"] for i in r["whole"]["its"]] == [i["B"] for i in d[0]["whole"]["its"]]
        cut, resumed = [i["B"] for i in r["cut"]["its"]], [i["B"] for i in r["resumed"]["its"]]
        assert cut + resumed == [i["B"] for i in r["whole"]["its"]]
        assert r["resumed"]["params_hex"] == r["whole"]["params_hex"] == d[0]["whole"]["params_hex"]
        assert r["resumed"]["lr"] == r["whole"]["lr"][len(cut):]
    assert len(d[0]["whole"]["trajectory"]) > 1              # B moved


def test_bad_policy_input_is_one_line(tmp_path):
    shutil.copy(USER, tmp_path / USER.name)
    p = subprocess.run([PY, USER.name, "nope", "."], cwd=tmp_path, env=mpi_env("torch"), capture_output=True,
                       text=True, timeout=120)
    err = [ln for ln in p.stderr.splitlines() if "INFO" not in ln]
    assert p.returncode == 2 and len(err) == 1 and "'nope'" in err[0] and "noise-scale" in err[0], p.stderr
    kw = dict(batch=16, micro_batch=4, speeds=(1.0,), p=2, batch_min=8, batch_max=64, lr_rule="auto",
              batch_ref=None, epochs=2, measure_every=None, options={})
    for bad, words in [({"p": 0}, ("p=0", ">= 1")), ({"batch_min": 6}, ("batch_min=6", "micro_batch=4")),
                       ({"batch_max": 66}, ("batch_max=66", "multiple")), ({"lr_rule": "cubic"}, ("cubic", "sqrt")),
                       ({"options": {"gamma": 2.0}}, ("gamma",)), ({"options": {"wat": 1}}, ("wat", "ramp_at"))]:
        with pytest.raises(ConfigError) as e:
            LoopPolicy("similarity", **{**kw, **bad})
        msg = str(e.value)
        assert "\n" not in msg and all(w in msg for w in words), msg
