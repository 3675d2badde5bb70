"""Anchors measured in a child process: FA4 (``fa4``) and FlexAttention's FLASH backend
(``flex_flash``).

Owns: the parent side of the anchor-child protocol (``child_server.py`` describes it): where
FA4 is (``ATTNC_FA4_PYTHONPATH``, folders put first on the child's ``PYTHONPATH`` only, so
this process keeps FlashInfer's apache-tvm-ffi), starting one child for the whole run,
requests with a timeout, and the systems that stand for the child's anchors in a row. Every
failure (FA4 absent, child crash, timeout) becomes that anchor's cell; the suite goes on.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping

from benchmarks.outcome import Failed, Missing, Unsupported
from benchmarks.system import Prepared, System

FA4_PATH_ENV = "ATTNC_FA4_PYTHONPATH"
CHILD_SYSTEMS = ("fa4", "flex_flash")
START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 480.0
MIN_REQUEST_TIMEOUT_S = 60.0
MAX_STARTS = 2
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL_HINT = f"set {FA4_PATH_ENV} (benchmarks/README.md)"


def fa4_paths(env: Mapping[str, str] = os.environ) -> list[str]:
    """The folders of ``ATTNC_FA4_PYTHONPATH`` (``:``-separated), in order."""
    return [p for p in env.get(FA4_PATH_ENV, "").split(os.pathsep) if p]


def child_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The child's environment: FA4's folders, then the repository, then ``PYTHONPATH``."""
    out = dict(env)
    parts = [*fa4_paths(env), REPO_ROOT, *[p for p in env.get("PYTHONPATH", "").split(":") if p]]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    out["PYTHONUNBUFFERED"] = "1"
    return out


def fa4_absent(env: Mapping[str, str] = os.environ, search: list[str] | None = None) -> str:
    """'' if ``flash_attn/cute/interface.py`` is in FA4's folders or on ``sys.path`` (nothing
    is imported), else the reason."""
    folders = [*fa4_paths(env), *(sys.path if search is None else search)]
    for folder in folders:
        if os.path.isfile(os.path.join(folder or ".", "flash_attn", "cute", "interface.py")):
            return ""
    return f"flash-attn-4 not found; {INSTALL_HINT}"


def fa4_versions(env: Mapping[str, str] = os.environ) -> str:
    """flash-attn-4 and CuTe DSL versions from the dist-info folders in FA4's folders ('' if
    none; nothing is imported)."""
    found = {}
    for folder in fa4_paths(env):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            for dist in ("flash_attn_4-", "nvidia_cutlass_dsl-"):
                if name.startswith(dist) and name.endswith(".dist-info"):
                    found[dist[:-1]] = name[len(dist) : -len(".dist-info")]
    return ", ".join(f"{k} {v}" for k, v in sorted(found.items()))


def reply_from_line(line: str, prefix: str) -> dict | None:
    """The JSON reply a child's output line carries (after ``prefix``), else None."""
    at = line.find(prefix)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(prefix) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class AnchorChild:
    """One ``benchmarks.child_server`` process, restarted after a crash or timeout (at most
    ``MAX_STARTS`` starts in all)."""

    def __init__(self, env: Mapping[str, str] | None = None, cmd: list[str] | None = None):
        self.env = child_env(os.environ if env is None else env)
        self.cmd = cmd or [sys.executable, "-m", "benchmarks.child_server"]
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()
        self.ready = False
        self.missing = ""
        self.starts = 0
        self.last_failure = ""

    def start(self) -> None:
        """Start the child if none is running (it imports torch and FA4 while we go on)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.starts >= MAX_STARTS:
            raise Missing(f"anchor child failed {self.starts} times: {self.last_failure}")
        from benchmarks.child_server import REPLY_PREFIX

        self.prefix = REPLY_PREFIX
        self.starts += 1
        self.ready = False
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        stdout, lines = self.proc.stdout, self.lines
        threading.Thread(target=_pump, args=(stdout, lines), daemon=True).start()

    def _reply(self, timeout: float) -> dict:
        """The next reply line; kills the child on timeout or when it has exited."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                self.stop()
                self.last_failure = f"no answer within {timeout:.0f} s"
                raise TimeoutError(f"anchor child: {self.last_failure}") from None
            if line is None:
                code = self.proc.wait() if self.proc is not None else None
                self.proc = None
                self.last_failure = f"exited with code {code}"
                raise RuntimeError(f"anchor child {self.last_failure}")
            reply = reply_from_line(line, self.prefix)
            if reply is not None:
                return reply

    def request(self, payload: dict, timeout: float) -> dict:
        """Send one request and wait for its reply (starting the child when needed)."""
        if self.missing:
            raise Missing(self.missing)
        self.start()
        if not self.ready:
            hello = self._reply(START_TIMEOUT_S)
            self.ready = True
            self.missing = str(hello.get("missing", ""))
            if self.missing:
                self.stop()
                raise Missing(self.missing)
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.stop()
            self.last_failure = f"stdin closed ({type(exc).__name__})"
            raise RuntimeError(f"anchor child: {self.last_failure}") from exc
        return self._reply(timeout)

    def stop(self) -> None:
        """End the child (it was started here), politely first."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait()


def _pump(stream, lines: queue.Queue) -> None:
    """Copy the child's stdout lines into ``lines``; None at its end."""
    for line in stream:
        lines.put(line)
    lines.put(None)


