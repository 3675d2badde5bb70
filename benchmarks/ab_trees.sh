#!/bin/bash
# A/B of source trees in one GPU call: runs `python -m MODULE ARGS...` in each tree with its
# own JIT cache (ATTNC_CACHE_DIR=/tmp/attnc-ab-<tree>), so the kernels and the runtime are each
# tree's own while the card, clocks and inputs are shared. Make the trees with
# `git archive <commit> | tar -x -C <dir>` and copy the same benchmark script into each.
#   usage: benchmarks/ab_trees.sh "MODULE ARGS..." TREE [TREE...]
#   e.g.:  benchmarks/ab_trees.sh "benchmarks.decode_quick causal" .snap_old .snap_new .snap_old
set -u
cmd=$1
shift
for tree in "$@"; do
  echo "=== $tree $(date +%T)"
  (cd "$tree" && ATTNC_CACHE_DIR="/tmp/attnc-ab-$(basename "$tree")" \
     PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" python3 -m $cmd 2>&1 | grep --line-buffered -v "Warning")
done
