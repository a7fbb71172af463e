"""What each supported architecture is, torch-free: config mapping (HF config.json and GGUF
metadata -> ModelConfig), GGUF <-> HF tensor names and shapes, per-layer kinds, the counts tensor
parallelism splits, KV-cache and recurrent-state bytes, and the quantization capability table.

The loaders, tensor parallelism, the recipe resolver and the doctor all read it; the engine maps
an architecture to its model class by the string each module names. To add an architecture,
write g906/arch/<name>.py (one Architecture) and list it in registry.ARCHITECTURES.
"""

from g906.arch.config import ModelConfig
from g906.arch.hybrid import HybridShape
from g906.arch.registry import (ARCHITECTURES, config_from_gguf, config_from_hf, config_from_hf_dir, embedded,
                                for_config, for_engine, known_names, lookup)
from g906.arch.spec import Architecture, TPCount

__all__ = ["ARCHITECTURES", "Architecture", "HybridShape", "ModelConfig", "TPCount", "config_from_gguf",
           "config_from_hf", "config_from_hf_dir", "embedded", "for_config", "for_engine", "known_names", "lookup"]
