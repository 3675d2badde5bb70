"""Text -> running ops, by stage.

- ``build/``: the toolchain (nvcc, flags), the on-disk build cache, JIT building and
  the registry of loaded modules, and the compiled-variant cache.
- ``planning/``: what ``plan()`` computes on the CPU: the prefill and decode schedules, the
  workspace layouts and the KV ranges a mask allows.
- ``checks/``: every check of the arguments users pass (tensors, index tensors, params), with
  their messages.
- ``wrappers/``: the user-facing calls: ``BatchPrefillWrapper``, ``BatchDecodeWrapper``,
  ``merge_state`` and the torch custom ops behind them.
- ``abi``: the ctypes mirrors of the modules' C ABI; ``variant``: the handle ``attnc.load``
  returns; ``reference``: the eager reference attention.
"""
