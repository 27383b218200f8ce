"""What every rank runs: torch + Horovod (comm.py is the only Horovod import)."""
