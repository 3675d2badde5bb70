"""Clients of attnc: adapters that let other libraries run their attention through it.

Owns: nothing but the package. ``import attnc.integrations.transformers`` registers the
``"attnc"`` attention implementation with Hugging Face transformers (see ``docs/clients.md``).
Nothing here is imported by ``import attnc``.
"""
