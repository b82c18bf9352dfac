"""Tactics: named, composable decisions about which values to tile.

A tactic looks at the program's named arguments and results (pytree paths,
see `partir.selectors` for the glob syntax) and plans tiling actions. `plan` is
pure: it returns a `Plan` (`partir.plan`: the tiles, and for every leaf the
tactic looked at, the role it took it for and why, which the passes record
for the report) and touches neither the IR nor the tactic, so every
tactic of a schedule is checked (unknown axis, a name that selects nothing, a
dimension the axis does not divide) before any rewrite happens.
`partir.partition` then applies the plans in order, each followed by
propagation (PartIR's schedule: later tactics refine, they never undo).

Each tactic is also a `partir-opt` pass (`partir.passes` generates it from the
dataclass): its fields are the pass's options, with the same names and
meaning; `CLI_NAME` names the pass and `from_options` builds the tactic from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dialects.errors import PartirTypeError
from dialects.escaping import quoted
from partir.annotations import ARGUMENT, RESULT, Annotation
from partir.mesh import Mesh
from partir.plan import (
    AnnotatedValue,
    Leaf,
    PassedLeaf,
    Plan,
    PlannedTile,
    ProgramView,
    ReferencedValue,
    TacticError,
    tactic_label,
)
from partir.roles import Roles
from partir.selectors import KEY_SLASH, slash_path
from partir.values import ValueReference, ValueReferenceError, is_reference

if TYPE_CHECKING:
    from partir.cost.profile import Profile

__all__ = [
    "MEGATRON_COLUMN",
    "MEGATRON_COLUMN_BIAS",
    "MEGATRON_ROW",
    "TACTICS",
    "Annotations",
    "Automatic",
    "BatchParallel",
    "Leaf",
    "ManualPartition",
    "Megatron",
    "PassedLeaf",
    "Plan",
    "PlannedTile",
    "ProgramView",
    "Tactic",
    "TacticError",
    "ZeRO",
    "check_tactics",
    "zero_dim",
]


def check_tactics(tactics: object) -> list[Tactic]:
    """`tactics` as a list of `Tactic`s, or a `PartirTypeError` saying what
    was given instead (a bare tactic, an axis name, ...)."""
    if isinstance(tactics, Tactic):
        raise PartirTypeError(
            f"tactics= takes a list of tactics, got the single tactic {tactics!r}; "
            f"write tactics=[{tactics!r}]"
        )
    if isinstance(tactics, str | bytes | Mapping) or not isinstance(tactics, Iterable):
        raise PartirTypeError(
            f"tactics= takes a list of tactics, got {tactics!r} ({type(tactics).__name__}); "
            'e.g. tactics=[partir.BatchParallel("batch")]'
        )
    listed = list(tactics)
    for i, tactic in enumerate(listed):
        if not isinstance(tactic, Tactic):
            example = (
                f"partir.BatchParallel({tactic!r})" if isinstance(tactic, str) else
                'partir.BatchParallel("batch")'
            )
            raise PartirTypeError(
                f"tactics[{i}] is {tactic!r} ({type(tactic).__name__}), not a partir tactic; "
                f"use a tactic object such as {example}"
            )
    return listed


def _axis_size(mesh: Mesh, axis: str, who: str) -> int:
    if not isinstance(axis, str):
        raise PartirTypeError(
            f"{who}: a mesh axis is named by a string, got {axis!r} ({type(axis).__name__}); "
            f"the mesh has {', '.join(quoted(a) for a in mesh.axes)}"
        )
    try:
        return mesh.check_axis(axis, who)
    except ValueError as err:
        raise TacticError(str(err)) from None


def _plan(
    leaf: Leaf, dim: int, axis: str, mesh: Mesh, who: str, role: str = "named", reason: str = ""
) -> PlannedTile:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise PartirTypeError(
            f"{who}: the dim of {leaf.name} is {dim!r} ({type(dim).__name__}); "
            f"dims are ints, e.g. {{0: {axis!r}}}"
        )
    parts = _axis_size(mesh, axis, who)
    rank = len(leaf.shape)
    if not -rank <= dim < rank:
        raise TacticError(f"{who}: {leaf.name} has shape {leaf.shape}, which has no dim {dim}")
    dim %= rank
    if leaf.shape[dim] < parts:
        raise TacticError(
            f"{who}: dim {dim} of {leaf.name} (shape {leaf.shape}) has size "
            f'{leaf.shape[dim]}, fewer elements than mesh axis "{axis}" has devices ({parts}); '
            "pick another dim or axis"
        )
    return PlannedTile(leaf, dim, axis, role, reason)


def _check_distinct_axes(tiles: list[PlannedTile], who: str) -> None:
    """A value is split over each mesh axis at most once."""
    dims: dict[str, int] = {}
    for tile in tiles:
        if tile.axis in dims and dims[tile.axis] != tile.dim:
            raise TacticError(
                f"{who}: {tile.leaf.name} would be split over mesh axis {quoted(tile.axis)} "
                f"on dims {dims[tile.axis]} and {tile.dim}; a value is split over an axis "
                "at most once: use another axis for one of the dims"
            )
        dims[tile.axis] = tile.dim


class Tactic:
    """Base class: `plan` returns the tiling actions, validated, without rewriting."""

    CLI_NAME: ClassVar[str]
    """The `partir-opt` pass running this tactic (its options are the fields)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        raise NotImplementedError

    @classmethod
    def from_options(cls, **options: Any) -> Tactic:
        """The tactic a pass's options describe; an option left unset (None)
        takes the field's default."""
        return cls(**{k: v for k, v in options.items() if v is not None})


