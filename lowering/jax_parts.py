"""The program body in parts: functions of bounded size, one per repeated shape.

JAX records a Python traceback for every op it traces and turns each into a
source location when lowering, at a cost per op that grows with the length
of the calling function (the 24-layer training step, 24k statements: 14 s to
lower from one function, 1.3 s from parts). So the entry function's ops are
cut into parts of at most `PART_MAX` ops, each emitted as a function
`_part_k(p0, p1, ...)` that takes the values it uses from earlier parts and
returns the ones later parts use; `_body` calls them in program order (a
program of one part is emitted in `_body` itself).

The cut points are content-defined (as in rsync's rolling checksum): each
part ends where a hash of the last `WINDOW` op names is least, so repeated
layers are cut at the same places. Each part is emitted with its own names
(`lowering.jax_body`), so parts equal up to renaming have the same text and
share one function, which returns the union of what its calls need. Shared
functions are wrapped in `jax.jit(..., inline=True)`: JAX runs their Python
once per argument types and copies the cached jaxpr into each call, so the
program JAX lowers is the one a single function would give, bit for bit.
(Without `inline`, each call stays a call until XLA inlines it; that traces
and lowers faster, but XLA then rounds a few values differently.)

A shared function's statements are commented with where the first call's
ops came from, and how many other places the other calls' ops came from
(layers whose name stacks differ, `layers_0` and `layers_1`, still share).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from lowering.jax_body import BodyEmitter, ModuleTables, noted

PART_MIN = 64
"""No cut before a part has this many ops (bounds the number of calls)."""

PART_MAX = 512
"""A part has at most this many ops (bounds the function length)."""

WINDOW = 16
"""Op names hashed for a cut point: a cut depends on nothing further back."""


def _window_hashes(ops: Sequence[Operation]) -> list[int]:
    """Per op, a hash of its name and the `WINDOW - 1` names before it."""
    keys: dict[str, int] = {}
    window: deque[int] = deque(maxlen=WINDOW)
    hashes = []
    for op in ops:
        key = keys.get(op.name)
        if key is None:
            key = keys[op.name] = zlib.crc32(op.name.encode())
        window.append(key)
        # hash() of a tuple of ints is the same in every process (no salt).
        hashes.append(hash(tuple(window)))
    return hashes


def split_ops(ops: Sequence[Operation]) -> list[list[Operation]]:
    """`ops` cut into runs of `PART_MIN`..`PART_MAX` ops at content-defined points.

    Each part ends at the last op of least window hash among its possible
    ends. In a run of repeated layers (period P) the least hash recurs every
    P ops, and taking the last one makes every part end at the same place in
    its layer: the parts repeat with the layers.
    """
    hashes = _window_hashes(ops)
    parts: list[list[Operation]] = []
    start = 0
    while len(ops) - start > PART_MAX:
        candidates = range(start + PART_MIN - 1, start + PART_MAX)
        least = min(hashes[j] for j in candidates)
        end = max(j for j in candidates if hashes[j] == least) + 1
        parts.append(list(ops[start:end]))
        start = end
    if start < len(ops):
        parts.append(list(ops[start:]))
    return parts


def _live_after(parts: list[list[Operation]]) -> list[set[SSAValue]]:
    """Per part, its results used by a later part or by anything after the parts."""
    index = {op: i for i, part in enumerate(parts) for op in part}
    live: list[set[SSAValue]] = []
    for i, part in enumerate(parts):
        out: set[SSAValue] = set()
        for op in part:
            for result in op.results:
                for use in result.uses:
                    user: Operation | None = use.operation
                    while user is not None and user not in index:
                        user = user.parent_op()
                    if user is None or index[user] != i:
                        out.add(result)
                        break
        live.append(out)
    return live


def _order(name: str) -> tuple[str, int]:
    return name[0], int(name[1:])


@dataclass
class PartFunction:
    """One emitted `def`: its text and the local names it returns."""

    name: str
    lines: list[str]
    parameters: int = 0
    returns: set[str] = field(default_factory=set)
    calls: int = 0
    notes: dict[int, dict[str, None]] = field(default_factory=dict)
    """Per line, the distinct notes of the calls' ops, first call first."""

    def add_notes(self, notes: dict[int, str]) -> None:
        for i, note in notes.items():
            self.notes.setdefault(i, {})[note] = None

    def _notes(self) -> dict[int, str]:
        out = {}
        for i, seen in self.notes.items():
            first, *others = seen
            places = "place" if len(others) == 1 else "places"
            out[i] = f"{first} (and {len(others)} other {places})" if others else first
        return out

    def source(self) -> list[str]:
        params = ", ".join(f"p{i}" for i in range(self.parameters))
        returned = sorted(self.returns, key=_order)
        ret = returned[0] if len(returned) == 1 else ", ".join(returned)
        lines = [f"def {self.name}({params}):", *noted(self.lines, self._notes())]
        if returned:
            lines.append(f"    return {ret}")
        if self.calls > 1:
            lines += ["", "", f"{self.name} = jax.jit({self.name}, inline=True)"]
        return lines


