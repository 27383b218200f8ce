"""Every Python process the test suite starts (ranks, CLIs, Slurm jobs' steps: tests/conftest.py puts this folder
on PYTHONPATH) runs its cyclic garbage collector ten times less often than Python's default (700 allocations).
Most of the suite's CPU is hundreds of rank processes importing torch, and at the default a fifth of an import
was full collections walking the objects imported so far (import torch, torch._dynamo, horovod.torch and
hpc_jabas: 2.9 CPU-s at 700, 2.4 at 7,000; the same peak memory). Nothing a test asserts depends on when a
collection runs; a user's own processes keep Python's default."""
import gc

gc.set_threshold(7000, 10, 10)
