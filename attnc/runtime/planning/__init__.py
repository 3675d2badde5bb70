"""What ``plan()`` computes on the CPU once per step: the prefill plan through the C++ planner
of ``attnc/kernels/host/`` (``prefill_plan`` holds it, ``prefill_planner`` binds it,
``prefill_plan_library`` builds and loads it), the decode schedule through the C++ planner of
the same folder (``decode_plan`` binds it, ``decode_plan_library`` builds and loads it),
workspace layouts (``workspace``), tile maps (``tile_map``) and mask KV ranges
(``mask_ranges``)."""
