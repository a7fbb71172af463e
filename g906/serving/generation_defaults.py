"""The server's default max_tokens for a chat request that sets none: the recipe's
limits.default_max_tokens, else (as vLLM does) the max_new_tokens of a Hugging Face model's
generation_config.json, else none (the rest of the context; GGUF files carry no such default)."""

from __future__ import annotations

import json
import logging

from g906.errors import G906Error

log = logging.getLogger("g906.serving")


def default_max_tokens(plan) -> int | None:
    """None: up to the context."""
    if plan.default_max_tokens == "context":
        return None
    if plan.default_max_tokens is not None:
        return int(plan.default_max_tokens)
    if plan.model_format != "hf" or plan.model_path is None:
        return None
    path = plan.model_path / "generation_config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise G906Error(f"{path}: cannot read the generation config: {exc}",
                        hint="fix the file, or set limits.default_max_tokens in the recipe") from None
    n = cfg.get("max_new_tokens") if isinstance(cfg, dict) else None
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise G906Error(f"{path}: max_new_tokens must be a positive integer, not {n!r}",
                        hint="fix the file, or set limits.default_max_tokens in the recipe")
    log.info("chat requests without max_tokens generate at most %d tokens (%s max_new_tokens; "
             "limits.default_max_tokens overrides it)", n, path.name)
    return n