@dataclass(frozen=True)
class ManualPartition(Tactic):
    """Tile exactly what you name, selector:dim=axis (`spec="x:0=batch","params/w1:1=model"`).

    In Python, `ManualPartition({"x": {0: "batch"}, "params/**/w1": {1: "model"}})`:
    keys are selectors over argument names (or result names, `result/...`),
    or `@`-references to values inside the program (`partir.values`, as the
    report lists them: `"@jit(step)/tanh at model.py:12#1"`); values map a dim
    (negative counts from the end) to a mesh axis.
    """

    spec: Mapping[str, Mapping[int, str]]

    CLI_NAME = "partir-manual-partition"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        if not isinstance(self.spec, Mapping):
            raise PartirTypeError(
                f"{self.name} takes {{selector: {{dim: axis}}}}, got {self.spec!r}; "
                'e.g. ManualPartition({"x": {0: "batch"}})'
            )
        planned: list[PlannedTile] = []
        for pattern, dims in self.spec.items():
            if not isinstance(pattern, str) or not isinstance(dims, Mapping):
                raise PartirTypeError(
                    f"{self.name}: entry {pattern!r}: {dims!r} is not selector: {{dim: axis}}; "
                    'e.g. ManualPartition({"x": {0: "batch"}})'
                )
            if is_reference(pattern):
                planned += _referenced_tiles(pattern, dims, mesh, self.name)
                continue
            on_results = slash_path(pattern).split("/")[0] == "result"
            why = f"selected by {quoted(pattern)}"
            for leaf in program.find(pattern, who=self.name, results=on_results):
                tiles = [_plan(leaf, d, a, mesh, self.name, "named", why) for d, a in dims.items()]
                _check_distinct_axes(tiles, self.name)
                planned += tiles
        axes = dict.fromkeys(tile.axis for tile in planned)
        return Plan(self.name, tuple(planned), label=tactic_label(self.name, *axes))

    @classmethod
    def from_options(cls, **options: Any) -> Tactic:
        """`spec` as `selector:dim=axis` entries (the CLI's form):
        `("x:0=batch", "params/w1:1=model")`."""
        table: dict[str, dict[int, str]] = {}
        for item in options.get("spec") or ():
            selector, _, tiling = item.rpartition(":")
            dim, _, axis = tiling.partition("=")
            if not selector or not axis or not dim.lstrip("-").isdigit():
                raise TacticError(
                    f'{cls.CLI_NAME}: cannot read "{item}"; write selector:dim=axis, '
                    'e.g. spec="x:0=batch","params/w1:1=model"'
                )
            table.setdefault(selector, {})[int(dim)] = axis
        return cls(table)


