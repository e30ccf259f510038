"""Bundle files, written and read one run at a time: memory holds a run, never the bundle.

Writing (`dump_bundle`, `write_bundle`) serialises run documents as they
arrive, in exactly the bytes ``json.dumps(bundle, indent=1)`` gives, so a
bundle written in pieces equals one written whole.

Reading (`read_runs`) walks the top-level object itself and hands each
element of ``"runs"`` to the standard library's JSON decoder, a document at a
time, from a file read in 1 MiB pieces and, for gzip, decompressed as it goes.
A file is opened once: a pipe or a FIFO, read twice by ``db import``, is
copied as it is first read (`BundleFile`).
The header (``format``, ``version``) is checked as soon as it is read; keys
may come in any order, as any JSON tool may reorder them. What no exported
bundle holds is refused before it fills memory: a gzip file that expands more
than `MAX_EXPANSION` times, a run document longer than `MAX_RUN_CHARS`.
Errors name the file, and for bad JSON the line and column.

The format itself is described in db/bundle.py.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import itertools
import json
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from headroom.db.errors import BundleError

BUNDLE_FORMAT = "headroom-bundle"
BUNDLE_VERSION = 1
HEADER_KEYS = ("format", "version", "schema_revision")

MAX_EXPANSION = 100
"""A gzip bundle may expand to this many times its size at most: exported bundles expand about 6x (the
H200 reference data: 5.9x); a file that expands 1000x is a decompression bomb, refused before it fills memory."""
MAX_RUN_CHARS = 16 << 20
"""The longest run document a bundle may hold, in characters of JSON: the agent's runs are well under 1 MiB
(the H200 reference data's largest, 69 results, is 0.2 MiB), and one run is held in memory whole."""
GZIP_LEVEL = 6
"""gzip's own default: on 96 MiB of bundle 1.9 s against level 9's 5.1 s, for 3.7% more bytes."""
_HEADER_CHARS = 1 << 20
"""The longest key or header value read (they are a few characters in any bundle)."""
_CHUNK = 1 << 20
_SPOOL = 16 << 20
"""A stream read twice is kept in memory up to this many bytes, in a temporary file beyond (`BundleFile`)."""
_GZIP_MAGIC = b"\x1f\x8b"
_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True, slots=True)
class BundleCounts:
    runs: int
    results: int


# ---- writing ---------------------------------------------------------------------