@dataclass
class _Call:
    function: PartFunction
    args: list[str]
    targets: dict[str, str]
    """Local name returned -> the name `_body` gives it."""


class PartsEmitter:
    """Emits a function's top-level ops as calls to part functions.

    `top` is the calling function's emitter (`_body`): it holds the names of
    the arguments and receives the names of every value a part returns.
    """

    def __init__(self, top: BodyEmitter, tables: ModuleTables) -> None:
        self.top = top
        self.tables = tables
        self.functions: dict[tuple[int | str, ...], PartFunction] = {}
        self._calls: list[_Call] = []

    def emit(self, ops: Sequence[Operation]) -> None:
        parts = split_ops(ops)
        if len(parts) == 1:  # a short program reads best as one function
            self.top.emit_ops(ops)
            return
        for part, live in zip(parts, _live_after(parts), strict=True):
            self._emit_part(part, live)
        for call in self._calls:
            self._write_call(call)

    def _emit_part(self, part: list[Operation], live: set[SSAValue]) -> None:
        em = BodyEmitter(self.tables, outer=self.top.names, prefix="x")
        em.emit_ops(part)
        args = [self.top.name(v) for v in em.params]
        returned: dict[str, list[SSAValue]] = {}
        for op in part:
            for result in op.results:
                local = em.names[result]
                if local.startswith("p"):  # an alias of an argument: nothing to return
                    self.top.names[result] = args[int(local[1:])]
                elif result in live:
                    returned.setdefault(local, []).append(result)
        if not em.lines:  # only aliases (`spmd.to_local`, ...): nothing to call
            return
        # Parameters used only by aliases appear in no line: count them too.
        key: tuple[int | str, ...] = (len(em.params), *em.lines)
        function = self.functions.get(key)
        if function is None:
            function = PartFunction(f"_part_{len(self.functions)}", em.lines, len(em.params))
            self.functions[key] = function
        function.calls += 1
        function.returns |= set(returned)
        function.add_notes(em.notes)
        targets: dict[str, str] = {}
        for local, values in returned.items():
            targets[local] = self.top.define(values[0])
            for value in values[1:]:
                self.top.names[value] = targets[local]
        self._calls.append(_Call(function, args, targets))

    def _write_call(self, call: _Call) -> None:
        returned = sorted(call.function.returns, key=_order)
        call_text = f"{call.function.name}({', '.join(call.args)})"
        if not returned:
            self.top.write(call_text)
            return
        targets = ", ".join(call.targets.get(name, "_") for name in returned)
        self.top.write(f"{targets} = {call_text}")

    def function_lines(self) -> list[str]:
        lines: list[str] = []
        for function in self.functions.values():
            lines += ["", "", *function.source()]
        return lines
