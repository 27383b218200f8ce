"""Errors that reach the user as one clear line (the CLI prints str(err) and exits 2)."""


class JabasError(Exception):
    """Base of every error hpc-jabas raises on purpose.

    ``quiet``: the error has already been said to the user (rank 0 printed it; the other ranks of a
    collective refusal raise the same error quietly), so :func:`error_line` gives nothing to print.
    """

    quiet: bool = False

    def __init__(self, *args: object, quiet: bool = False) -> None:
        super().__init__(*args)
        self.quiet = quiet


class ConfigError(JabasError, ValueError):
    """Bad input: an unknown name, an impossible value. The message names the value and what is valid."""


class SlurmError(JabasError, RuntimeError):
    """Slurm is missing, unreachable, or refused a request."""


class StateError(JabasError, ValueError):
    """Saved state that cannot be restored: a malformed ``state_dict`` of a controller part (rebalancer,
    predictors, policy), or one made for another job shape. Not bad user input: the fix is another
    checkpoint or a fresh start, and the message says which state and what was expected."""


class CheckpointError(JabasError, RuntimeError):
    """No usable checkpoint."""


class InfeasibleError(JabasError):
    """A plan or a partition mix that cannot exist: a batch no micro-batch size realises on these GPUs,
    a mix that does not fit memory. Not a user error (the input may be fine for another mix) and not a bug:
    callers that search (the auto-scaler, B snapping) skip the candidate; everything else reports it."""


def error_line(e: BaseException, prog: str = "hpc-jabas") -> str | None:
    """The one line the CLI and ``run_main`` print for an error (None: it was said already, ``quiet``)."""
    if getattr(e, "quiet", False):
        return None
    return f"{prog}: error: {e}"
