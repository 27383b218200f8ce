"""The task of the preemption tests and bench/faults.py: tests/reference.py's float64 model and data, Adam.

A Slurm job runs it as "preempt_task:build" (tests/ on its pythonpath); reference.reference_run replays the
same run in one process, so a preempted and resumed chain can be checked against the uninterrupted run.
"""
from reference import make_data, make_model, make_optimizer
from torch import nn

import hpc_jabas

N, LR, OPT = 240, 0.01, "adam"


def build():
    model = make_model()
    return hpc_jabas.Task(model, make_optimizer(OPT, model.parameters(), LR), make_data(N), nn.CrossEntropyLoss())


def build_loader():
    """The same run fed by a DataLoader with 2 worker processes (the commonest real job): the workers get
    Slurm's TERM too, and must not kill the ranks before their safe point."""
    import torch
    task = build()
    task.dataset = torch.utils.data.DataLoader(task.dataset, num_workers=2, persistent_workers=True)
    return task
