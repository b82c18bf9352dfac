"""Selecting program values by pytree path, with globs.

The importer names every argument and result by its pytree path, e.g.
`params['blocks'][3]['attn']['wq']`. Selectors match the *slash form* of that
path, `params/blocks/3/attn/wq`:

- a segment is matched with shell-style wildcards (`*`, `?`, `[abc]`), so
  `params/*/w1` matches `params/mlp/w1` but not `params/a/b/w1`;
- `**` matches any number of segments (including none): `params/**/wq`
  matches every `wq` at any depth, `**/bias` every bias;
- the path form itself, `params['w1']`, is accepted too and matches exactly.

Results are named `result/...` (JAX's `result[1]['w1']` is `result/1/w1`).

A trailing `.value` is not a segment: Flax NNX's leaves are variables'
payloads (`state[0]['attn']['query']['kernel'].value`), so their slash form
is the variable's path, `state/0/attn/query/kernel` (a key `['value']` is a
name, and stays one).

A key is one segment whatever it holds: `d['a/b']` is the one segment `a/b`
(kept apart from `d['a']['b']`, and selected by `d/*` or by its path form
`d['a/b']`, never by `d/a/b`), and quoted keys are read as Python reads them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

_KEY = re.compile(r"\[(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|(-?\d+))\]|\.(\w+)")


KEY_SLASH = "\x00"
"""Stands for a `/` inside one key in the slash form, so it never splits a segment."""


def _key(match: re.Match[str]) -> str:
    single, double, index, attr = match.groups()
    if single is not None:
        return _unquote("'" + single + "'")
    if double is not None:
        return _unquote('"' + double + '"')
    return index if index is not None else attr


def _unquote(literal: str) -> str:
    if "\\" not in literal:  # no escapes: the text between the quotes, as Python reads it
        return literal[1:-1]  # (and no `ast.literal_eval`, whose closures are cyclic garbage)
    try:
        value = ast.literal_eval(literal)
    except (SyntaxError, ValueError):
        return literal[1:-1]
    return value if isinstance(value, str) else literal[1:-1]


PAYLOAD = "value"
"""The attribute through which Flax NNX's `Variable` holds its array, the
last key of every NNX leaf's path."""


@lru_cache(maxsize=65536)
def slash_path(path: str) -> str:
    """`params['blocks'][3]['wq']` -> `params/blocks/3/wq` (a `/` inside a
    key becomes `KEY_SLASH`)."""
    head = re.match(r"[^\[.]*", path)
    root = head.group(0) if head else ""
    parts = [root] if root else []
    last = None
    for last in _KEY.finditer(path, len(root)):
        parts.append(_key(last).replace("/", KEY_SLASH))
    if last is not None and last.group(4) == PAYLOAD and last.end() == len(path) and len(parts) > 1:
        parts.pop()  # NNX's `Variable.value`: the payload, not a name
    return "/".join(parts)


def glob_escaped(slashed: str) -> str:
    """A selector that selects exactly the node at slash path `slashed`
    (each wildcard character bracketed); `slashed + "/**"` its leaves."""
    return "/".join(re.sub(r"([*?\[])", r"[\1]", segment) for segment in slashed.split("/"))


POSITIONAL_ROOT = "args"
"""The root of the names of arguments that have none of their own: `args[i]`
for a `*args` element, or for an argument of IR that names none."""


def argument_root(path: str) -> str:
    """The argument a leaf named `path` belongs to, in the slash form: its
    root, or `args/i` for a positional one (each is an argument of its own)."""
    segments = slash_path(path).split("/")
    if segments[0] == POSITIONAL_ROOT and len(segments) > 1:
        return "/".join(segments[:2])
    return segments[0]


def display_path(path: str) -> str:
    """The slash form for messages, or the path form where a key holds a `/`."""
    slashed = slash_path(path)
    return path if KEY_SLASH in slashed else slashed


def exact_selector(path: str) -> str:
    """A selector that selects the value named `path` and nothing else: its
    path form where that has a quoted key (matched exactly), else its slash
    form with each wildcard character bracketed (`args/0`, `a[*]b`)."""
    if "[" in path and ("'" in path or '"' in path):
        return path
    return glob_escaped(slash_path(path))


def _segment_regex(segment: str) -> str:
    """One path segment's wildcard pattern as a regex that never crosses a `/`."""
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := segment.find("]", i + 1)) > i + 1:
            body = segment[i + 1 : end]
            out.append(
                "[^" + re.escape(body[1:]) + "]" if body[0] == "!" else "[" + re.escape(body) + "]"
            )
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _glob_regex(pattern: str) -> str:
    """A selector as a regex over `slash_path + "/"` (each segment ends in `/`)."""
    if "[" in pattern and ("'" in pattern or '"' in pattern):
        return re.escape(slash_path(pattern) + "/")
    return "".join(
        "(?:[^/]+/)*" if seg == "**" else _segment_regex(seg) + "/"
        for seg in pattern.strip("/").split("/")
    )


@lru_cache(maxsize=1024)
def _compile(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{_glob_regex(p)})" for p in patterns))


def matches(pattern: str, path: str) -> bool:
    """Whether the value named `path` (pytree path form) is selected by `pattern`."""
    return _compile((pattern,)).fullmatch(slash_path(path) + "/") is not None


def select(patterns: str | Iterable[str], paths: Sequence[str]) -> list[int]:
    """Indices of the paths any pattern selects, in path order."""
    pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    regex = _compile(pats)
    return [i for i, p in enumerate(paths) if regex.fullmatch(slash_path(p) + "/")]
