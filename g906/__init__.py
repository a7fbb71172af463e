"""g906: serve Qwen3.5-family LLMs on AMD gfx906 GPUs with one checked command.

The offline API (`LLM`, `SamplingParams`) is imported lazily so that
`g906 doctor`, `g906 validate` and `g906 rccl` work where torch is missing.
"""

from g906.version import __version__

__all__ = ["BeamSearchParams", "LLM", "SamplingParams", "StructuredOutputsParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from g906.engine.llm import LLM

        return LLM
    if name == "BeamSearchParams":
        from g906.engine.llm import BeamSearchParams

        return BeamSearchParams
    if name == "SamplingParams":
        from g906.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from g906.engine.structured import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(f"module 'g906' has no attribute {name!r}")