def dump_bundle(runs: Iterable[Mapping[str, Any]], out: TextIO, schema_revision: str) -> BundleCounts:
    """Write a bundle of ``runs`` to ``out`` a run at a time, byte for byte as ``json.dumps(bundle, indent=1)``."""
    header = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "schema_revision": schema_revision}
    out.write("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items()) + ' "runs": [')
    n_runs = n_results = 0
    for run in runs:
        text = json.dumps(run, indent=1, allow_nan=False)
        out.write(("\n  " if n_runs == 0 else ",\n  ") + text.replace("\n", "\n  "))  # JSON text has no raw newline
        n_runs += 1
        n_results += sum(len(rows) for rows in run["results"].values())
    out.write("\n ]\n}\n" if n_runs else "]\n}\n")
    return BundleCounts(n_runs, n_results)


def write_bundle(runs: Iterable[Mapping[str, Any]], path: Path, schema_revision: str, *,
                 compress: bool | None = None) -> BundleCounts:
    """Write a bundle of ``runs`` to ``path`` atomically (a temporary file renamed into place).

    Gzip when ``compress`` is true, or when it is None and the name ends in
    ``.gz``; the gzip header carries no time or name, so the same runs give
    the same bytes. `bundle_target` says which paths are refused, and an existing
    file that is not a bundle (a store, any other file) is refused too
    (`_refuse_foreign`); a file replaced keeps its permissions, a new one gets
    the umask's (`_keep_mode`).
    """
    compress = path.name.endswith(".gz") if compress is None else compress
    target = bundle_target(path)
    if target.exists():
        _refuse_foreign(path, target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        _keep_mode(fd, target)
        with os.fdopen(fd, "wb") as raw:
            packed: IO[bytes] = (gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0)
                                 if compress else raw)
            text = io.TextIOWrapper(packed, encoding="utf-8", newline="\n")
            counts = dump_bundle(runs, text, schema_revision)
            text.flush()
            text.detach()  # leaves ``packed`` open
            if compress:
                packed.close()  # writes the gzip trailer; ``raw`` stays open
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except BaseException:  # Ctrl-C and headroom.cli.stop.Stopped (SIGTERM, SIGHUP) too: PATH is left as it was
        with contextlib.suppress(FileNotFoundError):  # stopped just after the rename: the bundle is whole
            os.unlink(tmp)
        raise
    return counts


def _keep_mode(fd: int, target: Path) -> None:
    """Give the temporary file the permissions of the file it will replace, or for a new file those any other
    program's new file gets, 0666 less the umask (0644 under umask 022): mkstemp makes it 0600, which kept a
    new bundle from the group and others the user's umask grants. A bundle holds benchmark results and box
    fingerprints, as the store it came from does, which the umask covers alike."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.fchmod(fd, mode)


def _umask() -> int:
    """This process's umask: read from /proc on Linux, else set and put back at once (os.umask alone cannot
    read it without changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def bundle_target(path: Path) -> Path:
    """The file a bundle written to ``path`` replaces: ``path``, or the file it leads to when it is a symlink.

    The bundle goes to a temporary file renamed over the target, which would
    replace whatever node is there. So an existing path must be a regular
    file: a directory, a device (``/dev/full``), a FIFO or a socket is refused
    with `BundleError` (exit status 2) and left as it is. A symlink is
    followed, as a shell's ``>`` does: the file it points to is replaced and
    the link kept (the same rules apply to that file). A missing directory
    is refused, not created.
    """
    if "\x00" in str(path):
        raise BundleError(f"cannot write bundle {str(path)!r}: a file name cannot hold a NUL")
    try:
        target = Path(os.path.realpath(path))
        mode = target.stat().st_mode
    except FileNotFoundError:
        if not target.parent.is_dir():
            raise BundleError(f"cannot write bundle {_shown(path, target)}: directory {target.parent} does not "
                              "exist; create it first, or give PATH in a directory that exists") from None
        return target
    except UnicodeEncodeError:
        raise BundleError(f"cannot write bundle {str(path)[:200]!r}: a file name cannot hold a lone surrogate; "
                          "give PATH as text, such as results.json.gz") from None
    except OSError as err:  # too long, no permission, a parent that is a file
        raise BundleError(f"cannot write bundle {str(path)[:200]!r}: {err.strerror or err}; PATH must be a "
                          "file name this file system can hold and this user may write, such as results.json.gz"
                          ) from None
    if stat.S_ISREG(mode):
        return target
    kind = "a directory" if stat.S_ISDIR(mode) else NODE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
    example = target / "results.json.gz" if stat.S_ISDIR(mode) else "results.json.gz"
    raise BundleError(f"cannot write bundle {_shown(path, target)}: it is {kind}, which the bundle would replace; "
                      f"PATH must be a regular file or a new file name, such as {example}")


_SNIFF = 4096
"""Bytes of an existing file read to tell whether it is a bundle: its header comes first in every bundle Headroom
writes, within a few dozen characters."""


def _refuse_foreign(path: Path, target: Path) -> None:
    """An existing file may be replaced by a bundle only when it is empty or a bundle itself (plain or gzip, its
    format named in its first `_SNIFF` bytes): a SQLite store, a model's config.json or any other file is refused
    and left as it is. (SQLite's magic is imported here: reading a bundle needs no SQLAlchemy; writing one comes
    from a store, which has it loaded.)"""
    from headroom.db.engine import SQLITE_MAGIC

    try:
        with open(target, "rb") as f:
            head = f.read(_SNIFF)
        if head.startswith(_GZIP_MAGIC):
            with contextlib.suppress(OSError, EOFError, zlib.error), gzip.open(target, "rb") as unpacked:
                head = unpacked.read(_SNIFF)
    except OSError as err:
        raise BundleError(f"cannot write bundle {_shown(path, target)}: {err.strerror or err}; PATH must be a file "
                          "this user may read and write, or a new file name, such as results.json.gz") from None
    if not head or BUNDLE_FORMAT.encode() in head:
        return
    what = ("a SQLite database (a Headroom store, perhaps)" if head.startswith(SQLITE_MAGIC)
            else "a file that is not a Headroom bundle")
    raise BundleError(f"cannot write bundle {_shown(path, target)}: it is {what}, which the bundle would replace; "
                      "give PATH a new file name, such as results.json.gz, or remove the file first")


def _shown(path: Path, target: Path) -> str:
    """``path`` as messages name it: with the file it leads to when it is a symlink."""
    return f"{path} (a symlink to {target})" if os.path.islink(path) else str(path)


NODE_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
              stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket"}
"""What a file that is neither regular nor a directory is, by its `stat.S_IFMT`, as messages name it."""


# ---- reading ---------------------------------------------------------------------


def read_runs(path: Path) -> Iterator[Any]:
    """The run documents of the bundle at ``path`` (plain or gzip JSON), one at a time, as parsed JSON.

    The header is checked as it is read, and once more at the end (a bundle
    without ``format`` is found out there); a caller that has taken every run
    without an error has read a whole, well-formed bundle. The runs themselves
    are not checked here (headroom.db.bundle.check_runs does that). The file is read
    once; `BundleFile` reads a bundle through twice.
    """
    with BundleFile(path, again=False) as bundle:
        yield from bundle.runs()


class BundleFile:
    """A bundle file opened once and read through as often as a caller asks (`runs`): ``db import`` checks it
    whole, then writes it.

    A regular file is read again from the start of its own descriptor. What
    can be read only once (a pipe, /dev/stdin, a FIFO, ``<(...)``) is copied
    as its first reading goes, in memory up to `_SPOOL` and in a temporary
    file beyond, and read again from the copy; ``again=False`` keeps no copy.
    """

    def __init__(self, path: Path, *, again: bool = True) -> None:
        self.path = path
        try:
            self._file = path.open("rb")
        except (OSError, ValueError) as err:  # ValueError: a name with a NUL, which no file has
            raise _unreadable(path, err) from None
        info = os.fstat(self._file.fileno())
        regular = stat.S_ISREG(info.st_mode)
        self._size = info.st_size if regular else None  # a stream's: known once it has been read through
        self._copy = tempfile.SpooledTemporaryFile(_SPOOL) if again and not regular else None
        self._started = False

    def runs(self) -> Iterator[Any]:
        """The bundle's run documents from its start, as `read_runs` gives them."""
        if self._size is not None:
            f = self._file if self._copy is None else self._copy
            f.seek(0)
            chunks = _chunks(f, self.path)
        elif self._started:
            raise RuntimeError(f"{self.path} is a stream read once, and its first reading did not reach the end")
        else:
            self._started = True
            chunks = self._first_reading()
        source = str(self.path)
        reader = _Reader(_unpacked(chunks, self._size, self.path), source)
        try:
            yield from _bundle(reader, source)
        except UnicodeDecodeError:
            raise BundleError(f"{source}: not UTF-8 text, so not a bundle; nothing imported") from None

    def _first_reading(self) -> Iterator[bytes]:
        """A stream's pieces, each written to the copy (if kept) as it passes; its size known at the end."""
        size = 0
        for chunk in _chunks(self._file, self.path):
            if self._copy is not None:
                self._keep(chunk)
            size += len(chunk)
            yield chunk
        if self._copy is not None:
            self._keep(b"")
            self._size = size

    def _keep(self, chunk: bytes) -> None:
        """Add ``chunk`` to the copy; an empty one flushes it (so a full disk is said here, not on the next read)."""
        try:
            if chunk:
                self._copy.write(chunk)
            else:
                self._copy.flush()
        except OSError as err:
            raise BundleError(f"cannot read bundle {str(self.path)!r}: no room for the copy of it kept to read "
                              f"again ({err.strerror or err} in {tempfile.gettempdir()}); set TMPDIR to a "
                              "folder with room, or give a regular file") from None

    def close(self) -> None:
        self._file.close()
        if self._copy is not None:
            self._copy.close()

    def __enter__(self) -> BundleFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_header(header: Mapping[str, Any], source: str, *, complete: bool = True) -> None:
    """Refuse what is not a bundle this headroom reads; ``complete=False`` checks only the keys present so far."""
    if complete or "format" in header:
        if header.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"{source}: not a Headroom bundle (format {header.get('format')!r}, "
                              f"expected {BUNDLE_FORMAT!r})")
    if complete or "version" in header:
        version = header.get("version")
        if isinstance(version, bool) or version != BUNDLE_VERSION:  # true == 1 in Python, not a version
            newer = isinstance(version, int) and version > BUNDLE_VERSION
            raise BundleError(f"{source}: bundle version {version!r}; this headroom reads version {BUNDLE_VERSION}"
                              + (" (upgrade headroom to import it)" if newer else ""))


