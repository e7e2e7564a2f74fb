"""Reading the files the project is given: bounded, and never waiting.

Every file a command reads (a workload's trace, nccl-tests JSON, results.csv,
samples.jsonl, runs.jsonl) comes through here, so one set of checks holds for
all of them:

- it is a regular file: a FIFO would wait for a writer forever, ``/dev/zero``
  would fill the memory, a directory cannot be read (opened without blocking,
  then checked on the open file, so a FIFO is refused without waiting);
- it is at most ``limit`` bytes, on disk and as read (a file that grows while
  it is read stops at the limit);
- text is UTF-8, a byte-order mark (a spreadsheet's CSV export) read past;
- JSON is nested at most :data:`JSON_DEPTH_MAX` deep and its numbers have at
  most :data:`NUMBER_DIGITS_MAX` digits (Python's parser recurses, and turns a
  400-digit number into an int it cannot convert to a float);
- an integer field is ASCII digits within a range (``int()`` accepts ``'²'``
  spelled otherwise, and refuses over 4300 digits with a traceback).

Errors are the caller's own one-line error type (``error=``), naming the file
with the caller's ``label``; :func:`cut` bounds any text quoted in a message.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import re
import stat
from collections.abc import Iterator

class BadInputFile(ValueError):
    """A file that cannot be read as an input (the default ``error``); one line."""


JSON_DEPTH_MAX = 64
NUMBER_DIGITS_MAX = 40  # far past any size, time or count a file of ours holds
MESSAGE_CHARS_MAX = 120  # a quoted value in an error message
ERROR_CHARS_MAX = 1000  # a whole error line


def cut(value: object, limit: int = MESSAGE_CHARS_MAX) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the whole length stated."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def error_line(message: object, limit: int = ERROR_CHARS_MAX) -> str:
    """An error message as the one line a command prints: line breaks folded,
    cut to about ``limit`` characters with the whole length stated (a value
    quoted from a file can be megabytes long)."""
    text = " ".join(str(message).splitlines())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def open_binary(path: str | os.PathLike[str], label: str, limit: int, error: type[Exception]) -> io.BufferedReader:
    """``path`` opened for reading, checked to be a regular file of at most
    ``limit`` bytes; reads past ``limit`` raise ``error``. Raises ``error``
    (one line, ``label: why``) otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{label}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            target = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
            raise error(f"{label}{target}: is {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise error(f"{label}: {st.st_size} bytes, over the {mib(limit)} this file may hold")
        os.set_blocking(fd, True)
        raw = _Bounded(io.FileIO(fd, "rb", closefd=True), label, limit, error)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(raw)


class _Bounded(io.RawIOBase):
    """A raw file that raises once more than ``limit`` bytes were read."""

    def __init__(self, raw: io.FileIO, label: str, limit: int, error: type[Exception]) -> None:
        self._raw, self._label, self._limit, self._error, self._read = raw, label, limit, error, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def readinto(self, b) -> int:
        n = self._raw.readinto(b)
        self._read += n or 0
        if self._read > self._limit:
            raise self._error(f"{self._label}: grew past the {mib(self._limit)} this file may hold while read")
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def lines(f: io.BufferedReader, label: str, limit: int, error: type[Exception]) -> Iterator[bytes]:
    """The lines of an open file, each with its newline (the last may have
    none); ``error`` (one line, with the file's size) for a line longer than
    ``limit``, read no further than that."""
    for n, line in enumerate(iter(lambda: f.readline(limit + 1), b""), start=1):
        if len(line) > limit and not line.endswith(b"\n"):
            raise error(f"{label}: line {n} is longer than {mib(limit)} (the file is {os.fstat(f.fileno()).st_size} "
                        "bytes): not a line this project writes")
        yield line


def read_bytes(path: str | os.PathLike[str], label: str, limit: int, error: type[Exception]) -> bytes:
    """The whole file, checked as :func:`open_binary` does."""
    with open_binary(path, label, limit, error) as f:
        return f.read()


# Byte-order marks of the encodings a spreadsheet may save a CSV in, longest first (UTF-32's starts as UTF-16's).
_OTHER_BOMS: tuple[tuple[bytes, str], ...] = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                                              (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def open_text(path: str | os.PathLike[str], label: str, limit: int, error: type[Exception]) -> io.TextIOWrapper:
    """A checked file as UTF-8 text (a byte-order mark skipped, newlines kept
    as written, for the csv module); a byte that is not UTF-8 raises
    ``UnicodeDecodeError`` as it is read; a file that starts with another
    encoding's byte-order mark (UTF-16, UTF-32) is ``error``, naming it."""
    f = open_binary(path, label, limit, error)
    try:
        refuse_other_encoding(f, label, error)
    except BaseException:
        f.close()
        raise
    return io.TextIOWrapper(f, encoding="utf-8-sig", newline="")


def refuse_other_encoding(f: io.BufferedReader, label: str, error: type[Exception]) -> None:
    """``error`` (one line, naming the encoding) for a file that starts with a
    UTF-16 or UTF-32 byte-order mark (a spreadsheet's "Unicode text"): read as
    UTF-8 its every other byte is NUL, and its header names no column."""
    head = f.peek(4)[:4]
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise error(f"{label}: is {name} text (its first bytes are {name}'s byte-order mark, {bom.hex(' ')}): "
                        "these files are UTF-8; save it as UTF-8")


def read_text(path: str | os.PathLike[str], label: str, limit: int, error: type[Exception],
              errors: str = "strict") -> str:
    """The whole file as UTF-8 text (a byte-order mark skipped); ``error``
    for bytes that are not UTF-8 unless ``errors="replace"``."""
    data = read_bytes(path, label, limit, error)
    try:
        return data.decode("utf-8-sig", errors)
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not UTF-8 text (byte {exc.start})") from None


def no_yaml_aliases(text: str, label: str, error: type[Exception]) -> str:
    """``text``, or ``error`` (one line) where it uses a YAML alias (``*name``):
    a kilobyte of aliases to aliases expands to billions of values when the
    file is loaded, and an input file of this project needs none. Read as
    YAML's event stream, which names an alias without expanding it."""
    import yaml

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                raise error(f"{label}: a YAML alias (*{event.anchor}, line {mark.line + 1}): an input file of "
                            "this project takes plain values (aliases can expand without bound)")
    except yaml.YAMLError as exc:
        raise error(f"{label}: not YAML: {' '.join(str(exc).split())[:200]}") from None
    return text


_DIGITS = re.compile(r"[0-9]+")


def parse_int(text: str, lo: int, hi: int) -> int | None:
    """``text`` as an integer in ``[lo, hi]`` (ASCII digits, an optional ``-``),
    or None: never a ValueError, whatever the text."""
    body = text[1:] if text.startswith("-") else text
    if not body or len(body) > len(str(max(abs(lo), abs(hi)))) or not _DIGITS.fullmatch(body):
        return None
    value = int(text)
    return value if lo <= value <= hi else None


class _TooLarge(ValueError):
    pass


def _number(kind, limit: int):
    def parse(text: str):
        if len(text) > limit:
            raise _TooLarge(text)
        return kind(text)
    return parse


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


def json_depth(text: str) -> int:
    """How deep ``text``'s arrays and objects nest (brackets inside strings
    not counted), in one pass without recursion."""
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def loads_json(text: str | bytes, label: str, error: type[Exception]) -> object:
    """``text`` parsed as JSON, nested at most :data:`JSON_DEPTH_MAX` deep, its
    numbers at most :data:`NUMBER_DIGITS_MAX` digits; ``error`` (one line) otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise error(f"{label}: not UTF-8 text (byte {exc.start})") from None
    depth = json_depth(text)
    if depth > JSON_DEPTH_MAX:
        raise error(f"{label}: nested {depth} deep, over the {JSON_DEPTH_MAX} a JSON file of ours may be")
    try:
        return json.loads(text, parse_int=_number(int, NUMBER_DIGITS_MAX + 1),
                          parse_float=_number(float, 2 * NUMBER_DIGITS_MAX))
    except _TooLarge as exc:
        raise error(f"{label}: a number of {len(str(exc))} characters, over the {NUMBER_DIGITS_MAX} digits "
                    "a JSON file of ours may hold") from None
    except json.JSONDecodeError as exc:
        raise error(f"{label}: not JSON: {exc.msg} at line {exc.lineno}") from None
    except (ValueError, RecursionError) as exc:  # a last guard: never a traceback
        raise error(f"{label}: not JSON: {cut(str(exc))}") from None
