"""Profiler: measure what the perf model (core/perf/perfmodel.py) needs, for one model on this device.

For a model given as ``module:callable`` (returning ``(model, loss_fn, sample_batch)``, see
examples/models.py) the profiler measures, on the current device:

* **micro-batch time** t(b) for a list of micro-batch sizes b: the Trainer's own micro-batch step
  (runtime/step.py: take b samples, move them to the device, forward, weighted backward through
  the HeterogeneousOptimizer, loss kept on the device) after ``warmup`` untimed runs, the median
  of ``repeats`` timed runs. Timed with CUDA events on a GPU, ``time.perf_counter`` on the CPU
  (:mod:`.timing`);
* **update time** ``update_s``: ``optimizer.step()`` + ``zero_grad`` (median, same way);
* **memory cap** ``max_b`` (:mod:`.memory`): on CUDA by probing - double b until an out-of-memory
  error (or the probe limit), then bisect - with ``torch.cuda.max_memory_allocated`` giving the
  bytes per sample; on the CPU from a memory limit (``memory_gb``, else the catalog memory of the
  GPU type) and *estimated* bytes: per sample = growth of the tensors autograd saves for backward
  (measured at two sizes) + the input; fixed = parameters x (weights, gradients, optimizer
  state). Both are capped at ``b_limit``;
* **gradient size** ``grad_bytes``: bytes of the parameters that require gradients;
* **allreduce** (:mod:`.allreduce`, only inside a world of >= 2 ranks): seconds of an
  ``op=Sum`` allreduce of several message sizes (after a tiny allreduce as barrier; per repeat
  the slowest rank; median over repeats), fitted by ``AllreduceModel.fit``. The fitted
  ``bandwidth`` is rescaled so that ``a == 1``: it is then the measured effective bytes/s.

Emulated GPU types (:mod:`.compute`, ``emulate=True``): a CPU rank that emulates type T runs the
real compute and then sleeps until t(b) = (base_s + per_sample_s * b) / speed (runtime/emulate.py),
so T's profile is that formula (``emulated=True``, ``formula`` set, ``source`` says so) as long as
the CPU compute measured here stays below it; where it does not (the emulator overruns) the
profile keeps the larger measured time at those b and drops the formula, and the source says so.

Modules: :mod:`.defaults` (constants; no torch, for the CLI), :mod:`.load` (the one
``module:callable`` loader, the model bundle, devices), :mod:`.timing`, :mod:`.memory`,
:mod:`.allreduce`, :mod:`.compute` (measurement -> profiles) and :mod:`.run` (``hpc-jabas
profile``); import the names from those modules. Only the allreduce part
touches the communication backend (``comm`` is imported lazily there).
"""