def _bundle(reader: _Reader, source: str) -> Iterator[Any]:
    first = reader.peek()
    if first and first != "{":
        value = [] if first == "[" else reader.value(_HEADER_CHARS)  # a scalar is short; a list may be the file
        kind = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        raise BundleError(f"{source}: not a Headroom bundle (the file is {kind}, a bundle is a JSON object "
                          f"with format {BUNDLE_FORMAT!r})")
    if not first:
        raise reader.syntax("Expecting value")
    reader.pos += 1
    header: dict[str, Any] = {}
    seen_runs = False
    if reader.peek() == "}":
        reader.pos += 1
    else:
        while True:
            if reader.peek() != '"':
                raise reader.syntax("Expecting property name enclosed in double quotes")
            key = reader.value(_HEADER_CHARS, "a key")
            if key in header or (key == "runs" and seen_runs):
                raise BundleError(f"{source}: key {key!r} appears twice in the bundle")
            reader.expect(":", "':' delimiter")
            if key == "runs":
                check_header(header, source, complete=False)
                seen_runs = True
                yield from _runs(reader, source)
            elif key in HEADER_KEYS:
                header[key] = reader.value(_HEADER_CHARS, repr(key))
                check_header(header, source, complete=False)
            else:
                raise BundleError(f"{source}: unknown key {key!r}; a bundle holds {', '.join(HEADER_KEYS)} "
                                  "and a list 'runs'")
            if reader.expect(",}", "',' delimiter") == "}":
                break
    if reader.peek():
        raise reader.syntax("Extra data")
    check_header(header, source)
    if not seen_runs:
        raise BundleError(f"{source}: no list 'runs'; a bundle holds {', '.join(HEADER_KEYS)} and a list 'runs'")