def _referenced_tiles(
    reference: str, dims: Mapping[int, str], mesh: Mesh, who: str
) -> list[PlannedTile]:
    """The tiles of a value named by reference (`partir.values`): checked here
    for what the reference and the mesh say; its shape is the program's, so
    the dims are checked when the tile is taken."""
    try:
        ValueReference.parse(reference)
    except ValueReferenceError as err:
        raise TacticError(f"{who}: {err}") from None
    tiles = []
    for dim, axis in dims.items():
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise PartirTypeError(
                f"{who}: the dim of {quoted(reference)} is {dim!r} ({type(dim).__name__}); "
                f"dims are ints, e.g. {{0: {axis!r}}}"
            )
        _axis_size(mesh, axis, who)
        tiles.append(PlannedTile(ReferencedValue(reference), dim, axis, "named", "by reference"))
    _check_distinct_axes(tiles, who)
    return tiles


@dataclass(frozen=True)
class BatchParallel(Tactic):
    """Data parallelism: tile dim 0 of the data inputs over `axis`.

    `inputs` selects the data arguments; by default the program says which
    they are (`partir.roles`): the arguments it does not return updated, of
    rank >= 1, sharing their leading dimension. Where they do not share it,
    the error lists them and the `inputs=` to write.
    """

    axis: str
    inputs: str | Sequence[str] | None = None
    dim: int = 0

    CLI_NAME = "partir-batch-parallel"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        """The data split on `dim`; the other arguments passed over, each
        with its role ("state", "scalar") and why (`Roles.describe`)."""
        if self.inputs is not None:
            leaves = program.find(self.inputs, who=self.name)
            chosen = {leaf.index for leaf in leaves}
            given = "selected by inputs="
            roles = [("data", given) if leaf.index in chosen else ("other", f"not {given}")
                     for leaf in program.arguments]
        else:
            found = Roles.of(program.arguments, program.results)
            data = found.data(program.arguments)
            if isinstance(data, str):
                raise TacticError(f"{self.name}: {data}")
            roles = [found.describe(leaf, data) for leaf in program.arguments]
        tiles = tuple(
            _plan(leaf, self.dim, self.axis, mesh, self.name, role, why)
            for leaf, (role, why) in zip(program.arguments, roles, strict=True)
            if role == "data"
        )
        passed = tuple(
            PassedLeaf(leaf, role, why)
            for leaf, (role, why) in zip(program.arguments, roles, strict=True)
            if role != "data"
        )
        return Plan(self.name, tiles, passed, tactic_label(self.name, self.axis))


def _named(
    names: Iterable[str], suffixes: Iterable[str] = ("", "/kernel", "/weight", "/w")
) -> tuple[str, ...]:
    return tuple(f"params/**/{n}{s}" for n in names for s in suffixes)


def _under(selectors: Sequence[str], roots: Sequence[str]) -> list[str]:
    """Default selectors written under `params/`, under each of `roots` instead
    (the parameters' roots `partir.roles` finds; `*`: any root)."""
    return [
        f"{root}/{selector.removeprefix('params/')}" for root in roots for selector in selectors
    ]


_ATTENTION_IN = (
    "q_proj", "k_proj", "v_proj", "query", "key", "value", "query_proj", "key_proj",
    "value_proj", "c_attn", "qkv", "w_qkv",
)
_MLP_IN = ("fc1", "c_fc", "wi", "up_proj", "gate_proj", "dense_h_to_4h")

MEGATRON_COLUMN = _named(
    (
        "wq",
        "wk",
        "wv",
        "w_q",
        "w_k",
        "w_v",
        *_ATTENTION_IN,
        "w_in",
        "w1",
        *_MLP_IN,
        "w_up",
        "w_gate",
    )
)
"""Weights `[in, out]` split on their output dim (attention heads, MLP hidden)."""

OUT_IN_WEIGHTS = ("weight",)
"""Leaf names of weights stored `[out, in]` (PyTorch's and equinox's
`Linear.weight`): Megatron splits the other of their last two dims."""

