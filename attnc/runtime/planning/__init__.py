"""What ``plan()`` computes on the CPU once per step: prefill and decode schedules (work lists
heaviest first, split-KV chunks, merge lists), workspace layouts and mask KV ranges."""
