"""Building and loading modules: the toolchain, the build and compiled-variant caches, the JIT
(nvcc over generated sources, run without a shell), ahead-of-time builds (``attnc build``) and
the registry of loaded, ABI-checked modules."""
