"""Paged attention: decode (split-K over the sequence) and causal varlen prefill."""
