"""StructuredOutputsParams: what one request's output must match (vLLM's shape: exactly one of
json, regex, choice, grammar, json_object), and from where in the output it applies."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any


class StructuredOutputsError(ValueError):
    """A constraint the engine cannot use (a bad schema, regex or grammar); the message names it."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: dict | str | bool | None = None     # a JSON schema (or its JSON text)
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None                 # Lark (llguidance's dialect) or GBNF
    json_object: bool | None = None            # any JSON object
    disable_any_whitespace: bool = False       # JSON without free whitespace (compact)
    # the constraint applies to what follows this text in the output (e.g. "</think>": the
    # reasoning stays free); None: to the whole output
    after: str | None = None

    def __post_init__(self) -> None:
        kinds = self.kinds()
        if len(kinds) != 1:
            raise StructuredOutputsError(
                "structured outputs take exactly one of json, regex, choice, grammar, json_object"
                + (f" (got {', '.join(kinds)})" if kinds else " (got none)"))
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise StructuredOutputsError("choice must be a non-empty list of strings", "choice")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", _json.loads(self.json))
            except ValueError as exc:
                raise StructuredOutputsError(f"json: the schema is not valid JSON: {exc}", "json") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise StructuredOutputsError("json must be a JSON schema (an object)", "json")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise StructuredOutputsError(f"{name} must be a non-empty string", name)

    def kinds(self) -> list[str]:
        return [k for k in ("json", "regex", "choice", "grammar", "json_object")
                if getattr(self, k) is not None and not (k == "json_object" and not self.json_object)]

    @property
    def kind(self) -> str:
        return self.kinds()[0]

    def key(self) -> str:
        """A hashable identity of the constraint (not of `after`), for caching compiled grammars."""
        value: Any = getattr(self, self.kind)
        return self.kind + ":" + _json.dumps(value, sort_keys=True, default=list)
