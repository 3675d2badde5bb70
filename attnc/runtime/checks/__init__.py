"""Checks of everything a user passes to the runtime: data and index tensors, KV caches and
variant params. Each problem is a ``ValueError`` that names the argument."""
