"""Located diagnostics: the one error type of the front and middle end.

Every error the compiler reports names ``file:line:col``, shows the source line and a caret.
"""

from __future__ import annotations

import threading
import unicodedata
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field


def printable(text: str) -> str:
    """``text`` with every non-printable character written as its escape (``\\x1b``,
    ``\\n``), so that a message quoting user text (a path, a name, a value) cannot drive the
    terminal it is printed on. Printable non-ASCII text stays as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: 2 for a wide or full-width character (CJK, most
    emoji), 0 for a combining mark, 1 for any other (so a caret lines up under the character
    it points at whatever script the line is written in)."""
    if text.isascii():
        return len(text)
    return sum(_char_width(c) for c in text)


def _char_width(c: str) -> int:
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


@dataclass(frozen=True)
class Loc:
    """A position in a source file (1-based line and column)."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{printable(self.file)}:{self.line}:{self.col}"


NO_LOC = Loc("<builtin>", 0, 0)

EXCERPT_CONTEXT = 100
"""Characters of a source line quoted on each side of a diagnostic's caret; a longer line is
cut, ``...`` marking each cut (a minified 200 KB line prints a few hundred characters)."""


@dataclass(frozen=True)
class Diagnostic:
    """One message tied to a location; ``severity`` is ``error``, ``warning`` or ``note``."""

    loc: Loc
    message: str
    severity: str = "error"
    source_line: str | None = field(default=None, compare=False)

    def render(self) -> str:
        """``file:line:col: severity: message`` followed by the source line and a caret (user
        text in any of them printed with its control characters escaped)."""
        head = f"{self.loc}: {self.severity}: {printable(self.message)}"
        if self.source_line is None or self.loc.line <= 0:
            return head
        line = self.source_line.rstrip("\n").expandtabs(1)
        start = max(self.loc.col, 1) - 1
        end = start + 1
        if self.loc.end_line == self.loc.line and self.loc.end_col > self.loc.col:
            end = self.loc.end_col - 1
        return f"{head}\n{_excerpt(line, start, end)}"


def _excerpt(line: str, start: int, end: int) -> str:
    """``line`` cut to :data:`EXCERPT_CONTEXT` characters on each side of index ``start``
    (``...`` where it was cut), and under it a caret at ``start`` with ``~`` up to ``end``."""
    left = max(min(start, len(line)) - EXCERPT_CONTEXT, 0)
    right = min(start + 1 + EXCERPT_CONTEXT, len(line))
    before = "..." if left > 0 else ""
    after = "..." if right < len(line) else ""
    end = min(end, max(right, start + 1))
    # Columns count characters of the line; the caret counts terminal columns as printed.
    pad = len(before) + display_width(printable(line[left:start])) + max(start - len(line), 0)
    width = max(display_width(printable(line[start:end])), 1)
    quoted = f"{before}{printable(line[left:right])}{after}"
    return f"    {quoted}\n    {' ' * pad}^{'~' * (width - 1)}"


# Files whose text each thread keeps for quoting (a long-lived process kept every one), besides
# those a live parsed module holds (see SourceMap.tie).
SOURCE_FILES_KEPT = 256


class SourceText:
    """One file's source lines, split at ``\\n`` only (as the lexer counts)."""

    __slots__ = ("lines", "__weakref__")

    def __init__(self, text: str) -> None:
        self.lines = [line.removesuffix("\r") for line in text.split("\n")]


