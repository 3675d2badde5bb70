"""A benchmark system whose output is a fixed tensor, for the harness's CPU tests."""

from __future__ import annotations


class FixedSystem:
    """A system whose output is a fixed tensor."""

    graph = False

    def __init__(self, name: str, out, is_attnc: bool = False):
        self.name, self.out, self.is_attnc = name, out, is_attnc

    def prepare(self, case, data):
        """The fixed output, as a prepared call."""
        from benchmarks.system import Prepared

        return Prepared(lambda: self.out)
