"""Text -> running ops: JIT build cache, ctypes modules, prefill and decode wrappers, the
decode scheduler, the eager reference and the test runners behind ``attnc test``."""
