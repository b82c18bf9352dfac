"""The program body in parts: functions of bounded size, one per repeated shape.

JAX records a Python traceback for every op it traces and turns each into a
source location when lowering, at a cost per op that grows with the length
of the calling function (the 24-layer training step, 24k statements: 14 s to
lower from one function, 1.3 s from parts). So the entry function's ops are
cut into parts of at most `PartBounds.max` ops, each emitted as a function
`_part_k(p0, p1, ...)` that takes the values it uses from earlier parts and
returns the ones later parts use; `_body` calls them in program order (a
program of one part is emitted in `_body` itself).

The cut points are content-defined (as in rsync or a deduplicating backup):
each op gets a hash of its name and the `WINDOW - 1` names before it, and a
part may end at an op whose hash is least within `PartBounds.radius` ops on
either side. That depends only on the ops nearby, not on where the previous
part ended, so a run of repeated ops (the layers' forward passes, their
gradients, their optimizer updates) is cut at the same places in every
repetition, and at least once in each if it is shorter than the radius. The
runs between cuts are joined into parts of at least `PartBounds.min` ops (the
same joins from the second repetition on), and a run longer than
`PartBounds.max` is cut where its hash is least. On the N-layer training
step, the parts of 2 layers are all that 3, 6 or 24 layers need.

Each part is emitted with its own names (`lowering.jax_body`), so parts equal
up to renaming have the same text and share one function, which returns the
union of what its calls need. Shared functions are wrapped in `jax.jit(...,
inline=True)`: JAX runs their Python once per argument types and copies the
cached jaxpr into each call (about a third of the cost of tracing them), so
the program JAX lowers is the one a single function would give, bit for
bit. (Without `inline`, each call stays a call until XLA inlines it; that
traces and lowers faster, but XLA then rounds a few values differently.)

A shared function's statements are commented with where the first call's
ops came from, and how many other places the other calls' ops came from
(layers whose name stacks differ, `layers_0` and `layers_1`, still share).
"""

from __future__ import annotations

import itertools
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from lowering.jax_body import BodyEmitter, ModuleTables, noted

WINDOW = 16
"""Op names hashed for a cut point: its hash depends on nothing further back."""


@dataclass(frozen=True)
class PartBounds:
    """How the body is cut: parts of `min`..`max` ops (the last may be
    shorter), ending where the hash is least within `radius` ops."""

    min: int = 64
    """No cut before a part has this many ops (bounds the number of calls)."""
    max: int = 512
    """A part has at most this many ops (bounds the function length)."""
    radius: int = 64
    """Half the width over which a cut's hash is least: parts average about
    twice this where nothing repeats, and a pattern shorter than it repeats
    whole in every part."""

    def __post_init__(self) -> None:
        if not 0 < 2 * self.min <= self.max or self.radius < 1:
            raise ValueError(f"{self}: need 0 < 2 * min <= max and radius >= 1")


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


def _local_minima(hashes: list[int], radius: int) -> list[int]:
    """The indices whose hash is least within `radius` on either side, in
    order (a sliding-window minimum: linear in the number of ops)."""
    minima = []
    window: deque[int] = deque()  # indices of increasing hashes in [i - radius, i + radius]
    ahead = 0
    for i, h in enumerate(hashes):
        while ahead < len(hashes) and ahead <= i + radius:
            while window and hashes[window[-1]] > hashes[ahead]:
                window.pop()
            window.append(ahead)
            ahead += 1
        if window[0] < i - radius:
            window.popleft()
        if h <= hashes[window[0]]:
            minima.append(i)
    return minima


def _cut_long(start: int, end: int, hashes: list[int], bounds: PartBounds) -> list[int]:
    """Ends of parts of `min`..`max` ops covering [start, end): each at the
    last op of least hash among its possible ends."""
    ends = []
    while end - start > bounds.max:
        candidates = range(start + bounds.min - 1, min(start + bounds.max, end - bounds.min))
        least = min(hashes[j] for j in candidates)
        start = max(j for j in candidates if hashes[j] == least) + 1
        ends.append(start)
    return [*ends, end]


def split_ops(ops: Sequence[Operation], bounds: PartBounds | None = None) -> list[list[Operation]]:
    """`ops` cut into parts of `bounds.min`..`bounds.max` ops at content-defined points.

    A part ends at a local minimum of the window hash (or at the end); runs
    between minima are joined until a part has `min` ops, and a part longer
    than `max` is cut again (`_cut_long`). Where the ops repeat, so do the
    minima, the joins (after the first repetition) and the parts.
    """
    bounds = bounds or PartBounds()
    hashes = _window_hashes(ops)
    ends: list[int] = []
    start = 0
    for minimum in _local_minima(hashes, bounds.radius):
        if minimum + 1 - start >= bounds.min:
            ends += _cut_long(start, minimum + 1, hashes, bounds)
            start = ends[-1]
    if start < len(ops):
        ends += _cut_long(start, len(ops), hashes, bounds)
    return [list(ops[a:z]) for a, z in itertools.pairwise([0, *ends])]


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

    def __init__(
        self, top: BodyEmitter, tables: ModuleTables, bounds: PartBounds | None = None
    ) -> None:
        self.top = top
        self.tables = tables
        self.bounds = bounds or PartBounds()
        self.functions: dict[tuple[int | str, ...], PartFunction] = {}
        self._calls: list[_Call] = []

    def emit(self, ops: Sequence[Operation]) -> None:
        parts = split_ops(ops, self.bounds)
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
