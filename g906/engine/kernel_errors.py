"""The kernels raise their own KernelChoiceError (they import nothing of g906); at the engine's
entry points it becomes a G906Error, which the CLI and the server report as a message and a
hint, never a traceback."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from g906.errors import G906Error
from g906.kernels.registry import KernelChoiceError

F = TypeVar("F", bound=Callable)


def reported_as_g906_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KernelChoiceError as exc:
            raise G906Error(exc.message, hint=exc.hint) from None

    return wrapper  # type: ignore[return-value]
