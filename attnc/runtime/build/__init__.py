"""Building and loading modules: the toolchain, the build and compiled-variant caches, the JIT
(ninja over generated sources) and the registry of loaded, ABI-checked modules."""
