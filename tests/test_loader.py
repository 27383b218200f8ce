"""The DataLoader input pipeline (runtime/data.py): a torch DataLoader with worker processes drives the
heterogeneous batch sampler; decisions are announced past its lookahead and still take effect at their
iteration, every sample is used once per epoch, the update is the one-process reference's, dict batches
work, a resume inside an epoch is exact, and an IterableDataset is one clear error."""
import numpy as np
import pytest
import torch
from mpi_util import run_ranks
from reference import reference_run
from test_equivalence import assert_params_close

from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.data import HeterogeneousBatchSampler, check_input, loader_kwargs


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_iterable_dataset_is_one_clear_error():
    from hpc_jabas.runtime.trainer import Trainer
    m = torch.nn.Linear(2, 2)
    for data in (Stream(), torch.utils.data.DataLoader(Stream(), batch_size=2)):
        with pytest.raises(ConfigError) as e:
            Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), data, torch.nn.MSELoss())
        msg = str(e.value)
        assert "Stream is a torch IterableDataset" in msg and "map-style Dataset" in msg and "\n" not in msg
    assert check_input(torch.utils.data.DataLoader(list(range(7)))) == 7


def test_loader_kwargs_keep_the_workers_and_replace_the_batching():
    def collate(items):
        return items
    dl = torch.utils.data.DataLoader(list(range(10)), batch_size=8, shuffle=True, drop_last=True, num_workers=3,
                                     prefetch_factor=5, persistent_workers=True, collate_fn=collate)
    kw, replaced = loader_kwargs(dl)
    assert (kw["num_workers"], kw["prefetch_factor"], kw["persistent_workers"], kw["collate_fn"]) == (3, 5, True,
                                                                                                      collate)
    assert replaced == ["batch_size=8", "shuffle=True", "drop_last=True"]


def test_batch_sampler_follows_the_announced_schedule():
    """One rank's lists, read lazily: the plan of each iteration comes from plan_at at draw time; an idle
    iteration yields one empty list; the union over ranks is the core sampler's cut."""
    sched = {0: Plan(4, (1, 3)), 3: Plan(4, (0, 2)), 5: Plan(3, (2, 1))}

    def plan_at(it):
        return sched[max(k for k in sched if k <= it)]
    lists = []
    for rank in (0, 1):
        bs = HeterogeneousBatchSampler(100, rank, seed=7, plan_at=plan_at)
        lists.append(list(bs))
        assert bs.next_pos is None and bs.drawn == 9          # 3*16 + 2*8 + 4*9 = 100: iteration 9 ends it
    ref = HeterogeneousSampler(100, seed=7)
    want: list[list[list[int]]] = [[], []]
    it = 0
    while not ref.epoch_done(plan_at(it).B):
        ib = ref.next(plan_at(it))
        for rank in (0, 1):
            want[rank] += [m.tolist() for m in ib.micro[rank]] or [[]]
        it += 1
    assert lists == want and [] in lists[0] and it == 9
    assert sorted(i for r in lists for m in r for i in m) == list(range(100))


SCENARIOS = [
    # plans change at 7 (rank 0 idles: B 32 -> 24) and at 12 (B 27, lr x1.5); 201 samples: the first epoch
    # ends with a 9-sample tail (4, 4, 1 -> 4, 3, 2: no single-sample micro-batch); 18 iterations, 3 epochs
    {"name": "equiv", "kind": "tuple", "n": 201, "steps": 18, "plan": "b=4 n=1,3,4",
     "schedule": {"7": "b=8 n=0,2,1", "12": "b=3 n=2,3,4"}, "lr_scales": {"12": 1.5}, "optimizer": "momentum",
     "lr": 0.05, "num_workers": 2, "persistent": True},
    # dict batches through non-persistent workers, Adam, a B change at 6
    {"name": "dict", "kind": "dict", "n": 120, "steps": 9, "plan": "b=4 n=2,1,3", "schedule": {"6": "b=5 n=1,2,2"},
     "optimizer": "adam", "lr": 0.01, "num_workers": 2, "persistent": False},
    # stop at 8 inside the first epoch with the change at 10 already announced (pending), checkpoint, resume
    {"name": "resume", "kind": "tuple", "n": 150, "steps": 14, "plan": "b=2 n=3,2,3",
     "schedule": {"10": "b=4 n=1,2,2"}, "lr_scales": {"10": 0.5}, "optimizer": "momentum", "lr": 0.05,
     "num_workers": 2, "persistent": True, "stop_at": 8},
    # the adaptive controller (similarity policy, p = 2; gamma = 0.99: it asks for a larger B on every round),
    # its decisions announced 4 iterations ahead; the schedule it ran is read back from the history
    {"name": "adaptive", "kind": "tuple", "n": 400, "steps": 13, "optimizer": "sgd", "lr": 0.05, "num_workers": 2,
     "persistent": True, "config": {"gpu_types": ["v100", "p100", "rtx2060"], "emulate": True, "policy": "similarity",
                                    "p": 2, "gamma": 0.99, "batch": 24, "batch_min": 16, "batch_max": 96}},
]


