"""Errors that reach the user as one clear line (the CLI prints str(err) and exits 2)."""


class JabasError(Exception):
    """Base of every error hpc-jabas raises on purpose."""


class ConfigError(JabasError, ValueError):
    """Bad input: an unknown name, an impossible value. The message names the value and what is valid."""


class SlurmError(JabasError, RuntimeError):
    """Slurm is missing, unreachable, or refused a request."""


class CheckpointError(JabasError, RuntimeError):
    """No usable checkpoint."""
