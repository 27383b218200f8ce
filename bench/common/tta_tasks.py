"""Tasks of bench/adaptive_tta.py: a generated image-like dataset whose gradient noise scale grows
as training proceeds, and scikit-learn's bundled digits. Plain torch + numpy (no hpc_jabas).

Main task ("shapes"): 10 classes of 12x12 single-channel images. Each class has 3 smooth random
prototypes (a smoothed random field); a sample is one of its class's prototypes with a random
contrast, shifted by up to 2 pixels, blended with a random other class's prototype (weight up to
0.45) and pixel noise. 15% of the TRAINING labels are replaced by a random class (test labels
are clean), and the model augments its input while training (a random shift of up to 1 pixel and
pixel noise). Early on every sample pulls the same way; later the mean gradient shrinks while the
per-sample gradients (noisy labels, augmentation) do not: B_noise = tr(Sigma) / |G|^2 grows, the
regime adaptive batching is for. The dataset is the same for every run (data seed 0); a run's seed
changes the initial weights, the sampler's order and the augmentation.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

SIDE = 12
CLASSES = 10


def _smooth_field(rng: np.random.Generator, side: int, sigma: float) -> np.ndarray:
    from scipy.ndimage import gaussian_filter
    f = gaussian_filter(rng.standard_normal((side, side)), sigma, mode="wrap")
    f = f - f.mean()
    return f / (np.abs(f).max() + 1e-9)


def shapes_data(n_train: int = 6000, n_test: int = 2000, label_noise: float = 0.1, pixel_noise: float = 0.3,
                shift: int = 1, fine: float = 0.3, seed: int = 0):
    """(x_train [N, 144] float32, y_train (with label noise), x_test, y_test (clean labels)).

    Classes come in pairs that share a coarse pattern (amplitude 1); a class differs from its
    twin by a fine pattern (amplitude ``fine``, one of 3 per class). A sample: its class's pattern
    with a random contrast in [0.7, 1.3], shifted by up to ``shift`` pixels, plus pixel noise.
    """
    rng = np.random.default_rng(seed)
    sub = np.stack([np.stack([_smooth_field(rng, SIDE, 1.6) for _ in range(3)]) for _ in range(CLASSES)])
    coarse = np.stack([_smooth_field(rng, SIDE, 1.6) for _ in range(CLASSES // 2)])
    protos = coarse[np.arange(CLASSES) // 2][:, None] + fine * sub
    n = n_train + n_test
    y = rng.integers(0, CLASSES, n)
    k = rng.integers(0, 3, n)
    a = rng.uniform(0.7, 1.3, n)[:, None, None]
    img = a * protos[y, k]
    dx, dy = rng.integers(-shift, shift + 1, n), rng.integers(-shift, shift + 1, n)
    for i in range(n):
        img[i] = np.roll(img[i], (dx[i], dy[i]), axis=(0, 1))
    img = img + rng.normal(0.0, pixel_noise, img.shape)
    x = img.reshape(n, -1).astype(np.float32)
    y_tr = y[:n_train].copy()
    flip = rng.random(n_train) < label_noise
    y_tr[flip] = rng.integers(0, CLASSES, int(flip.sum()))
    return x[:n_train], y_tr, x[n_train:], y[n_train:]


class Augment(nn.Module):
    """Training-time augmentation inside the model: pixel noise and, optionally, a random shift per sample."""

    def __init__(self, side: int = SIDE, shift: int = 0, noise: float = 0.15):
        super().__init__()
        self.side, self.shift, self.noise = side, shift, noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or x.shape[0] == 0:
            return x
        n = x.shape[0]
        img = x.view(n, self.side, self.side)
        if self.shift:
            s = 2 * self.shift + 1
            pick = torch.randint(0, s * s, (n,))
            out = torch.empty_like(img)
            for j in range(s * s):
                m = pick == j
                if bool(m.any()):
                    out[m] = torch.roll(img[m], (j // s - self.shift, j % s - self.shift), dims=(1, 2))
            img = out
        return img.reshape(n, -1) + self.noise * torch.randn_like(x)


def shapes_model(shift: int = 0, noise: float = 0.15) -> nn.Module:
    """MLP 144 -> 128 -> 64 -> 10 behind the augmentation (27k parameters)."""
    return nn.Sequential(Augment(shift=shift, noise=noise), nn.Linear(SIDE * SIDE, 128), nn.ReLU(),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def digits_data(seed: int = 0):
    """scikit-learn's 8x8 digits scaled to [0, 1], stratified 75/25 split (as examples/train_digits.py)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.25, random_state=seed, stratify=y)
    return Xtr.astype(np.float32), ytr, Xte.astype(np.float32), yte


