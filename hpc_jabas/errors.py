"""Errors that reach the user as one clear line (the CLI prints str(err) and exits 2)."""


class JabasError(Exception):
    """Base of every error hpc-jabas raises on purpose."""


class ConfigError(JabasError, ValueError):
    """Bad input: an unknown name, an impossible value. The message names the value and what is valid."""


class SlurmError(JabasError, RuntimeError):
    """Slurm is missing, unreachable, or refused a request."""


class CheckpointError(JabasError, RuntimeError):
    """No usable checkpoint."""


class InfeasibleError(JabasError):
    """A plan or a partition mix that cannot exist: a batch no micro-batch size realises on these GPUs,
    a mix that does not fit memory. Not a user error (the input may be fine for another mix) and not a bug:
    callers that search (the auto-scaler, B snapping) skip the candidate; everything else reports it."""