MEGATRON_COLUMN_BIAS = (
    *_named(("bq", "bk", "bv", "b_q", "b_k", "b_v", "b_in", "b1", "b_up", "b_gate"), ("",)),
    *_named((*_ATTENTION_IN, *_MLP_IN), ("/bias", "/b")),
)
"""Biases of the column-split weights, split the same way."""

MEGATRON_ROW = _named(
    (
        "wo",
        "w_o",
        "o_proj",
        "out_proj",
        "output_proj",
        "c_proj",
        "w_out",
        "w2",
        "fc2",
        "down_proj",
        "wo2",
        "dense_4h_to_h",
    )
)
"""Weights `[in, out]` split on their input dim (attention output, MLP second matmul)."""


def _megatron_dim(leaf: Leaf, dim: int) -> int:
    """`dim` (-1: output, -2: input, for `[in, out]`) in `leaf`'s layout."""
    if len(leaf.shape) >= 2 and slash_path(leaf.name).split("/")[-1] in OUT_IN_WEIGHTS:
        return -3 - dim  # -1 <-> -2
    return dim


@dataclass(frozen=True)
class Megatron(Tactic):
    """Tensor parallelism for transformer blocks (Megatron-LM's split) over `axis`.

    Column weights (q/k/v projections, the MLP's first weight) and their biases
    are split on their output (last) dim, so attention splits by heads and the
    MLP by hidden units; row weights (attention output projection, the MLP's
    second weight) on their input dim (`-2`); a weight stored `[out, in]`
    (named `weight`, `OUT_IN_WEIGHTS`) the other way round. Each block's
    forward pass then needs exactly two sums over `axis`. Names follow `MEGATRON_COLUMN`,
    `MEGATRON_COLUMN_BIAS` and `MEGATRON_ROW`, at any depth under the
    parameters' root whatever it is called (`partir.roles`; any root where
    the program does not say); pass your own selectors to override them.
    """

    axis: str
    column: Sequence[str] = MEGATRON_COLUMN
    column_bias: Sequence[str] = MEGATRON_COLUMN_BIAS
    row: Sequence[str] = MEGATRON_ROW

    CLI_NAME = "partir-megatron"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        roles = Roles.of(program.arguments, program.results)
        roots = roles.parameters or ("*",)
        kinds = (
            ("column weight", -1, self.column, MEGATRON_COLUMN, "column"),
            ("column bias", -1, self.column_bias, MEGATRON_COLUMN_BIAS, "column_bias"),
            ("row weight", -2, self.row, MEGATRON_ROW, "row"),
        )
        picks = []
        for role, dim, selectors, default, option in kinds:
            conventional = selectors is default
            if conventional:  # the conventions, under the parameters' roots
                selectors = _under(default, roots)
            for leaf in program.find(selectors, who=self.name, required=False):
                why = _megatron_reason(leaf, role, dim, conventional, option)
                picks.append((leaf, dim, role, why))
        if not picks:
            raise TacticError(
                f"{self.name}: no parameter is named like a Megatron column or row weight "
                "(e.g. params/**/wq or params/**/w_out); pass column=, row= selectors"
            )
        seen: set[int] = set()
        planned = []
        for leaf, dim, role, why in sorted(picks, key=lambda p: p[0].index):
            if leaf.index not in seen:
                seen.add(leaf.index)
                planned.append(
                    _plan(leaf, _megatron_dim(leaf, dim), self.axis, mesh, self.name, role, why)
                )
        defaults = all(selectors is default for _, _, selectors, default, _ in kinds)
        unnamed = "not named like a Megatron weight" if defaults else (
            "not selected by column=, column_bias= or row="
        )
        passed = tuple(
            PassedLeaf(leaf, "parameter", unnamed)
            for leaf in program.arguments
            if leaf.root in roles.parameters and leaf.index not in seen
        )
        return Plan(self.name, tuple(planned), passed, tactic_label(self.name, self.axis))


_MEGATRON_KINDS = {
    "column weight": "a q/k/v or MLP-in weight",
    "column bias": "the bias of a q/k/v or MLP-in weight",
    "row weight": "an attention-out or MLP-out weight",
}


