"""The performance model: a GPU type's measured compute profile, the model of a micro-batch's time, the allreduce
and an iteration of a plan, and its online calibration from what a job measures. Below planning/: it prices plans
without importing them."""
