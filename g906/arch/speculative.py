"""SpeculativeConfig: vLLM's `speculative_config` shape, checked on construction. Torch-free:
the recipe, the vLLM hand-off and the engine build and check the same object.

    {"method": "mtp", "num_speculative_tokens": 2}
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}

vLLM names the MTP method after the model family that ships it (qwen3_next_mtp, deepseek_mtp,
...); all of them mean "the checkpoint's own MTP block" here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# vLLM's model-specific MTP method names, all run as the checkpoint's own MTP block
MTP_METHODS = frozenset({
    "mtp", "qwen3_5_mtp", "qwen3_next_mtp", "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp",
    "longcat_flash_mtp", "qwen3_5_moe_mtp", "draft-mtp",
})
NGRAM_METHODS = frozenset({"ngram", "[ngram]"})
MAX_SPECULATIVE_TOKENS = 16
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


class SpeculativeConfigError(ValueError):
    """A bad speculative_config; `field` names the offending key."""

    def __init__(self, field: str, message: str):
        super().__init__(f"speculative_config.{field}: {message}")
        self.field = field


def normalise_method(method: Any) -> str:
    """"mtp" or "ngram" for any name vLLM gives them; SpeculativeConfigError otherwise."""
    m = str(method).strip().lower()
    if m in MTP_METHODS:
        return "mtp"
    if m in NGRAM_METHODS:
        return "ngram"
    known = ", ".join(sorted({"mtp", "ngram"} | MTP_METHODS))
    raise SpeculativeConfigError("method", f"{method!r} is not a method g906 runs (known: {known})")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str                         # "mtp" | "ngram" (aliases normalised)
    num_speculative_tokens: int
    prompt_lookup_min: int = 1          # n-gram only: shortest suffix that may match
    prompt_lookup_max: int = 4          # n-gram only: longest suffix tried first

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", normalise_method(self.method))
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise SpeculativeConfigError("num_speculative_tokens",
                                         f"must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpeculativeConfigError(name, f"must be a positive integer, got {v!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SpeculativeConfigError("prompt_lookup_min", f"({self.prompt_lookup_min}) must not exceed "
                                         f"prompt_lookup_max ({self.prompt_lookup_max})")

    @classmethod
    def parse(cls, value: "SpeculativeConfig | Mapping[str, Any] | None") -> "SpeculativeConfig | None":
        """From vLLM's dict (or None / an instance). Unknown keys are an error (a typo would
        otherwise silently turn speculation off or change it)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, Mapping):
            raise SpeculativeConfigError("method", f"expected a mapping, got {type(value).__name__}")
        extra = [k for k in value if k not in _KEYS]
        if extra:
            raise SpeculativeConfigError(str(extra[0]), f"unknown key (known: {', '.join(_KEYS)})")
        if "method" not in value:
            raise SpeculativeConfigError("method", "is required (\"mtp\" or \"ngram\")")
        if "num_speculative_tokens" not in value:
            raise SpeculativeConfigError("num_speculative_tokens", "is required")
        kw = {k: v for k, v in value.items() if v is not None}
        # as vLLM: one bound given, the other takes its value
        if "prompt_lookup_min" in kw and "prompt_lookup_max" not in kw:
            kw["prompt_lookup_max"] = kw["prompt_lookup_min"]
        elif "prompt_lookup_max" in kw and "prompt_lookup_min" not in kw:
            kw["prompt_lookup_min"] = kw["prompt_lookup_max"]
        return cls(**kw)

    def to_vllm(self) -> dict:
        """The JSON vLLM's --speculative-config takes (its MTP method name for Qwen3.5 is "mtp")."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "ngram":
            out.update(prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)
        return out
