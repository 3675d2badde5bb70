"""What ``plan()`` computes on the CPU once per step: the prefill schedule (``prefill_schedule``,
``prefill_plan``), the decode schedule through the C++ planner of ``attnc/kernels/host/``
(``decode_plan`` binds it, ``decode_plan_library`` builds and loads it), workspace layouts
(``workspace``) and mask KV ranges (``mask_ranges``)."""
