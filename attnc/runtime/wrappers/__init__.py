"""The user-facing calls: the batch prefill and decode wrappers (``plan()`` once per step,
``run()`` per layer), single-request prefill, ``merge_state`` and their torch custom ops."""
