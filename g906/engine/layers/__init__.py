"""Model building blocks (embedding, linear, norms, rotary, attention, Gated DeltaNet, MLP).

Every layer keeps its weights as plain tensors (or QuantizedTensor) set by the model's
load_weights, and computes through g906.engine.layers.ops (PyTorch references with the
signatures of g906.kernels.ops)."""
