"""JSON from strangers, with limits: nesting depth and the length of number literals.

    data = loads_limited(body)      # JSONLimitError (-> 400) beyond the limits

Python's parser recurses once per nesting level (a body of 100,000 "[" raises RecursionError)
and refuses integers beyond 4,300 digits with a ValueError; both are a client's mistake, not
the server's, so they are checked here and named."""

from __future__ import annotations

import json

MAX_DEPTH = 128              # far beyond any real request (tool schemas included)
MAX_NUMBER_CHARS = 100       # int64 is 20 characters; a float's repr at most 24


class JSONLimitError(ValueError):
    pass


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONLimitError(f"a number has {len(text)} digits (at most {MAX_NUMBER_CHARS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONLimitError(f"a number has {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return float(text)


def _constant(name: str):
    raise JSONLimitError(f"{name} is not a JSON value")


def check_depth(value, limit: int = MAX_DEPTH) -> None:
    """JSONLimitError when containers nest deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if d > limit:
            raise JSONLimitError(f"objects and arrays nest more than {limit} levels deep")
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))


def loads_limited(body: bytes | str):
    """json.loads with the limits above (JSONLimitError), and json's own errors otherwise."""
    try:
        data = json.loads(body, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise JSONLimitError(f"objects and arrays nest more than {MAX_DEPTH} levels deep") from None
    check_depth(data)
    return data
