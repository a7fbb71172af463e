"""g906.kernels: Triton kernels for the hot path, each beside its PyTorch reference.

They live inside the g906 package on purpose: a top-level `kernels` folder or module would shadow
Hugging Face's `kernels` distribution, which transformers imports."""
