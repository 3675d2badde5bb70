"""The middle end: AST -> typed IR -> simplified IR plus analyses (never imports torch).

Stages, in order (see ``pipeline``): imports, lower (names, types, checks), verify,
simplify (SymPy), hoisting levels, affine-score detection, mask analysis.
"""
