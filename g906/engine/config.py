"""The engine's view of a model's configuration: ModelConfig lives in g906.arch (torch-free, shared
with the recipe resolver and the doctor); the engine imports it from here."""

from g906.arch.config import ModelConfig, read_json_object

__all__ = ["ModelConfig", "read_json_object"]