def _runs(reader: _Reader, source: str) -> Iterator[Any]:
    found = reader.peek()
    if not found:
        raise reader.syntax("Expecting value")
    if found != "[":
        raise BundleError(f"{source}: 'runs' must be a list of run documents")
    reader.pos += 1
    if reader.peek() == "]":
        reader.pos += 1
        return
    number = 0
    while True:
        number += 1
        yield reader.value(MAX_RUN_CHARS, f"run {number}")
        if reader.expect(",]", "',' delimiter") == "]":
            return


class _Reader:
    """A bundle's text, read in pieces, parsed a value at a time; positions kept for error messages."""

    def __init__(self, chunks: Iterator[bytes], source: str) -> None:
        self._chunks = chunks
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._json = json.JSONDecoder(parse_constant=self._constant)
        self._source = source
        self.text = ""
        self.pos = 0
        self.eof = False
        self._lines = 0  # newlines in the text already dropped
        self._column = 0  # characters after the last of them

    def peek(self) -> str:
        """The next character that is not whitespace (the position moves to it); '' at the end."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self._read(_CHUNK):
                return ""

    def expect(self, characters: str, what: str) -> str:
        found = self.peek()
        if not found or found not in characters:
            raise self.syntax(f"Expecting {what}")
        self.pos += 1
        return found

    def value(self, limit: int, what: str = "a value") -> Any:
        """The JSON value at the next non-whitespace character, read on until it is whole (at most ``limit``
        characters)."""
        self.peek()
        while True:
            try:
                value, end = self._json.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:
                self._grow(limit, what, err)
                continue
            except RecursionError:
                raise BundleError(f"{self._source}: {what}: JSON nested too deeply to be a bundle; "
                                  "nothing imported") from None
            except BundleError:  # a constant no bundle carries (NaN, Infinity), refused while it was read
                raise
            except ValueError:  # an integer of more digits than Python converts
                raise BundleError(f"{self._source}: {what}: an integer of more than 4,300 digits, which no field "
                                  "holds; nothing imported") from None
            if end == len(self.text) and not self.eof:  # a number may go on in the next piece
                self._grow(limit, what, None)
                continue
            if end - self.pos > limit:
                raise self._too_long(what, limit)
            self.pos = end
            return value

    def _grow(self, limit: int, what: str, err: json.JSONDecodeError | None) -> None:
        """Read on into a value not yet whole; ``err``: the decoder's error on what is held, None for a number
        that may go on. Over ``limit`` what is held is refused as too long, unless broken inside (`_broken`)."""
        held = len(self.text) - self.pos
        if held > limit and not (err is not None and self._broken(err)):
            raise self._too_long(what, limit) from None
        if err is not None and (self.eof or held > limit):
            raise self.syntax(err.msg, err.pos) from None
        self._read(max(held, _CHUNK))  # double what is held: a long value is parsed a few times, not per piece

    def _broken(self, err: json.JSONDecodeError) -> bool:
        """Whether ``err`` is a fault inside the text rather than the text ending: one well before the end of
        what is read. A string the text ends in is said where it starts, however far back, so it never is."""
        return not err.msg.startswith("Unterminated string") and err.pos < len(self.text) - _CHUNK

    def _too_long(self, what: str, limit: int) -> BundleError:
        return BundleError(f"{self._source}: {what} is longer than {limit:,} characters of JSON, more than any "
                           "bundle headroom writes holds; nothing imported")

    def _read(self, at_least: int) -> bool:
        """Append at least ``at_least`` more characters (fewer at the end of the file); False when none came."""
        if self.eof:
            return False
        if self.pos > len(self.text) // 2:
            self._drop_parsed()
        pieces, got = [], 0
        while got < at_least and not self.eof:
            chunk = next(self._chunks, None)
            piece = self._utf8.decode(b"" if chunk is None else chunk, final=chunk is None)
            self.eof = chunk is None
            pieces.append(piece)
            got += len(piece)
        self.text += "".join(pieces)
        return got > 0

    def _drop_parsed(self) -> None:
        parsed = self.text[: self.pos]
        newlines = parsed.count("\n")
        self._lines += newlines
        self._column = len(parsed) - parsed.rfind("\n") - 1 if newlines else self._column + len(parsed)
        self.text, self.pos = self.text[self.pos:], 0

    def syntax(self, message: str, pos: int | None = None) -> BundleError:
        pos = self.pos if pos is None else pos
        before = self.text[:pos]
        newlines = before.count("\n")
        line = self._lines + newlines + 1
        column = pos - before.rfind("\n") if newlines else self._column + pos + 1
        return BundleError(f"{self._source}: not valid JSON at line {line} column {column} ({message}); "
                           "a truncated bundle ends early; nothing imported")

    def _constant(self, name: str) -> None:
        raise BundleError(f"{self._source}: {name} is not a number a bundle may carry; nothing imported")


def _unreadable(path: Path, err: Exception) -> BundleError:
    return BundleError(f"cannot read bundle {str(path)!r}: {getattr(err, 'strerror', None) or err}")


def _chunks(f: IO[bytes], path: Path) -> Iterator[bytes]:
    """``f`` read in pieces from where it stands to its end."""
    while True:
        try:
            chunk = f.read(_CHUNK)
        except OSError as err:
            raise _unreadable(path, err) from None
        if not chunk:
            return
        yield chunk


def _unpacked(chunks: Iterator[bytes], size: int | None, path: Path) -> Iterator[bytes]:
    """The bytes of ``chunks``, decompressed when they are gzip (recognised by the magic the first piece starts with)."""
    first = next(chunks, b"")
    if first[:2] == _GZIP_MAGIC:
        yield from _gunzip(itertools.chain([first], chunks), size, path)
    else:
        yield from itertools.chain([first], chunks)


def _gunzip(chunks: Iterator[bytes], size: int | None, path: Path) -> Iterator[bytes]:
    """Every gzip member of ``chunks`` decompressed in pieces, refused as soon as it outgrows MAX_EXPANSION times
    ``size``, or for a stream of unknown size the bytes of it read so far."""
    read = total = 0
    inflate, pending = zlib.decompressobj(16 + zlib.MAX_WBITS), b""
    try:
        while True:
            if not pending:
                if not (pending := next(chunks, b"")):
                    break
                read += len(pending)
            if inflate.eof:  # another member follows
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            piece = inflate.decompress(pending, _CHUNK)
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
            total += len(piece)
            if total > max(MAX_EXPANSION * (read if size is None else size), 16 * _CHUNK):
                its = f"its {size:,} bytes" if size is not None else f"the {read:,} bytes of it read so far"
                raise BundleError(f"{path}: expands more than {MAX_EXPANSION}x {its}, which no exported bundle "
                                  "does (a decompression bomb?); nothing imported")
            yield piece
        if not inflate.eof:
            yield inflate.flush()
        if not inflate.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
    except (EOFError, zlib.error) as err:
        raise BundleError(f"{path}: truncated or damaged gzip ({err}); nothing imported") from None
