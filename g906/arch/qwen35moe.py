"""Qwen3.5 / Qwen3.6 MoE (35B-A3B family): the qwen35 hybrid stack with a sparse MoE MLP (router
softmax over experts, top-k, renormalised; plus a shared expert gated by sigmoid). Known to the
recipe resolver, the doctor and the vLLM hand-off; the embedded engine does not run it yet
(model_class None), so a recipe for it must use engine.kind = "vllm"."""

from __future__ import annotations

from g906.arch.spec import Architecture

ARCH = Architecture(
    name="qwen35moe",
    description="Qwen3.5 / Qwen3.6 MoE (hybrid stack, sparse MoE MLP)",
    hf_names=("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
    gguf_names=("qwen35moe",),
    multimodal=True,
    moe=True,
    reasoning_parser="qwen3",
    tool_parser="qwen3_coder",
)
