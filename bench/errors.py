"""Errors `ortllm bench` shows to a user: one line each (the CLI prints `ortllm: error: ...`), saying what to do."""
from ortllm.runtime.errors import OrtllmError


class BenchError(OrtllmError):
    """A scenario could not run (a server that did not start, a child that failed); the message names its log."""
