"""specdec: training-free, lossless speculative decoding for Hugging Face causal LMs."""

__version__ = "0.1.0"
