"""`hpc-jabas export CKPT OUT.pt`: the checkpoint's model weights as a plain state_dict.

The output is ``torch.save(model_state_dict, OUT)``: ``model.load_state_dict(torch.load(OUT))``
reads it (``weights_only=True`` works: tensors only). CKPT is a Trainer checkpoint (its
size and checksum are verified against the integrity record beside it) or a run directory (its
newest good checkpoint). OUT is never overwritten without ``--force``. Bad input: one line, exit 2.
"""
from __future__ import annotations

from pathlib import Path

from hpc_jabas.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("export", help="write a checkpoint's model weights as a plain torch state_dict")
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint file, or a run directory (its newest checkpoint)")
    p.add_argument("out", metavar="OUT.pt", help="where the state_dict goes")
    p.add_argument("--force", action="store_true", help="overwrite OUT")
    p.set_defaults(func=run)
    return p


def _resolve(src: Path) -> Path:
    from hpc_jabas.runtime.persist import checkpoint as ckpt
    if src.is_dir():
        for d in (src / "checkpoints", src):
            found = ckpt.list_checkpoints(d)
            if found:
                return found[-1]
        raise ConfigError(f"{str(src)!r} holds no checkpoint (ckpt-*.pt); give a checkpoint file or a run directory")
    if not src.exists():
        raise ConfigError(f"checkpoint {str(src)!r} does not exist")
    return src


def run(args) -> int:
    from hpc_jabas.log import get_logger
    from hpc_jabas.runtime.resume import Checkpointer
    out = Path(args.out)
    if out.exists() and not args.force:
        raise ConfigError(f"{str(out)!r} exists; pass --force to overwrite it")
    if out.is_dir():
        raise ConfigError(f"{str(out)!r} is a directory; give a file name such as model.pt")
    src = _resolve(Path(args.checkpoint))
    state = Checkpointer.export(src, out)      # runtime/resume.py: verified, then written atomically
    n = sum(int(v.numel()) for v in state.values())
    get_logger(__name__).info("wrote %s: %d tensors, %d values, from %s", out, len(state), n, src)
    return 0
