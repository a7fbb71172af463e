"""g906.kernels: Triton kernels for the hot path, each beside its PyTorch reference.

Installed as g906.kernels (never as a bare top-level `kernels` module)."""
