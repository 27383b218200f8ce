"""What every rank runs: torch and one communication backend. Every collective goes through comm/seam.py, which
holds one Backend (comm/backend.py): comm/torch_backend.py's TorchBackend (torch.distributed) or
comm/horovod_backend.py's HorovodBackend (the only Horovod import); docs/backends.md. The sub-packages are layers,
bottom first: comm < persist < this package's own modules (the loop) < profiling < job (docs/layout.md)."""
