"""The benchmarks (run from the repository root as ``python -m bench.NAME``; bench/RESULTS.md holds their results)."""
