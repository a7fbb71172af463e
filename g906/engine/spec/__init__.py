"""Speculative decoding: proposers (the model's own MTP head, n-gram prompt lookup) draft k
tokens per sequence; the target verifies them in one step of k+1 positions per sequence and
keeps the longest prefix its own sampling agrees with (rejection sampling for sampled rows), so
outputs follow the target's distribution exactly. See docs/engine.md, "Speculative decoding"."""

from g906.arch.speculative import MTP_METHODS, SpeculativeConfig  # noqa: F401
