"""The verbs behind ``attnc test``: the generated functor in a host harness against the
reference (no GPU), and the kernels against the float64 reference (GPU)."""
