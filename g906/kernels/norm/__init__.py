"""RMSNorm (plain / zero-centred, residual add fused) and gated RMSNorm."""
