"""KV-cache write through a slot mapping into paged blocks."""
