"""evalsuite: long-context evaluation for efficient-attention language models."""

__version__ = "0.1.0"