class SourceMap:
    """Source text of the files seen, so diagnostics can quote their line.

    Each thread has a map of its own: a diagnostic takes its line when it is made, in the
    thread that parses and compiles the text, so another thread loading other text under the
    same name (every inline source is ``<string>``) never changes the line it quotes.

    A thread keeps the text of its :data:`SOURCE_FILES_KEPT` most recent files, and of any
    file whose parsed module is still alive (:meth:`tie`): a compilation importing more files
    than that still quotes every one of them, and a long-lived process keeps no more.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _recent(self) -> dict[str, SourceText]:
        """The calling thread's most recent files, by name (the oldest first)."""
        recent: dict[str, SourceText] | None = getattr(self._local, "recent", None)
        if recent is None:
            recent = self._local.recent = {}
        return recent

    def _texts(self) -> weakref.WeakValueDictionary[str, SourceText]:
        """The calling thread's text of every file still held (recent or tied), by name."""
        texts: weakref.WeakValueDictionary[str, SourceText] | None
        texts = getattr(self._local, "texts", None)
        if texts is None:
            texts = self._local.texts = weakref.WeakValueDictionary()
        return texts

    def add(self, file: str, text: str) -> None:
        """Remember ``text`` under ``file`` for this thread, as its most recent file (the
        oldest of more than ``SOURCE_FILES_KEPT`` is forgotten unless a module holds it)."""
        held = SourceText(text)
        self._texts()[file] = held
        recent = self._recent()
        recent.pop(file, None)
        recent[file] = held
        while len(recent) > SOURCE_FILES_KEPT:
            del recent[next(iter(recent))]

    def tie(self, file: str, owner: object) -> None:
        """Keep this thread's text of ``file`` while ``owner`` (the module parsed from it)
        lives, however many files are added meanwhile: lowering quotes a file's lines after
        every file it imports has been parsed."""
        held = self._texts().get(file)
        if held is not None:
            object.__setattr__(owner, "_source_text", held)

    def forget(self, file: str) -> None:
        """Drop this thread's text of ``file`` (its lines will not be quoted)."""
        self._recent().pop(file, None)
        self._texts().pop(file, None)

    def line(self, loc: Loc) -> str | None:
        """The source line ``loc`` points at, or None when this thread holds no text of its
        file or the file has no such line."""
        held = self._texts().get(loc.file)
        if held is None or not 1 <= loc.line <= len(held.lines):
            return None
        return held.lines[loc.line - 1]


SOURCES = SourceMap()


class AttnError(Exception):
    """A located error in a `.attn` program. ``str()`` gives the rendered diagnostic(s)."""

    def __init__(self, loc: Loc, message: str, notes: tuple[Diagnostic, ...] = ()) -> None:
        self.diagnostic = Diagnostic(loc, message, "error", SOURCES.line(loc))
        self.notes = notes
        super().__init__(self.render())

    def __reduce__(self) -> tuple[Callable[..., AttnError], tuple[object, ...], dict[str, object]]:
        # Pickled as its diagnostics, so that it crosses processes (a worker pool's error)
        # with its quoted lines, which the receiving process's source map does not hold; the
        # rest of its state (``add_note``'s notes, attributes set on it) as an exception's.
        state = {k: v for k, v in self.__dict__.items() if k not in ("diagnostic", "notes")}
        return _rebuilt_attn_error, (type(self), self.diagnostic, self.notes), state

    @property
    def loc(self) -> Loc:
        """Where the error is: file, line and column span."""
        return self.diagnostic.loc

    @property
    def message(self) -> str:
        """The error in plain words, without the location or the quoted line."""
        return self.diagnostic.message

    def render(self) -> str:
        """The error's diagnostic, then its notes, each with its source line and caret."""
        parts = [self.diagnostic.render()]
        parts.extend(note.render() for note in self.notes)
        return "\n".join(parts)


def _rebuilt_attn_error(
    cls: type[AttnError], diagnostic: Diagnostic, notes: tuple[Diagnostic, ...]
) -> AttnError:
    """An unpickled ``AttnError``: its diagnostics as they were rendered where it was raised."""
    error = cls.__new__(cls)
    error.diagnostic, error.notes = diagnostic, notes
    Exception.__init__(error, error.render())
    return error


def warning(loc: Loc, message: str) -> Diagnostic:
    """A located warning (returned by passes, printed by the CLI)."""
    return Diagnostic(loc, message, "warning", SOURCES.line(loc))


def note(loc: Loc, message: str) -> Diagnostic:
    """A located note that follows an error (a second place the error involves)."""
    return Diagnostic(loc, message, "note", SOURCES.line(loc))
