"""examples/train_resnet.py on small sizes: ResNet-18 (BatchNorm2d) on generated JPEG files decoded and
augmented in 2 DataLoader workers per rank, 3 emulated heterogeneous ranks, one epoch; bad flags exit 2."""
import json
import subprocess
import sys

import pytest
import torch
from mpi_util import ROOT, mpi_env

sys.path.insert(0, str(ROOT))
from examples.jpeg_shapes import JpegFolder, ensure_image_folder  # noqa: E402
from examples.train_resnet import resnet18  # noqa: E402


def test_resnet18_is_the_standard_one_and_the_folder_decodes(tmp_path):
    assert sum(p.numel() for p in resnet18(1000).parameters()) == 11_689_512       # torchvision's resnet18
    root = ensure_image_folder(tmp_path / "imgs", per_class=3, size=24)
    ds = JpegFolder(root, train=True)
    x, y = ds[4]
    assert len(ds) == 30 and x.shape == (3, 24, 24) and x.dtype == torch.float32 and y == 1
    assert ensure_image_folder(tmp_path / "imgs", per_class=3, size=24) == root      # written once


@pytest.mark.mpi
def test_train_resnet_small_on_three_ranks(tmp_path):
    summary = tmp_path / "summary.json"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", sys.executable,
           str(ROOT / "examples" / "train_resnet.py"), "--emulate", "--gpu-types", "v100,p100,rtx2060",
           "--batch", "48", "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--data-dir", str(tmp_path / "data"),
           "--images-per-class", "25", "--image-size", "32", "--width", "16", "--num-workers", "2", "-q",
           "--summary", str(summary)]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(summary.read_text())
    # 250 files: 5 iterations of 48 and a 10-sample tail; the loader's lookahead is 2 workers x 2 prefetched
    assert res["samples"] == 250 and res["iterations"] == 6 and res["epoch"] == 1 and res["decision_lead"] == 4
    assert res["parameters"] == sum(p.numel() for p in resnet18(10, 16).parameters())
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]
    samples = [int(ln.split("samples=")[1].split()[0]) for ln in lines]
    assert len(lines) == 3 and sum(samples) == 250 and samples[0] > samples[2] > 0
    its = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in its if m["type"] == "iteration"]
    assert len(losses) == 6 and all(0.0 < v < 10.0 for v in losses)


def test_train_resnet_bad_flag_exits_2(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_resnet.py"), "--image-size", "8",
                        "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=mpi_env())
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "--image-size=8" in err[0]
