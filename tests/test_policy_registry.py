"""Policies as objects, registered by name in one place (issue 59, item 1): a program adds its own policy in its own
file, with no edit to the package, and trains with it by name; the controller asks the policy what it reads and how
it decides, never its name. Tested as a user's script runs it (its own file, one rank, ``policy = "<name>"``)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from hpc_jabas.core.adaptive.policies import (
    BatchPolicy,
    Wish,
    make_policy,
    policy_class,
    register_policy,
    unregister_policy,
)
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    import hpc_jabas as hj
    from hpc_jabas.core.adaptive.policies import SIMILARITY, BatchPolicy, Observation, Wish, register_policy

    @register_policy
    class Doubling(BatchPolicy):
        """A toy: B doubles at every decision; it reads the cosine, and keeps each one measured between decisions."""
        name = "toy-doubling"
        reads = frozenset({SIMILARITY})

        def __init__(self, **kw):
            super().__init__(**kw)
            self.seen = []

        def observe(self, stats: Observation) -> bool:
            self.seen.append(stats.similarity)
            return True

        def wish(self, state, space):
            return Wish("grow", 2.0 * state.B, "double B")

    run = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = (x[:, 0] > 0).long()
    cfg = hj.JobConfig(policy="toy-doubling", batch=8, batch_max=64, p=4, measure_every=1, epochs=1,
                       checkpoint=False, run_dir=run)
    model = torch.nn.Linear(8, 2)
    tr = hj.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.utils.data.TensorDataset(x, y),
                    torch.nn.CrossEntropyLoss(), config=cfg, world=hj.World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit()
    print("SEEN " + json.dumps(tr.controller.policy.seen))
''')


def test_a_policy_registered_in_the_users_file_trains_by_name(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(SCRIPT)
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("SEEN "))[5:])
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    decisions = [d for d in recs if d["type"] == "decision"]
    # every 4 iterations B doubles, to batch_max and no further; the lr follows "auto" = sqrt(B / 8) (the base rule)
    assert [d["B"] for d in decisions[:4]] == [16, 32, 64, 64]
    assert all(d["reason"].startswith("toy-doubling: double B") for d in decisions)
    for d in decisions:
        assert d["lr_scale"] == pytest.approx(math.sqrt(d["B"] / 8), rel=1e-12)
    # what it observed: the cosine of every measured iteration that was not a decision round, in order
    its = [d for d in recs if d["type"] == "iteration" and "stats" in d]
    between = [d["stats"]["similarity"] for d in its if (d["it"] + 1) % 4 != 0]
    assert len(seen) == len(between) >= 9 and seen == between


class Halving(BatchPolicy):
    name = "toy-halving"

    def wish(self, state, space):
        return Wish("shrink", state.B / 2.0, "halve B")


@pytest.fixture
def halving():
    register_policy(Halving, aliases=("halve",))
    yield Halving
    unregister_policy("toy-halving")


def test_a_registered_name_is_a_choice_of_the_config_and_leaves_with_it(halving):
    assert JobConfig.from_dict({"policy": "halve"}).policy == "toy-halving"      # the alias, read
    assert policy_class("toy-halving") is halving and make_policy("halve", B_max=64).decide({"B": 64}).B == 32
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"policy": "nope"})
    said = str(e.value)
    assert said.endswith("valid: fixed, similarity, noise-scale, ramp, toy-halving") and "\n" not in said
    unregister_policy("toy-halving")
    with pytest.raises(ConfigError, match="valid: fixed, similarity, noise-scale, ramp$"):
        JobConfig.from_dict({"policy": "toy-halving"})
    register_policy(halving, aliases=("halve",))                      # back, for the fixture's teardown


def test_a_taken_name_or_a_non_policy_is_refused_in_one_line(halving):
    class Other(BatchPolicy):
        name = "toy-halving"

    class Similar(BatchPolicy):
        name = "similar"

    for bad, words in ((Other, "is taken by policy 'toy-halving'"), (object, "subclass of"),
                       (BatchPolicy, "give it its own lower-case name")):
        with pytest.raises(ConfigError, match=words) as e:
            register_policy(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="'jabas' is taken by policy 'similarity'"):
        register_policy(Similar, aliases=("jabas",))
    with pytest.raises(ConfigError, match="built in"):
        unregister_policy("goodput")
    assert register_policy(halving) is halving                        # the same class again: a no-op
