"""Checkpoint format: plain torch.load reads it, the sidecar catches truncation and corruption, export."""
import json
import subprocess
import sys

import pytest
import torch
from mpi_util import ROOT, mpi_env

from hpc_jabas.cli.main import main
from hpc_jabas.errors import CheckpointError
from hpc_jabas.runtime.persist import checkpoint as ckpt


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(8, 3))


def _state(model):
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 1, 4, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": 7,
            "rng": {"torch": torch.get_rng_state(), "cuda": None}}


def test_plain_torch_load_round_trip_and_sidecar(tmp_path):
    m = _model()
    st = _state(m)
    p = ckpt.save_in(tmp_path, st, epoch=1, iteration=7)
    plain = torch.load(p, weights_only=False)                       # no hpc-jabas code involved
    assert plain["iteration"] == 7 and plain["rng"]["cuda"] is None
    assert set(plain["model"]) == set(st["model"])
    for k, v in st["model"].items():
        assert torch.equal(plain["model"][k], v), k
    assert plain["optimizer"]["state"][0]["step"] == st["optimizer"]["state"][0]["step"]
    rec = json.loads(ckpt.sidecar(p).read_text())
    assert rec["size"] == p.stat().st_size and rec["format"] == ckpt.FORMAT and len(rec["sha256"]) == 64
    assert ckpt.load(p)["iteration"] == 7
    data = p.read_bytes()
    p.write_bytes(data[:-1])
    with pytest.raises(CheckpointError, match="truncated"):
        ckpt.load(p)
    p.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load(p)
    p.write_bytes(data)
    ckpt.sidecar(p).unlink()                                         # killed between the two renames
    with pytest.raises(CheckpointError, match="integrity record .* is missing"):
        ckpt.load(p)


def test_pruning_removes_sidecars_and_legacy_files_still_load(tmp_path):
    for it in range(4):
        ckpt.save_in(tmp_path, {"it": it}, epoch=0, iteration=it, keep=2)
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        [ckpt.name_for(0, i) + s for i in (2, 3) for s in ("", ckpt.SIDECAR_SUFFIX)])
    import hashlib
    import io
    buf = io.BytesIO()
    torch.save({"old": 1}, buf)
    payload = buf.getvalue()
    old = tmp_path / "legacy.pt"
    old.write_bytes(ckpt.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    assert ckpt.load(old) == {"old": 1}


def test_export_writes_a_loadable_state_dict(tmp_path, capsys):
    m = _model()
    st = _state(m)
    run = tmp_path / "run"
    ckpt.save_in(run / "checkpoints", st, epoch=0, iteration=3)
    p = ckpt.save_in(run / "checkpoints", st, epoch=1, iteration=7)
    out = tmp_path / "w.pt"
    assert main(["export", str(p), str(out)]) == 0
    fresh = _model()
    with torch.no_grad():
        for t in fresh.state_dict().values():
            t.zero_()
    fresh.load_state_dict(torch.load(out, weights_only=True))
    for k, v in m.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    before = out.read_bytes()
    assert main(["export", str(run), str(out)]) == 2                  # exists, no --force
    assert "exists; pass --force" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["export", str(run), str(out), "--force"]) == 0       # a run directory: its newest checkpoint
    assert torch.load(out, weights_only=True).keys() == m.state_dict().keys()


@pytest.mark.parametrize("case", ["missing", "not_ckpt", "no_model", "corrupt"])
def test_export_bad_inputs_exit_2_with_one_line(tmp_path, case):
    src = tmp_path / "c.pt"
    if case == "not_ckpt":
        src.write_bytes(b"hello")
    elif case == "no_model":
        ckpt.save(src, {"x": 1})
    elif case == "corrupt":
        ckpt.save(src, {"model": {"w": torch.ones(3)}})
        src.write_bytes(src.read_bytes()[:-5])
    out = tmp_path / "o.pt"
    p = subprocess.run([sys.executable, "-m", "hpc_jabas.cli.main", "export", str(src), str(out)],
                       capture_output=True, text=True, env=mpi_env(), cwd=str(ROOT), timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("hpc-jabas: error:"), p.stderr
    assert not out.exists()
    want = {"missing": "does not exist", "not_ckpt": "integrity record", "no_model": "not an hpc-jabas training",
            "corrupt": "truncated"}[case]
    assert want in lines[0], lines[0]


def test_cuda_rng_states_are_gathered_and_restored_per_rank(monkeypatch):
    """No GPU here: torch.cuda is faked to show which state each rank gets back."""
    from hpc_jabas.runtime import resume
    from hpc_jabas.runtime.comm import seam as comm
    states = [torch.full((8,), r, dtype=torch.uint8) for r in range(3)]
    monkeypatch.setattr(comm, "allgather_object", lambda obj, name=None: [None, None, None])
    assert resume.gather_cuda_rng() is None                     # CPU ranks: nothing stored
    monkeypatch.setattr(comm, "allgather_object", lambda obj, name=None: list(states))
    assert [int(s[0]) for s in resume.gather_cuda_rng()] == [0, 1, 2]
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda t: got.append(int(t[0])))
    assert resume.restore_cuda_rng(states, 2) and got == [2]
    assert not resume.restore_cuda_rng(states, 3) and got == [2]      # a rank beyond the saved ones keeps its own
    assert not resume.restore_cuda_rng(None, 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not resume.restore_cuda_rng(states, 1) and got == [2]
