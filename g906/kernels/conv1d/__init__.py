"""Causal depthwise conv1d + SiLU (linear attention): varlen prefill and one-step decode."""
