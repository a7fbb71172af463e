"""Model-file loaders: safetensors (Hugging Face directories) and GGUF."""
