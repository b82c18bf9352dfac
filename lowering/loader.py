"""Load generated Python source as a module, with tracebacks that show its lines.

The source is compiled under a unique pseudo-filename and registered in
`linecache`, so a traceback through generated code prints the generated line.
The module is not added to `sys.modules`: each load is independent, and
nothing global names it (only `linecache` keeps the text, for tracebacks).
"""

from __future__ import annotations

import itertools
import linecache
import re
import types

_COUNTER = itertools.count()


def _safe(name: str) -> str:
    """`name` reduced to characters harmless in a filename or module name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "module"


def load_source(source: str, name: str) -> types.ModuleType:
    """`compile` + `exec` `source` into a fresh module called `name`."""
    safe = _safe(name)
    filename = f"<partir-generated-{next(_COUNTER)}:{safe}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    code = compile(source, filename, "exec")
    module = types.ModuleType(safe)
    module.__file__ = filename
    exec(code, module.__dict__)
    return module
