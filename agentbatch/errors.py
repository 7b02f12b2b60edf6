"""The one error type that stops a run before it starts."""


class FatalError(Exception):
    """A problem that stops the run before it starts: printed as one line, exit code 2."""
