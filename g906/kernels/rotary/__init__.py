"""Partial NeoX-style rotary embedding, in place on q and k."""
