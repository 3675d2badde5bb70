"""The back end: IR -> text (CUDA functor, module sources, host harness, PyTorch reference),
one Jinja template per generated artefact in ``templates/``."""
