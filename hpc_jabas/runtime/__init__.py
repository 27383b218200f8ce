"""What every rank runs: torch and one communication backend. Every collective goes through comm.py, which
forwards to comm_torch.py (torch.distributed) or comm_horovod.py (the only Horovod import); docs/backends.md."""
