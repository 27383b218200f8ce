"""What several benchmarks share: the mpirun re-launch and profiling (launch), the hand-written LB-BSP (lbbsp), the
benchmarks' models (realmodel, straggler_model) and the time-to-accuracy tasks (tta_tasks)."""