@pytest.mark.mpi
def test_loader_path_three_ranks_two_workers():
    res = run_ranks("loader_worker.py", {"scenarios": SCENARIOS}, np_=3, timeout=240)
    for sc in SCENARIOS:
        got = [r["scenarios"][sc["name"]] for r in res]
        if sc.get("config"):               # what the adaptive controller decided, as a schedule
            hist = got[0]["history"]
            sc = dict(sc, plan=hist[0]["plan"], schedule={str(h["it"]): h["plan"] for a, h in zip(hist, hist[1:])
                                                          if h["plan"] != a["plan"]},
                      lr_scales={str(h["it"]): h["lr_scale"] for a, h in zip(hist, hist[1:])
                                 if h["lr_scale"] != a["lr_scale"]})
            changes = sorted(int(k) for k in sc["schedule"])
            # announced at the rounds (iterations 2, 4, ...) for 4 iterations later; B grew
            assert len(changes) >= 2 and all(k % 2 == 0 and k >= 6 for k in changes), changes
            assert Plan.parse(hist[-1]["plan"]).B > Plan.parse(hist[0]["plan"]).B
        spec = {k: sc[k] for k in ("n", "steps", "plan", "schedule", "optimizer", "lr")}
        spec["lr_scales"] = sc.get("lr_scales", {})
        ref = reference_run(spec)
        for g in got:
            assert g["iterations"] == sc["steps"] and g["lead"] == 4 and g["workers"] == 2
            assert_params_close(g["params"], ref)
            # every decision in force from its iteration: the plan each iteration ran
            sched = {0: sc["plan"], **{int(k): v for k, v in sc["schedule"].items()}}
            want = [str(Plan.parse(sched[max(k for k in sched if k <= it)])) for it in range(sc["steps"])]
            assert [h["plan"] for h in g["history"]] == want
        init = reference_run(dict(spec, steps=0))
        assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-3       # the runs moved
        # the samples the model saw (delivered by the workers): every sample once per epoch, over all ranks
        per_epoch: dict[int, list[int]] = {}
        per_it: dict[int, list[int]] = {}
        for g in got:
            for it, epoch, ids in g["seen"]:
                per_epoch.setdefault(epoch, []).extend(ids)
                per_it.setdefault(it, []).extend(ids)
        n = sc["n"]
        for epoch, ids in per_epoch.items():
            if epoch < max(per_epoch):
                assert sorted(ids) == list(range(n)), f"{sc['name']}: epoch {epoch}"
            else:
                assert len(ids) == len(set(ids)) and set(ids) <= set(range(n))
        # ... and exactly the core sampler's cut of every iteration
        s = HeterogeneousSampler(n, seed=0)
        for it in range(sc["steps"]):
            plan = Plan.parse(sched[max(k for k in sched if k <= it)])
            if s.epoch_done(plan.B):
                s.new_epoch()
            assert sorted(per_it[it]) == sorted(s.next(plan).all_indices().tolist())
        if sc["name"] == "equiv":
            assert sorted(per_epoch) == [0, 1, 2] and min(len(m) for m in _sizes(got)) >= 2
        if sc.get("stop_at"):
            for g in got:
                assert g["resumed"]["from"] and g["resumed"]["pending_at_stop"] == [10]
            assert np.array_equal(sorted(per_it), np.arange(sc["steps"]))


def _sizes(got):
    return [ids for g in got for _, _, ids in g["seen"]]
