"""Errors the build pipeline shows to a user: one line each, saying what to do."""
from ortllm.runtime.errors import OrtllmError


class BuildError(OrtllmError):
    """A build input or option is wrong; the message says how to fix it."""