def _megatron_reason(leaf: Leaf, role: str, dim: int, conventional: bool, option: str) -> str:
    """Why Megatron splits `leaf` where it does: the name it matched (or the
    option that selected it) and which of its dims, in its layout."""
    segments = slash_path(leaf.name).split("/")
    tail = segments[-2:] if segments[-1] in _LEAF_NAMES else segments[-1:]
    named = "/".join(tail).replace(KEY_SLASH, "/")
    why = f"named {named}, {_MEGATRON_KINDS[role]}" if conventional else f"selected by {option}="
    where = "output" if dim == -1 else "input"
    if _megatron_dim(leaf, dim) != dim:
        return f"{why}: split on its {where} dim (stored [out, in])"
    return f"{why}: split on its {where} dim" if role != "column bias" else f"{why}: split like it"


_LEAF_NAMES = ("kernel", "weight", "w", "bias", "b")
"""Leaf names a layer's weight or bias goes by (the layer is named one level up)."""


@dataclass(frozen=True)
class ZeRO(Tactic):
    """ZeRO sharding over the data axis: state split on dim 0 instead of replicated.

    - stage 1: the optimizer state (`opt_state`; by default the state that
      mirrors the parameters' tree, `partir.roles`: Adam's `m` and `v`);
    - stage 2: also the updated parameters and state the step returns
      (`updates`, default every result of rank >= 1): the update is computed
      shard by shard, so each gradient is only ever needed as a shard and
      propagation turns its all-reduce into a reduce-scatter;
    - stage 3: also the parameters themselves (`params`; by default the
      state the optimizer state mirrors, whatever its name), gathered where
      they are used.

    With the default selectors, a leaf is split on dim 0, padded for
    divisibility where the axis does not divide it (`rewrites.padding`); a
    leaf whose dim 0 has fewer elements than the axis has devices (flax's
    attention output kernel `[heads, head_dim, out]`, a stack of fewer
    layers) on the first dim that has enough (`zero_dim`), and scalars stay
    replicated. A selector you pass must select leaves whose dim 0 has at
    least one element per device.
    """

    axis: str
    stage: int = 3
    params: str | Sequence[str] | None = None
    opt_state: str | Sequence[str] | None = None
    updates: str | Sequence[str] | None = None

    CLI_NAME = "partir-zero"

    def _leaves(
        self,
        program: ProgramView,
        mesh: Mesh,
        given: str | Sequence[str] | None,
        default: Sequence[str],
        results: bool,
        role: str,
        why: Callable[[Leaf], str],
        passed: list[PassedLeaf],
    ) -> list[PlannedTile]:
        """The leaves `given` selects (dim 0), or by default those `default`
        selects, each on its `zero_dim` (those with none go to `passed`)."""
        parts = _axis_size(mesh, self.axis, self.name)
        option = "updates" if results else ("opt_state" if role == "optimizer state" else "params")
        if given is not None:
            return [
                _plan(leaf, 0, self.axis, mesh, self.name, role, f"selected by {option}=")
                for leaf in program.find(given, who=self.name, results=results)
            ]
        planned = []
        for leaf in program.find(default, who=self.name, results=results, required=False):
            dim = zero_dim(leaf.shape, parts)
            if dim is None:
                passed.append(PassedLeaf(leaf, role, f"{why(leaf)}; {_too_short(leaf, parts)}"))
                continue
            how = _zero_where(leaf.shape, dim, parts)
            reason = f"{why(leaf)}; {how}" if how else why(leaf)
            planned.append(PlannedTile(leaf, dim, self.axis, role, reason))
        return planned

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        if self.stage not in (1, 2, 3):
            raise TacticError(f"{self.name}: stage must be 1, 2 or 3, got {self.stage}")
        passed: list[PassedLeaf] = []
        roles = Roles.of(program.arguments, program.results)
        planned = self._leaves(
            program, mesh, self.opt_state, [f"{r}/**" for r in roles.optimizer],
            results=False, role="optimizer state",
            why=lambda leaf: roles.why_optimizer(leaf.root), passed=passed,
        )
        if self.stage >= 2:
            planned += self._leaves(
                program, mesh, self.updates, ["result/**"], results=True, role="update",
                why=lambda leaf: "returned by the step", passed=passed,
            )
        if self.stage >= 3:
            planned += self._leaves(
                program, mesh, self.params, [f"{r}/**" for r in roles.parameters],
                results=False, role="parameter",
                why=lambda leaf: roles.why_parameters(leaf.root), passed=passed,
            )
        if not planned:
            raise TacticError(
                f"{self.name}: nothing to shard (no optimizer state, updates "
                "or parameters with a dim 0 of at least one element per device)"
            )
        label = tactic_label(f"{self.name}-{self.stage}", self.axis)
        return Plan(self.name, tuple(planned), tuple(passed), label)