def digits_model() -> nn.Module:
    """The MLP of examples/train_digits.py: 64 -> 128 -> 64 -> 10."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    was = model.training
    model.eval()
    with torch.no_grad():
        a = float((model(x).argmax(1) == y).float().mean())
    model.train(was)
    return a


def noise_scale(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, b_small: int = 32,
                n_small: int = 64, gen: torch.Generator | None = None,
                forward_fn=None) -> tuple[float, float, float]:
    """Gradient noise scale of the model on the training data, as the optimizer would see it
    (train mode, augmentation on): n_small disjoint batches of b_small samples drawn at random,
    |g_small|^2 averaged over them, |g_big|^2 of their mean (b_big = n_small * b_small; n_small is
    capped at N // b_small), then McCandlish et al.'s unbiased estimators. Returns
    (B_noise, |G|^2, tr(Sigma)). The model's parameters and .grad are left untouched. ``forward_fn``
    (model, (x, y)) -> loss or (loss, weight), in place of ``loss_fn(model(x), y)``: the LM task's token-mean loss."""
    n_small = max(2, min(n_small, x.shape[0] // b_small))
    idx = torch.randperm(x.shape[0], generator=gen)[: b_small * n_small]
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    sq_small = 0.0
    was = model.training
    model.train()
    for j in range(n_small):
        sel = idx[j * b_small:(j + 1) * b_small]
        if forward_fn is None:
            loss = loss_fn(model(x[sel]), y[sel])
        else:
            loss = forward_fn(model, (x[sel], y[sel]))
            loss = loss[0] if isinstance(loss, tuple) else loss
        grads = torch.autograd.grad(loss, params)
        sq_small += float(sum(g.double().pow(2).sum() for g in grads))
        for t, g in zip(total, grads):
            t.add_(g)
    model.train(was)
    sq_small /= n_small
    sq_big = float(sum((t / n_small).double().pow(2).sum() for t in total))
    bs, bb = float(b_small), float(b_small * n_small)
    g2 = (bb * sq_big - bs * sq_small) / (bb - bs)
    s = (sq_small - sq_big) / (1.0 / bs - 1.0 / bb)
    return (s / g2 if g2 > 0 else float("inf")), g2, s


def shapes_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:shapes_bundle`: (model, loss, 256 samples)."""
    x, y, _, _ = shapes_data(n_train=256, n_test=1)
    return shapes_model(), nn.CrossEntropyLoss(), (torch.tensor(x), torch.tensor(y, dtype=torch.long))


def digits_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:digits_bundle`: (model, loss, 256 samples)."""
    x, y, _, _ = digits_data()
    return digits_model(), nn.CrossEntropyLoss(), (torch.tensor(x[:256]), torch.tensor(y[:256], dtype=torch.long))


# ---- the image task: the ResNet example on JPEG files ---------------------------------------------------
#: the image task's sizes: 10 classes x PER_CLASS JPEG files of SIZE x SIZE pixels, ResNet-18 of WIDTH channels
IMAGE_PER_CLASS, IMAGE_TEST_PER_CLASS, IMAGE_SIZE, IMAGE_WIDTH = 100, 50, 24, 8


def image_model() -> nn.Module:
    """examples/train_resnet.py's ResNet-18 (BasicBlock [2, 2, 2, 2], BatchNorm), IMAGE_WIDTH channels."""
    from examples.train_resnet import resnet18
    return resnet18(10, width=IMAGE_WIDTH)


def image_data(root, quick: bool = False):
    """(training Dataset, test images, test labels): the example's JpegFolder over generated JPEG files
    (decoded, randomly cropped and flipped, normalised on every read), and a test folder of other images
    (another seed) decoded once. Every rank may call it: one writes the folders, the others wait."""
    from pathlib import Path

    from examples.jpeg_shapes import JpegFolder, ensure_image_folder, preload
    per, per_test = (40, 20) if quick else (IMAGE_PER_CLASS, IMAGE_TEST_PER_CLASS)
    train = ensure_image_folder(Path(root) / f"train-{per}-{IMAGE_SIZE}", per_class=per, size=IMAGE_SIZE, seed=0)
    test = ensure_image_folder(Path(root) / f"test-{per_test}-{IMAGE_SIZE}", per_class=per_test, size=IMAGE_SIZE,
                               seed=1)
    xt, yt = preload(JpegFolder(test, train=False)).tensors
    return JpegFolder(train, train=True), xt, yt


def image_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:image_bundle`: (the image model, loss, 64 samples)."""
    torch.manual_seed(0)
    x = torch.randn(64, 3, IMAGE_SIZE, IMAGE_SIZE)
    return image_model(), nn.CrossEntropyLoss(), (x, torch.randint(0, 10, (64,)))


# ---- the language-model task: examples/train_lm.py's tiny transformer, next-token prediction ------------------
#: the task's sizes: TinyLM at width LM_WIDTH (2 layers, 4 heads, feed-forward 2 x width: 20K parameters, so
#: that its real CPU compute stays well below the emulated time with 3 ranks on 2 cores), LM_TRAIN training and
#: LM_TEST validation sequences of a Markov chain of order LM_ORDER
LM_WIDTH, LM_TRAIN, LM_TEST = 32, 6144, 512
#: the chain's order. The example's own chain (make_data) is of order 1: a bigram table that this model learns
#: to its ceiling within the first epoch at any batch size (58.0% next-token accuracy after one epoch at B = 32,
#: 58.4% after 8; 56.2% after one at B = 512), so a target at 60% of the budget would sit in the plateau's noise.
#: Order 2 (the next token drawn from a table over the previous two: 961 contexts) is learned over the whole
#: budget (B = 32, lr 0.01: 16, 36, 43, 45, 47, 48, 48, 49% at the 8 epoch ends), the regime adaptive batching
#: is for. The sequences keep the example's format (vocabulary, padding, lengths 8..32), so its TinyLM,
#: lm_forward and lm_terms run on them unchanged.
LM_ORDER = 2


def lm_chain(n: int, seed: int = 0, order: int = LM_ORDER):
    """``n`` sequences in examples/train_lm.py's format, TensorDataset(tokens [n, MAX_LEN] long, lengths [n] long):
    order 1 is the example's own make_data; order 2 draws each token from a fixed random table (peaked as the
    example's: softmax of 3 x normal logits) over the previous two tokens. The table is the same for every split;
    ``seed`` draws the lengths (8..32) and the tokens."""
    from examples.train_lm import MAX_LEN, PAD, VOCAB, make_data
    if order == 1:
        return make_data(n, seed=seed)
    if order != 2:
        raise ValueError(f"lm_chain: order {order} (1 or 2)")
    V = VOCAB - 1                                             # real tokens 1..V; 0 pads
    g = torch.Generator().manual_seed(4321)
    trans = torch.softmax(torch.randn(V * V, V, generator=g) * 3.0, dim=1)
    g.manual_seed(seed)
    lengths = torch.randint(8, MAX_LEN + 1, (n,), generator=g)
    tokens = torch.full((n, MAX_LEN), PAD, dtype=torch.long)
    prev, cur = torch.randint(0, V, (n,), generator=g), torch.randint(0, V, (n,), generator=g)
    for t in range(MAX_LEN):
        tokens[:, t] = torch.where(t < lengths, cur + 1, PAD)
        prev, cur = cur, torch.multinomial(trans[prev * V + cur], 1, generator=g).squeeze(1)
    return torch.utils.data.TensorDataset(tokens, lengths)


def lm_data(n_train: int = LM_TRAIN, n_test: int = LM_TEST):
    """(training TensorDataset(tokens, lengths), validation tokens, validation lengths): data seed 0 and 1."""
    val = lm_chain(n_test, seed=1)
    return lm_chain(n_train, seed=0), val.tensors[0], val.tensors[1]


def lm_model() -> nn.Module:
    """examples/train_lm.py's TinyLM at width LM_WIDTH: forward(tokens, pad_mask) -> logits."""
    from examples.train_lm import TinyLM
    return TinyLM(d=LM_WIDTH, layers=2, heads=4, ff=2 * LM_WIDTH)


def lm_accuracy(model: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor) -> float:
    """Next-token accuracy over the validation set's real target tokens (token-weighted), through the example's
    lm_terms, in eval mode and without gradients (the model's mode is restored)."""
    from examples.train_lm import lm_terms
    was = model.training
    model.eval()
    with torch.no_grad():
        _, correct, ntok = lm_terms(model, (tokens, lengths))
    model.train(was)
    return float(correct) / max(int(ntok), 1)


class LMProfiled(nn.Module):
    """lm_bundle's module: `hpc-jabas profile` runs ``loss_fn(model(x), y)`` and takes no forward_fn, while the
    LM needs both tensors of its (tokens, lengths) batch. So this module holds the LM and passes the tokens
    through; the bundle's loss runs the example's lm_forward on (tokens, lengths). The profiled micro-batch is the
    Trainer's: the same forward, token-mean loss and backward over the same parameters."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens


def lm_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:lm_bundle`: (LMProfiled(the task's LM), a loss that
    runs lm_forward on the batch, 256 training sequences as (tokens, lengths))."""
    from examples.train_lm import lm_forward
    torch.manual_seed(0)
    m = LMProfiled(lm_model())

    def loss(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return lm_forward(m.lm, (tokens, lengths))[0]
    return m, loss, tuple(lm_chain(256).tensors)


# ---- the untuned task: a 1-D convolutional net with Adam on generated sequences -------------------------
#: added after the adaptive defaults were frozen and run once with them, never used to choose a default: a
#: different architecture (convolutions over time, max pooling) and optimizer (Adam, no weight decay) from the
#: tasks the defaults were chosen on. SEQ_LEN steps, SEQ_CLASSES classes, SEQ_TRAIN / SEQ_TEST sequences.
SEQ_LEN, SEQ_CLASSES, SEQ_TRAIN, SEQ_TEST = 48, 8, 4000, 2000


def seq_data(n_train: int = SEQ_TRAIN, n_test: int = SEQ_TEST, label_noise: float = 0.1, seed: int = 0):
    """(x_train [N, 1, SEQ_LEN] float32, y_train (with label noise), x_test, y_test (clean labels)).

    Each class owns a smooth motif of 10 steps; a sequence is AR(1) background noise (phi 0.7) with its class's
    motif at a random place and random amplitude in [0.6, 1.4], plus another class's motif at 0.3 of that weight at
    another random place, so the class is told by which motif is stronger, not by which is present."""
    rng = np.random.default_rng(seed)
    m = 10
    motifs = np.stack([np.convolve(rng.standard_normal(m + 4), np.ones(5) / 5, mode="valid")
                       for _ in range(SEQ_CLASSES)])
    motifs /= np.abs(motifs).max(axis=1, keepdims=True)
    n = n_train + n_test
    y = rng.integers(0, SEQ_CLASSES, n)
    other = (y + rng.integers(1, SEQ_CLASSES, n)) % SEQ_CLASSES
    e = rng.normal(0.0, 0.3, (n, SEQ_LEN))
    x = np.zeros((n, SEQ_LEN))
    x[:, 0] = e[:, 0]
    for t in range(1, SEQ_LEN):
        x[:, t] = 0.7 * x[:, t - 1] + e[:, t]
    a = rng.uniform(0.6, 1.4, n)
    p1, p2 = rng.integers(0, SEQ_LEN - m + 1, n), rng.integers(0, SEQ_LEN - m + 1, n)
    for i in range(n):
        x[i, p1[i]:p1[i] + m] += a[i] * motifs[y[i]]
        x[i, p2[i]:p2[i] + m] += 0.3 * a[i] * motifs[other[i]]
    x = x[:, None, :].astype(np.float32)
    y_tr = y[:n_train].copy()
    flip = rng.random(n_train) < label_noise
    y_tr[flip] = rng.integers(0, SEQ_CLASSES, int(flip.sum()))
    return x[:n_train], y_tr, x[n_train:], y[n_train:]


def seq_model() -> nn.Module:
    """Conv1d 1 -> 16 (k 7) -> max pool 2 -> Conv1d 16 -> 32 (k 5) -> global max pool -> Linear 32 -> 8 (3k
    parameters), ReLU between."""
    return nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(),
                         nn.Linear(32, SEQ_CLASSES))


def seq_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:seq_bundle`: (model, loss, 256 samples)."""
    x, y, _, _ = seq_data(n_train=256, n_test=1)
    return seq_model(), nn.CrossEntropyLoss(), (torch.tensor(x), torch.tensor(y, dtype=torch.long))


def shapes_cnn_model(noise: float = 0.15) -> nn.Module:
    """The second untuned task's model: the shapes images through a 2-D convolutional net (Conv2d 1 -> 8 (3x3) ->
    max pool 2 -> Conv2d 8 -> 16 (3x3) -> max pool 2 -> Linear 144 -> 10, ReLU between; 3k parameters) behind the
    same training-time pixel noise as shapes_model (no shift)."""
    return nn.Sequential(Augment(noise=noise), nn.Unflatten(1, (1, SIDE, SIDE)),
                         nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * (SIDE // 4) ** 2, CLASSES))


def shapes_cnn_bundle():
    """For `hpc-jabas profile --model bench.common.tta_tasks:shapes_cnn_bundle`: (model, loss, 256 samples)."""
    x, y, _, _ = shapes_data(n_train=256, n_test=1)
    return shapes_cnn_model(), nn.CrossEntropyLoss(), (torch.tensor(x), torch.tensor(y, dtype=torch.long))
