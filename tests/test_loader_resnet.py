"""examples/train_resnet.py: the standard ResNet-18, the JPEG folder it decodes, and bad flags exit 2. Its run
on 3 emulated heterogeneous ranks with 2 DataLoader workers each is examples/README.md's block, checked by
tests/test_readme.py (samples, iterations, the loader's lookahead, the model's size)."""
import subprocess
import sys

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


def test_train_resnet_bad_flag_exits_2(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_resnet.py"), "--image-size", "8",
                        "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=mpi_env())
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "--image-size=8" in err[0]
