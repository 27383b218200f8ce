"""An image folder of generated JPEG files, and a Dataset that decodes and augments them.

    root/
      c0_red_circle/00000.jpg ...           10 classes: a coloured shape on a noisy background
      c1_green_square/...
      .complete                              written last (the folder's parameters)

``ensure_image_folder`` writes the files with pillow at first use (one process writes, the others
wait: safe when every rank of a job calls it); ``JpegFolder`` reads them back: PIL decode, then for
training a random crop (4 pixels of zero padding) and a random horizontal flip, then a float
tensor normalised per channel. Randomness comes from ``torch`` (seeded per DataLoader worker).
Used by examples/train_resnet.py and bench/input_pipeline.py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

try:
    from PIL import Image, ImageDraw
except ImportError:                        # one line, exit 2: the extra that brings it
    print("examples/jpeg_shapes.py needs pillow, which is not installed: pip install 'hpc-jabas[examples]'",
          file=sys.stderr)
    raise SystemExit(2) from None

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40),
           "purple": (150, 50, 190)}
CLASSES = [("red", "circle"), ("green", "square"), ("blue", "triangle"), ("yellow", "cross"),
           ("purple", "ring"), ("red", "square"), ("green", "triangle"), ("blue", "cross"), ("yellow", "ring"),
           ("purple", "circle")]
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def class_names() -> list[str]:
    return [f"c{k}_{c}_{s}" for k, (c, s) in enumerate(CLASSES)]


def draw_image(k: int, size: int, rng: np.random.Generator) -> Image.Image:
    """Class ``k``'s shape, at a random place and scale, on a noisy grey background."""
    colour, shape = CLASSES[k]
    grey = rng.normal(110, 30) + rng.normal(0, 12, (size, size, 1))
    img = Image.fromarray(np.clip(np.repeat(grey, 3, axis=2), 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    r = rng.uniform(0.22, 0.38) * size
    cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
    fill = tuple(int(np.clip(c + rng.normal(0, 20), 0, 255)) for c in COLOURS[colour])
    box = (cx - r, cy - r, cx + r, cy + r)
    w = max(2, int(r / 2.5))
    if shape == "circle":
        d.ellipse(box, fill=fill)
    elif shape == "square":
        d.rectangle(box, fill=fill)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    elif shape == "cross":
        d.rectangle((cx - r, cy - w / 2, cx + r, cy + w / 2), fill=fill)
        d.rectangle((cx - w / 2, cy - r, cx + w / 2, cy + r), fill=fill)
    else:
        d.ellipse(box, outline=fill, width=w)
    return img


def ensure_image_folder(root: str | os.PathLike, per_class: int = 100, size: int = 64, seed: int = 0,
                        wait_s: float = 600.0) -> Path:
    """``root`` holding ``per_class`` JPEG files of ``size`` x ``size`` per class (written once)."""
    root = Path(root)
    params = {"per_class": per_class, "size": size, "seed": seed, "classes": class_names()}
    marker = root / ".complete"
    if marker.exists() and json.loads(marker.read_text()) == params:
        return root
    lock = root.with_name(root.name + ".lock")
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock.mkdir()
    except FileExistsError:                     # another process writes it: wait for its marker
        t0 = time.monotonic()
        while not (marker.exists() and json.loads(marker.read_text()) == params):
            if time.monotonic() - t0 > wait_s:
                raise TimeoutError(f"{root} is not complete after {wait_s:.0f} s (remove {lock} if stale)") from None
            time.sleep(0.2)
        return root
    try:
        tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for k, name in enumerate(class_names()):
            (tmp / name).mkdir(parents=True)
            rng = np.random.default_rng([seed, k])
            for i in range(per_class):
                draw_image(k, size, rng).save(tmp / name / f"{i:05d}.jpg", quality=90)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
        marker.write_text(json.dumps(params))
    finally:
        lock.rmdir()
    return root


def to_tensor(img: Image.Image) -> torch.Tensor:
    """uint8 HWC (PIL) -> uint8 CHW tensor."""
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def normalise(x: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3, H, W] -> float, per-channel (x / 255 - mean) / std."""
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x.float() / 255.0 - mean) / std


def augment(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``pad``) and random horizontal flip of one uint8 CHW image."""
    _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    i, j = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,)))
    out = padded[:, i:i + h, j:j + w]
    return out.flip(-1) if bool(torch.rand(()) < 0.5) else out


class JpegFolder(torch.utils.data.Dataset):
    """(image, label) from an image folder: decoded with PIL, augmented when ``train``, normalised."""

    def __init__(self, root: str | os.PathLike, train: bool = True) -> None:
        root = Path(root)
        names = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(str(f), k) for k, n in enumerate(names) for f in sorted((root / n).glob("*.jpg"))]
        self.train = train
        if not self.files:
            raise FileNotFoundError(f"no JPEG files under {root}")

    def __len__(self) -> int:
        return len(self.files)

    def decode(self, i: int) -> torch.Tensor:
        with Image.open(self.files[i][0]) as im:
            return to_tensor(im.convert("RGB"))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.decode(i)
        if self.train:
            x = augment(x)
        return normalise(x), self.files[i][1]


def preload(ds: JpegFolder) -> torch.utils.data.TensorDataset:
    """Every image decoded once and normalised (no augmentation): the data already in memory."""
    xs = torch.stack([ds.decode(i) for i in range(len(ds))])
    ys = torch.tensor([k for _, k in ds.files], dtype=torch.long)
    return torch.utils.data.TensorDataset(normalise(xs), ys)