def _too_short(leaf: Leaf, parts: int) -> str:
    if not leaf.shape:
        return "a scalar, left whole"
    return f"no dim of {leaf.shape} has an element per device ({parts}), left whole"


def _zero_where(shape: tuple[int, ...], dim: int, parts: int) -> str:
    """Why ZeRO splits `dim` of `shape` and how: dim 0 too short, padding."""
    notes = [f"dim 0 has {shape[0]} elements, fewer than {parts} devices"] if dim else []
    if shape[dim] % parts:
        padded = -(-shape[dim] // parts) * parts
        notes.append(f"dim {dim} padded {shape[dim]} -> {padded}")
    return ", ".join(notes)


def zero_dim(shape: tuple[int, ...], parts: int) -> int | None:
    """The dim ZeRO splits a state leaf of `shape` on over `parts` devices:
    dim 0 where it has an element per device (padded where `parts` does not
    divide it), else the first dim `parts` divides, else the first with an
    element per device; None where no dim has (a scalar, a tiny vector).

    A leaf, its optimizer state and its update share a shape, so they agree."""
    if shape and shape[0] >= parts:
        return 0
    enough = [d for d, n in enumerate(shape) if n >= parts]
    divided = [d for d in enough if shape[d] % parts == 0]
    return next(iter(divided or enough), None)


@dataclass(frozen=True)
class Automatic(Tactic):
    """Search the rest of the schedule: partitioning actions on `axes`,
    evaluated by propagation, lowering and the cost model (`partir.search`).

    It comes after the manual tactics (PartIR's order: they fix what you
    decided, it decides the rest) and searches, by default, the mesh axes no
    earlier tactic uses. Candidates whose predicted peak memory per device
    exceeds `memory_limit_bytes` are rejected; the search stops after
    `time_budget_s` with the best candidate so far. `profile` names the
    machine it predicts for (a shipped profile's name or a JSON file; by
    default this machine's calibrated profile, `partir.cost.calibrate`).
    Deterministic for a `seed` when the search ends before the budget.
    What it chose is `chosen`, a schedule of tactics you can paste in its
    place (`lowered.searches`, `partir.search.SearchResult.schedule_source`).
    """

    axes: str | Sequence[str] | None = None
    time_budget_s: float = 60.0
    memory_limit_bytes: int | None = None
    profile: str | Profile | None = None
    seed: int = 0
    top_k: int = 5
    progress: bool = True
    """A progress bar on stderr while it searches."""
    chosen: tuple[Tactic, ...] | None = field(default=None, metadata={"pass_option": False})
    """The schedule a search chose (set on the copy `partir.partition`
    records, so replaying a partition applies it instead of searching again)."""

    CLI_NAME = "partir-auto"

    def search_axes(self, mesh: Mesh, used: set[str]) -> tuple[str, ...]:
        """The axes to search: those given, or the mesh's axes not in `used`
        (those the tactics before it split something over, as the module's
        selections record them); a `TacticError` if none is left."""
        if self.axes is not None:
            given = (self.axes,) if isinstance(self.axes, str) else tuple(self.axes)
            for axis in given:
                _axis_size(mesh, axis, self.name)
            return given
        free = tuple(a for a in mesh.axes if a not in used and mesh.axes[a] > 1)
        if not free:
            raise TacticError(
                f"{self.name}: the tactics before it use every mesh axis "
                f"({', '.join(quoted(a) for a in mesh.axes)}); pass axes= to search some of "
                "them again, or drop it"
            )
        return free

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        """No tiles of its own: the search (`partir.search`) runs on the
        program the earlier tactics left; this checks the options."""
        if self.axes is not None:
            given = (self.axes,) if isinstance(self.axes, str) else tuple(self.axes)
            for axis in given:
                _axis_size(mesh, axis, self.name)
        if not self.time_budget_s > 0:
            raise TacticError(f"{self.name}: time_budget_s must be > 0, got {self.time_budget_s}")
        limit = self.memory_limit_bytes
        if limit is not None and not limit > 0:
            raise TacticError(f"{self.name}: memory_limit_bytes must be > 0, got {limit}")
        return Plan(self.name, (), label=self.name)


@dataclass(frozen=True)
class Annotations(Tactic):
    """The shardings the program states itself, as tiling actions.

    Every `jax.lax.with_sharding_constraint` (a `NamedSharding`, or a bare
    `PartitionSpec` under `jax.set_mesh`), every `jax.sharding.reshard` and
    every explicit-mode argument or result sharding (`partir.annotations`)
    tiles its value as it says, each recorded with the user's line. User
    annotations win, as in PartIR and Shardy: `partition` runs this tactic
    first when the program holds annotations, unless the schedule places it;
    a later tactic that disagrees is a reported conflict. JAX's mesh must be
    partir's (the same axes, the same sizes). Applying it takes the
    constraints out of the program (each is its value)."""

    CLI_NAME = "partir-annotations"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        tiles: list[PlannedTile] = []
        for note in program.annotations:
            if not note.splits:
                continue
            self._check_mesh(note, mesh)
            leaf: Leaf | AnnotatedValue
            if note.kind == ARGUMENT:
                leaf = program.arguments[note.index]
            elif note.kind == RESULT:
                leaf = program.results[note.index]
            else:
                leaf = AnnotatedValue(note.index, note.value, note.kind, note.position)
            for dim, axes in enumerate(note.dims):
                for axis in axes:
                    if isinstance(leaf, Leaf):
                        tiles.append(_plan(leaf, dim, axis, mesh, self.name, "annotated",
                                           note.describe))
                    else:
                        tiles.append(PlannedTile(leaf, dim, axis, "annotated", note.describe))
        return Plan(self.name, tuple(tiles), label=self.name, removes_annotations=True)

    def _check_mesh(self, note: Annotation, mesh: Mesh) -> None:
        """JAX's mesh axes that `note` names are partir's, with the same sizes."""
        jax_mesh = dict(note.mesh_axes)
        shown = ", ".join(f"{quoted(a)}={n}" for a, n in note.mesh_axes) or "no axes"
        ours = ", ".join(f"{quoted(a)}={n}" for a, n in mesh.axes.items())
        named = [a for axes in note.dims for a in axes]
        for axis in named:
            size = jax_mesh.get(axis)
            if axis not in mesh.axes or (size is not None and size != mesh.axes[axis]):
                theirs = f"{quoted(axis)}={size}" if size is not None else quoted(axis)
                raise TacticError(
                    f"{self.name}: {note.describe} splits {note.value} as {note.spec} on JAX's "
                    f"mesh @{note.mesh_name} ({shown}), whose axis {theirs} partir's mesh "
                    f"({ours}) does not have; give partir.jit the mesh the program uses "
                    "(a jax.sharding.Mesh is accepted), or name partir's axes in the annotation"
                )
        if note.unreduced:
            raise TacticError(
                f"{self.name}: {note.describe} leaves {note.value} unreduced over "
                f"{', '.join(map(quoted, note.unreduced))}; partir decides where partial sums "
                "are reduced itself: drop the unreduced axes from the annotation"
            )


TACTICS: tuple[type[Tactic], ...] = (
    BatchParallel, Megatron, ZeRO, ManualPartition, Automatic, Annotations
)
"""Every tactic; each is also a `partir-opt` pass (`partir.passes.tactic_pass`)."""
