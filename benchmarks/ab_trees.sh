#!/bin/bash
# A/B of source trees in one GPU call: runs `python -m MODULE ARGS...` in each tree with its
# own JIT cache (ATTNC_CACHE_DIR=/tmp/attnc-ab-<tree>), so the kernels and the runtime are each
# tree's own while the card, clocks and inputs are shared. Make the trees with
# `git archive <commit> | tar -x -C <dir>` and copy the same benchmark script into each.
#   usage: benchmarks/ab_trees.sh "MODULE ARGS..." TREE [TREE...]
#   e.g.:  benchmarks/ab_trees.sh "benchmarks.decode_quick causal" .snap_old .snap_new .snap_old
# Before running anything it checks that every TREE is a directory holding attnc/ and that
# python3 imports attnc's own dependencies (lark, jinja2, sympy: on a GPU machine without
# them, install the carried wheels first), so a call fails at once instead of once per tree.
set -u
if [ $# -lt 2 ] || [ -z "$1" ]; then
  echo 'usage: benchmarks/ab_trees.sh "MODULE ARGS..." TREE [TREE...]' >&2
  exit 2
fi
cmd=$1
shift
for tree in "$@"; do
  if [ ! -d "$tree/attnc" ]; then
    printf 'ab_trees.sh: TREE %q is not a directory holding attnc/\n' "$tree" >&2
    exit 2
  fi
done
if ! missing=$(python3 -c "
names = []
for name in ('lark', 'jinja2', 'sympy'):
    try:
        __import__(name)
    except ImportError:
        names.append(name)
print(' '.join(names))
raise SystemExit(1 if names else 0)" 2>&1); then
  echo "ab_trees.sh: python3 cannot import ${missing:-the dependencies} (install the carried wheels first, e.g. python3 -m pip install --no-deps --no-index --target /tmp/site .whl/*.whl, and put /tmp/site on PYTHONPATH; without --no-deps pip looks for pytest-xdist's pytest among the wheels and installs nothing)" >&2
  exit 2
fi
for tree in "$@"; do
  echo "=== $tree $(date +%T)"
  (cd "$tree" && ATTNC_CACHE_DIR="/tmp/attnc-ab-$(basename "$tree")" \
     PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" python3 -m $cmd 2>&1 | grep --line-buffered -v "Warning")
done
