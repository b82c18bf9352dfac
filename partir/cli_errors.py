"""How `partir-opt` and `partir-inspect` report an error: one line on stderr.

A command-line error is one line that names what is wrong (the file and
position, the pass and option, the op) and what to do, then exit status 1;
the Python traceback only with `--traceback`. `one_line` turns every error
the tools can meet into that line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from xdsl.utils.exceptions import DiagnosticException, ParseError

from dialects.errors import PartirError

MAX_OP_TEXT = 160


def _short(text: str, limit: int = MAX_OP_TEXT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_error_line(err: ParseError) -> str:
    """`file:line:col: error: message (at 'text')`."""
    where = str(err.span.get_location())
    text = err.span.text
    at = f" (at {_short(text, 40)!r})" if text.strip() else ""
    return f"{where}: error: {_short(err.msg.strip(), 300)}{at}"


def _failing_op(notes: Sequence[str]) -> str:
    """The op line xDSL marks with `^^^` in the annotated IR of a diagnostic."""
    for note in notes:
        lines = note.splitlines()
        for i, line in enumerate(lines[1:], start=1):
            if re.fullmatch(r"\s*\^+-*\s*", line):
                return lines[i - 1].strip()
    return ""


def pipeline_error_line(text: str) -> str:
    """xDSL's pass-pipeline syntax error (`pass-pipeline:1:26`, the spec, a
    caret, the message) as one line."""
    lines = text.splitlines()
    column = next((m.group(1) for line in lines if (m := re.search(r":1:(\d+)$", line))), "?")
    message = lines[-1].strip() if lines else "syntax error"
    hint = ""
    if message == "Unknown token":
        hint = "; an option value in quotes needs its closing quote, a {...} its closing brace"
    return f"error: cannot read the pass pipeline (-p) at column {column}: {message}{hint}"


def one_line(err: BaseException, input_name: str = "<input>") -> str:
    """The one stderr line for `err`."""
    if isinstance(err, ParseError):
        return parse_error_line(err)
    if isinstance(err, RecursionError):
        return (
            f"error: {input_name} nests ops (modules or regions) too deeply for the "
            "parser (Python's recursion limit); flatten the nesting"
        )
    if isinstance(err, UnicodeDecodeError):
        return (
            f"error: {input_name} is not UTF-8 text (byte 0x{err.object[err.start]:02x} "
            f"at offset {err.start}); MLIR files are UTF-8"
        )
    if isinstance(err, OSError) and err.filename is not None:
        return f"error: cannot read {err.filename}: {err.strerror or err}"
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    if type(err).__name__ == "ArgSpecParseError":
        return pipeline_error_line(text)
    if isinstance(err, DiagnosticException) and not isinstance(err, PartirError):
        op = _failing_op(getattr(err, "__notes__", ()))
        return f"error: {first}" + (f"; in: {_short(op)}" if op else "")
    return f"error: {first}"
