"""Errors of the vLLM handoff, each a G906Error with a message and a hint."""

from __future__ import annotations

from g906.errors import G906Error, UsageError


class VllmError(G906Error):
    """Base class for everything that goes wrong while handing a plan to vLLM."""


class VllmNotFoundError(VllmError):
    """No usable vLLM: the executable or interpreter is missing or has no vllm package."""


class VllmProbeError(VllmError):
    """`vllm --version` or `vllm serve --help` failed or printed something unreadable."""


class VllmUnsupportedError(UsageError):
    """The recipe asks for something the installed vLLM cannot do (exit status 2)."""


class MissingSecretError(UsageError):
    """server.api_key_env names a variable that is not set."""


class PortInUseError(VllmError):
    """Something already listens on the port the recipe asks for."""


class VllmStartupError(VllmError):
    """vLLM exited before it answered on its HTTP port."""

    def __init__(self, message: str, hint: str | None = None, *, details: list[str] | None = None,
                 returncode: int | None = None):
        super().__init__(message, hint, details=details)
        self.returncode = returncode
        if returncode:
            # propagate vLLM's own status (a signal death N becomes 128+N, as shells report it)
            self.exit_code = returncode if returncode > 0 else 128 - returncode


class VllmStartupTimeout(VllmError):
    """vLLM did not become ready within the start-up timeout (it was stopped)."""
