"""Gated delta rule (Gated DeltaNet linear attention): recurrent decode step, chunked prefill."""
