"""Load generated Python source as a module, with tracebacks that show its lines.

The source is compiled under a unique pseudo-filename and registered in
`linecache`, so a traceback through generated code prints the generated line.
The module is not added to `sys.modules`: each load is independent, and
nothing global names it (only `linecache` keeps the text, for tracebacks).

It is compiled one top-level `def` at a time (each run padded with blank lines
so line numbers stay those of the whole text), then run in order into one
namespace, which is what running the whole text does. CPython's compiler holds
a whole module's syntax tree and code at once, and the heap it grows for a
large program (40 MiB for the 24-layer training step's 0.5 MiB) stays with
the process after it is freed; a `def` at a time peaks at one part function.
"""

from __future__ import annotations

import itertools
import linecache
import re
import types

from dialects.heap import paused_gc

_COUNTER = itertools.count()


def _safe(name: str) -> str:
    """`name` reduced to characters harmless in a filename or module name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "module"


def _runs(lines: list[str]) -> list[tuple[int, str]]:
    """(first line index, text) of the runs of `lines` that start at a `def`
    in column 0. A cut inside a string or a bracket leaves a run that does not
    compile, and `_compile` then compiles the text whole."""
    cuts = [0, *(i for i, line in enumerate(lines) if i and line.startswith("def ")), len(lines)]
    return [(a, "".join(lines[a:z])) for a, z in itertools.pairwise(cuts) if a < z]


def _compile(source: str, lines: list[str], filename: str) -> list[types.CodeType]:
    try:
        return [compile("\n" * start + text, filename, "exec") for start, text in _runs(lines)]
    except SyntaxError:
        return [compile(source, filename, "exec")]


def load_source(source: str, name: str) -> types.ModuleType:
    """`compile` + `exec` `source` into a fresh module called `name`."""
    safe = _safe(name)
    filename = f"<partir-generated-{next(_COUNTER)}:{safe}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    with paused_gc():  # compiling makes objects per line; a collection walks the caller's IR
        codes = _compile(source, lines, filename)
        module = types.ModuleType(safe)
        module.__file__ = filename
        for code in codes:
            exec(code, module.__dict__)
    return module
