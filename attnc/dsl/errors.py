"""Located diagnostics: the one error type of the front and middle end.

Every error the compiler reports names ``file:line:col``, shows the source line and a caret.
"""

from __future__ import annotations

import re
import threading
import unicodedata
import weakref
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from attnc.dsl.limits import MAX_SOURCE_BYTES


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


# Files whose text each thread keeps for quoting a location that carries no text of its own
# (see SourceMap): a long-lived process kept every one.
SOURCE_FILES_KEPT = 256


class SourceText:
    """One file's source text, quoted by line: lines are split at ``\\n`` only (as the
    lexer counts). The offsets where lines start are found once, when a line is first asked
    for, and kept as an array of 4 bytes a line (:func:`line_starts`; a list of every line
    cost about twenty times the text; finding the line anew for each quote cost a scan of the
    text per diagnostic)."""

    __slots__ = ("text", "_starts", "__weakref__")

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts: array[int] | None = None

    def __reduce__(self) -> tuple[type[SourceText], tuple[str]]:
        return SourceText, ("",)  # a pickle holds no source text (a module pickles without)

    def __copy__(self) -> SourceText:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> SourceText:
        return self  # a copy of a module holds its text, which its locations refer to

    def line(self, number: int) -> str | None:
        """Line ``number`` (1-based), or None when the text has no such line."""
        starts = self._starts
        if starts is None:  # two threads may both find them: either array is the same
            starts = self._starts = line_starts(self.text)
        if not 1 <= number <= len(starts):
            return None
        start = starts[number - 1]
        end = starts[number] - 1 if number < len(starts) else len(self.text)
        return self.text[start:end].removesuffix("\r")


_LINE_FEED = re.compile("\n")
# Longest text whose line offsets fit 4 bytes each: every file read is at most
# MAX_SOURCE_BYTES (16 MiB, so as many characters at most); a longer inline text takes 8.
U32_OFFSETS = 2**32 - 1
assert MAX_SOURCE_BYTES <= U32_OFFSETS


def line_starts(text: str) -> array[int]:
    """The offset in ``text`` where each of its lines starts (0, then one past each ``\\n``),
    found in one pass: unsigned 32-bit offsets (``"I"``, 4 bytes each), 64-bit ones for a
    text longer than :data:`U32_OFFSETS` characters."""
    starts = array("I" if len(text) <= U32_OFFSETS else "q", [0])
    starts.extend(found.end() for found in _LINE_FEED.finditer(text))
    return starts


class SourceName(str):
    """A file name that refers to the text parsed under it: the name every location of a
    parsed module holds, so that a diagnostic quotes the text its location came from, in any
    thread and whatever was parsed under the same name since (every inline source is
    ``<string>``).

    The reference is weak: what the parser returns holds the text (``parser.parse_module``,
    ``parser.parse_expr``), and so does a loaded variant (``attnc.load``), so IR kept in a
    cache after them keeps no text alive; a location whose text is gone is quoted as one
    without (see :class:`SourceMap`), until the same text is added again for IR served from a
    cache (:meth:`SourceMap.add_parsed`).

    As a string it is the plain name: equal to it, hashed, printed and written to JSON as it
    is, and pickled as a plain ``str`` (a pickle holds no text); a copy is the name itself.
    """

    _source: weakref.ref[SourceText]

    def __new__(cls, name: str, source: SourceText) -> SourceName:
        """``name`` referring to ``source``."""
        made = super().__new__(cls, name)
        made._source = weakref.ref(source)
        return made

    @property
    def source(self) -> SourceText | None:
        """The text parsed under this name, or None once nothing holds it."""
        return self._source()

    def refer_to(self, source: SourceText) -> None:
        """Refer to ``source`` from now on: the text parsed under this name again, once the
        text it was parsed from is gone."""
        self._source = weakref.ref(source)

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return str, (str(self),)

    def __copy__(self) -> SourceName:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> SourceName:
        return self


class SourceMap:
    """Source text of the files seen, so diagnostics can quote their line.

    A location in a parsed module names its file by a :class:`SourceName`, which refers to
    the text it was parsed from while something holds it (the module, a loaded variant, this
    map): that text is quoted, or none once it is gone rather than another text of the same
    name. Any other location (IR read from the disk cache, one made by hand) is quoted from
    the text its calling thread most recently added under the location's file name: each
    thread has a map of its own, so another thread loading other text under the same name
    never changes the line it quotes. A thread keeps the text of its
    :data:`SOURCE_FILES_KEPT` most recent files (a long-lived process kept every one); a
    parsed module or a loaded variant keeps its own text however many files are added
    meanwhile.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _recent(self) -> dict[str, SourceText]:
        """The calling thread's most recent files, by name (the oldest first)."""
        recent: dict[str, SourceText] | None = getattr(self._local, "recent", None)
        if recent is None:
            recent = self._local.recent = {}
        return recent

    def add(self, file: str, text: str) -> SourceText:
        """Remember ``text`` under ``file`` for this thread, as its most recent file (the
        oldest of more than ``SOURCE_FILES_KEPT`` is forgotten); returns it as lines."""
        held = SourceText(text)
        self._keep(str(file), held)
        return held

    def add_parsed(self, name: str, text: str) -> SourceText:
        """``add`` for ``text`` served again as IR parsed from it under ``name`` (from a
        cache): when ``name`` is a :class:`SourceName`, the text it refers to is kept and
        returned, or, once that is gone, ``text``, which the name then refers to (its
        locations quote their lines again)."""
        held = name.source if isinstance(name, SourceName) else None
        if held is None:
            held = SourceText(text)
            if isinstance(name, SourceName):
                name.refer_to(held)
        self._keep(str(name), held)
        return held

    def _keep(self, file: str, held: SourceText) -> None:
        """``held`` as this thread's most recent file, the oldest beyond the limit forgotten."""
        recent = self._recent()
        recent.pop(file, None)
        recent[file] = held
        while len(recent) > SOURCE_FILES_KEPT:
            del recent[next(iter(recent))]

    def forget(self, file: str) -> None:
        """Drop this thread's text of ``file`` (a location without text of its own will not
        quote it)."""
        self._recent().pop(file, None)

    def line(self, loc: Loc) -> str | None:
        """The source line ``loc`` points at: from the text its file name refers to (None once
        that text is gone), else from this thread's text of its file; None when there is no
        text or it has no such line."""
        if isinstance(loc.file, SourceName):  # its text, or none: the map's is another one
            held = loc.file.source
        else:
            held = self._recent().get(loc.file)
        return None if held is None else held.line(loc.line)


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
