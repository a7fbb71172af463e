"""Token embedding over a GGUF-quantized table: the step's rows dequantized in one kernel."""
