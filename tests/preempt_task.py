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