_CHILD: list[AnchorChild] = []


def anchor_child() -> AnchorChild:
    """The run's anchor child (made once; stopped at exit)."""
    if not _CHILD:
        _CHILD.append(AnchorChild())
        atexit.register(_CHILD[0].stop)
    return _CHILD[0]


def shut_down() -> None:
    """Stop the run's anchor child, if one was started (at the end of the prefill suite)."""
    for child in _CHILD:
        child.stop()


def warm_up() -> None:
    """Start the child now, so its imports overlap the rows before FA4's first one."""
    if fa4_absent():
        return
    try:
        anchor_child().start()
    except Exception:
        pass  # the first request reports it


def check_expressible(name: str, case) -> None:
    """Raise Unsupported when the child's anchor cannot express the row (no child needed)."""
    if name == "fa4":
        from benchmarks.fa4_anchor import fa4_call

        fa4_call(case)
    else:
        from benchmarks.flex_anchor import flash_backend_call

        flash_backend_call(case)


class ChildPrefill(System):
    """A prefill anchor measured by the child; its output comes back for the cross-check."""

    timed_elsewhere = True

    def __init__(
        self,
        name: str,
        rep: int,
        time_left: Callable[[], float | None] | None = None,
        autotune: bool = False,
    ):
        if name not in CHILD_SYSTEMS:
            raise ValueError(f"not a child anchor: {name}")
        self.name = name
        self.rep = rep
        self.time_left = time_left
        self.autotune = autotune

    def timeout(self) -> float:
        """Seconds to wait for one reply: the suite's time left plus a margin, bounded."""
        left = self.time_left() if self.time_left is not None else None
        if left is None:
            return REQUEST_TIMEOUT_S
        return max(MIN_REQUEST_TIMEOUT_S, min(REQUEST_TIMEOUT_S, left + 30.0))

    def prepare(self, case, data) -> Prepared:
        """Ask the child to measure the row; load its output for the cross-check. The
        Prepared's ``retime`` asks the child to time the kept row again (a timing round)."""
        import torch

        from benchmarks.child_server import case_to_dict

        check_expressible(self.name, case)
        absent = fa4_absent()
        if absent:
            raise Missing(absent)
        fd, path = tempfile.mkstemp(prefix=f"{self.name}_", suffix=".pt")
        os.close(fd)
        try:
            payload = {
                "system": self.name,
                "case": case_to_dict(case),
                "rep": self.rep,
                "out": path,
                "autotune": self.autotune,
            }
            reply = self._ask(payload)
            out = torch.load(path, map_location="cuda")
        finally:
            os.remove(path)
        retime_payload = {k: v for k, v in payload.items() if k != "out"}
        retime_payload["retime"] = True

        def retime() -> tuple[float, str]:
            again = self._ask(retime_payload)
            return float(again["ms"]), str(again.get("timing_note", ""))

        compare = bool(reply.get("compare", True))
        return Prepared(
            lambda: out,
            note=str(reply.get("note", "")),
            timed_ms=float(reply["ms"]),
            compare=compare,
            retime=retime,
        )

    def _ask(self, payload: dict) -> dict:
        """The child's reply to one request; a status other than ok raises its cell."""
        reply = anchor_child().request(payload, self.timeout())
        status, note = reply.get("status"), str(reply.get("note", ""))
        if status == "n/a":
            raise Unsupported(note)
        if status == "missing":
            raise Missing(note)
        if status != "ok":
            raise Failed(note or f"child status {status}")
        return reply
