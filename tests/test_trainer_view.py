"""TrainerView (runtime/hooks.py): the one list of what controllers, hooks and callbacks may read of the
trainer. The real Trainer and the tests' fake (tests/fake_trainer.py) both have every attribute and method,
and the controller reads them plainly (no getattr probes)."""
import ast
import inspect
from pathlib import Path

from fake_trainer import FakeTrainer

from hpc_jabas.runtime.hooks import TrainerView

ROOT = Path(__file__).resolve().parents[1]


def view_names() -> tuple[set[str], set[str]]:
    """(attributes, methods) that TrainerView declares."""
    attrs = set(TrainerView.__annotations__) | {n for n, v in vars(TrainerView).items() if isinstance(v, property)}
    methods = {n for n, v in vars(TrainerView).items() if inspect.isfunction(v) and not n.startswith("_")}
    return attrs, methods


def trainer_instance_attributes() -> set[str]:
    """Every ``self.X = ...`` / ``self.X: T = ...`` in Trainer's methods, every property of the class and every
    TrainState field it exposes (``X: InState[T] = InState()``, runtime/persist/state.py) (the
    attributes are read from its source, so that no world is built here)."""
    from hpc_jabas.runtime import trainer
    tree = ast.parse(Path(trainer.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    out = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)      # a property reads the TrainState
           and any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)}
    out |= {f.target.id for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
            and isinstance(f.value, ast.Call) and getattr(f.value.func, "id", "") == "InState"}   # TrainState fields
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


def test_the_view_lists_what_the_runtime_reads():
    attrs, methods = view_names()
    assert {"rank", "world", "iteration", "B", "plan", "gpu_types", "cfg", "metrics", "decision_lead", "sampler",
            "planner"} <= attrs
    assert {"perf_model", "announced", "b_trajectory", "check_decision", "noop_decision"} <= methods


def test_the_real_trainer_has_every_attribute_and_method_of_the_view():
    from hpc_jabas.runtime.trainer import Trainer
    attrs, methods = view_names()
    assert attrs - trainer_instance_attributes() == set()
    assert {m for m in methods if not callable(getattr(Trainer, m, None))} == set()


def test_the_fake_trainer_has_every_attribute_and_method_of_the_view():
    attrs, methods = view_names()
    fake = FakeTrainer()
    assert {a for a in attrs if not hasattr(fake, a)} == set()
    assert {m for m in methods if not callable(getattr(fake, m, None))} == set()
    assert fake.noop_decision("x").kind == "noop" and fake.announced()[0] == fake.B


def test_the_controller_reads_the_trainer_without_getattr_probes():
    src = (ROOT / "hpc_jabas" / "runtime" / "controller.py").read_text()
    assert "getattr(trainer" not in src and "getattr(cfg" not in src


def test_a_trainer_is_composed_from_a_world_without_a_collective(tmp_path, monkeypatch):
    import torch

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm import seam as comm
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    def no_collective(*a, **k):
        raise AssertionError("the constructor ran a collective")
    for name in ("init", "allgather_object", "broadcast_object", "broadcast_parameters"):
        monkeypatch.setattr(comm, name, no_collective)
    ds = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    model = torch.nn.Linear(3, 2)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(),
                 config=JobConfig(batch=8, run_dir=str(tmp_path)),
                 world=World(rank=1, size=2, gpu_types=("v100", "p100")))
    assert (tr.rank, tr.world, tr.gpu_types, tr.B, tr.iteration) == (1, 2, ["v100", "p100"], 8, 0)
    assert tr.plan.world_size == 2 and tr.state.plan is tr.plan and tr.announced() == (8, tr.plan, 1.0)
    assert not tr._set_up and tr.checkpointer.state is tr.state
