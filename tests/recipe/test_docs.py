"""docs/recipes.md carries the reference generated from the schema, byte for byte."""

from __future__ import annotations

from g906.recipe.docs import BEGIN, END, render_reference, splice

from .helpers import REPO


def test_reference_is_up_to_date():
    current = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert BEGIN in current and END in current
    assert splice(current, render_reference()) == current, "run: python -m g906.recipe.docs"


def test_reference_covers_every_key():
    text = render_reference()
    for key in ("source", "mmproj", "tensor_parallel_size", "devices", "max_model_len", "gpu_memory_utilization",
                "image", "video", "kind", "reasoning_parser", "block_size", "extra_args", "host", "port",
                "api_key_env"):
        assert f"| `{key}` |" in text, key
    for section in ("[model]", "[parallel]", "[limits]", "[multimodal]", "[engine]", "[engine.embedded]",
                    "[engine.vllm]", "[server]", "[env]"):
        assert f"### `{section}`" in text
