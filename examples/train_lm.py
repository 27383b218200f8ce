"""A tiny transformer language model (~270K parameters) with token-count weighted losses.

The data are generated token sequences of varying lengths (a fixed random Markov chain over a
32-token vocabulary, lengths 8..32, right-padded); the model is a 2-layer causal transformer.
``forward_fn`` returns ``(loss, weight)``: the micro-batch's mean loss over its real (unpadded)
target tokens, and that token count. hpc-jabas weights each micro-batch's gradient by its token
count and normalises by the iteration's global token total, so every update is the token-mean
gradient of the whole batch of B sequences, however they are split over ranks and micro-batches
(a sample-weighted mean would over-weight the short sequences' tokens). Evaluation is distributed
(each rank a shard of the validation set) and token-weighted too: ``lm_metric`` returns token
sums with ``count`` = tokens, so ``loss`` is the validation token-mean loss.

    mpirun --oversubscribe -np 3 .venv/bin/python examples/train_lm.py \\
        --emulate --gpu-types v100,p100,rtx2060 --batch 32 --micro-batch 4 --epochs 3 --run-dir runs/lm
"""
from __future__ import annotations

import argparse
import json
import math

import torch
from torch import nn

import hpc_jabas
from hpc_jabas import add_verbosity_flags, configure_from_args

VOCAB, MAX_LEN, PAD = 32, 32, 0          # token 0 pads; real tokens are 1..VOCAB-1


def make_data(n: int, seed: int = 0, min_len: int = 8, max_len: int = MAX_LEN) -> torch.utils.data.TensorDataset:
    """``n`` sequences of a fixed random Markov chain (peaked transitions: learnable), right-padded:
    TensorDataset(tokens [n, max_len] long, lengths [n] long)."""
    g = torch.Generator().manual_seed(1234)                  # the chain is the same for every split
    logits = torch.randn(VOCAB - 1, VOCAB - 1, generator=g) * 3.0
    trans = torch.softmax(logits, dim=1)
    g.manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    tokens = torch.full((n, max_len), PAD, dtype=torch.long)
    cur = torch.randint(0, VOCAB - 1, (n,), generator=g)
    for t in range(max_len):
        tokens[:, t] = torch.where(t < lengths, cur + 1, PAD)
        cur = torch.multinomial(trans[cur], 1, generator=g).squeeze(1)
    return torch.utils.data.TensorDataset(tokens, lengths)


class TinyLM(nn.Module):
    """Token + position embeddings, a causal TransformerEncoder, a linear head."""

    def __init__(self, d: int = 128, layers: int = 2, heads: int = 4, ff: int = 256, max_len: int = MAX_LEN):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        L = tokens.shape[1]
        pos = torch.arange(L, device=tokens.device)
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool, device=tokens.device), diagonal=1)
        h = self.tok(tokens) + self.pos(pos)
        h = self.body(h, mask=causal, src_key_padding_mask=pad_mask)
        return self.head(self.norm(h))


def make_model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM()


def lm_terms(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of the target tokens' losses, correct next-token predictions, target token count)."""
    tokens, lengths = batch[0], batch[1]
    L = int(tokens.shape[1])                       # a shape, not a host read of data
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(L - 1, device=tokens.device)
    valid = pos.unsqueeze(0) < (lengths.unsqueeze(1) - 1)      # target t+1 exists
    logits = model(inp, ~(pos.unsqueeze(0) < lengths.unsqueeze(1)))
    per_tok = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), reduction="none")
    m = valid.reshape(-1).to(per_tok.dtype)
    correct = ((logits.argmax(-1) == tgt) & valid).sum()
    return (per_tok * m).sum(), correct, valid.sum()


def lm_forward(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """forward_fn: (token-mean loss of the micro-batch, its token count) - the count stays on the device."""
    loss_sum, _, ntok = lm_terms(model, batch)
    return loss_sum / ntok.clamp(min=1), ntok


def lm_metric(model: nn.Module, batch) -> dict:
    """Evaluation sums: token losses, correct tokens, and the token count as ``count`` (token means)."""
    loss_sum, correct, ntok = lm_terms(model, batch)
    return {"loss": loss_sum, "token_acc": correct, "count": ntok}


def make_optimizer(name: str, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def build(n: int = 2048, lr: float = 3e-3):
    """The task for Slurm jobs (`hpc-jabas submit --task examples.train_lm:build`)."""
    from hpc_jabas import DistributedEval
    model = make_model()
    return hpc_jabas.Task(model, make_optimizer("adamw", model, lr), make_data(n), forward_fn=lm_forward,
                          eval_fn=DistributedEval(make_data(n // 8, seed=1), metric_fn=lm_metric, batch_size=64))


def main(argv=None):
    ap = hpc_jabas.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2048, help="training sequences")
    ap.add_argument("--n-val", type=int, default=256, help="validation sequences")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    ap.add_argument("--plateau", action="store_true", help="ReduceLROnPlateau on the validation loss (per epoch)")
    ap.add_argument("--summary", help="write a JSON summary here (rank 0)")
    add_verbosity_flags(ap)
    hpc_jabas.add_arguments(ap)
    args = ap.parse_args(argv)
    configure_from_args(args)
    from hpc_jabas import DistributedEval
    train, val = make_data(args.n), make_data(args.n_val, seed=1)
    model = make_model()
    opt = make_optimizer(args.optimizer, model, args.lr)
    cfg = hpc_jabas.config_from_args(args)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0) if args.plateau else None
    evals: list[dict] = []
    dist_eval = DistributedEval(val, metric_fn=lm_metric, batch_size=64)

    def eval_fn(m: nn.Module) -> dict:
        ev = dist_eval(m)
        ev["ppl"] = math.exp(min(ev["loss"], 50.0))
        evals.append(ev)
        return ev

    trainer = hpc_jabas.Trainer(model, opt, train, None, config=cfg, scheduler=sched, forward_fn=lm_forward,
                                eval_fn=eval_fn)
    before = dist_eval(model)
    result = trainer.fit()
    last = evals[-1] if evals else {}
    result.update(params=sum(p.numel() for p in model.parameters()), val_loss_start=before["loss"],
                  val_loss=last.get("loss"), val_token_acc=last.get("token_acc"), evals=evals,
                  lr=opt.param_groups[0]["lr"])
    if trainer.rank == 0:
        print(f"tiny LM: {result['params']} parameters, validation token loss {before['loss']:.3f} -> "
              f"{result['val_loss']}", flush=True)
    if args.summary and trainer.rank == 0:
        with open(args.summary, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    hpc_jabas.run_main(main)
