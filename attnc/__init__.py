"""attnc: a compiler and runtime for LLM attention variants."""

__version__ = "0.1.0"
