"""Row-wise argmax of the logits (greedy sampling), inside the decode graphs."""
