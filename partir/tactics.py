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
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from dialects.errors import PartirTypeError
from dialects.escaping import quoted
from partir.annotations import ARGUMENT, RESULT, Annotation
from partir.blocks import LEAF_NAMES, OUT_IN_WEIGHTS, block_splits
from partir.mesh import Mesh
from partir.plan import (
    AnnotatedValue,
    Leaf,
    PassedLeaf,
    Plan,
    PlannedTile,
    ProgramView,
    ReferencedValue,
    ReturnedWhole,
    TacticError,
    tactic_label,
)
from partir.roles import Roles
from partir.selectors import KEY_SLASH, display_path, glob_escaped, slash_path
from partir.values import ValueReference, ValueReferenceError, is_reference

if TYPE_CHECKING:
    from partir.cost.profile import Profile

__all__ = [
    "EXPERT_WEIGHTS",
    "MEGATRON_COLUMN",
    "MEGATRON_COLUMN_BIAS",
    "MEGATRON_ROW",
    "TACTICS",
    "Annotations",
    "Automatic",
    "BatchParallel",
    "ExpertParallel",
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
    """Base class: `plan` returns the tiling actions, validated, without rewriting.

    Subclasses are dataclasses with `repr=False`, so they print as the short
    call `Tactic.__repr__` writes."""

    CLI_NAME: ClassVar[str]
    """The `partir-opt` pass running this tactic (its options are the fields)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        raise NotImplementedError

    def __repr__(self) -> str:
        """The call that makes this tactic: required fields by position, the
        others only where they differ from their default (Megatron's ~250
        default selectors are not printed)."""
        shown = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is MISSING and f.default_factory is MISSING:
                shown.append(repr(value))
            elif value is not f.default and value != f.default:
                shown.append(f"{f.name}={value!r}")
        return f"{self.name}({', '.join(shown)})"

    @classmethod
    def from_options(cls, **options: Any) -> Tactic:
        """The tactic a pass's options describe; an option left unset (None)
        takes the field's default."""
        return cls(**{k: v for k, v in options.items() if v is not None})


@dataclass(frozen=True, repr=False)
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


@dataclass(frozen=True, repr=False)
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
        tiles, passed = _data_tiles(self.name, self.axis, self.inputs, self.dim, program, mesh)
        return Plan(self.name, tiles, passed, tactic_label(self.name, self.axis))


def _data_tiles(
    who: str,
    axis: str,
    inputs: str | Sequence[str] | None,
    dim: int,
    program: ProgramView,
    mesh: Mesh,
    role: str = "data",
) -> tuple[tuple[PlannedTile, ...], tuple[PassedLeaf, ...]]:
    """The data arguments (`inputs`, or those `partir.roles` finds) split on
    `dim` over `axis`, taken for `role`; the other arguments passed over."""
    if inputs is not None:
        leaves = program.find(inputs, who=who)
        chosen = {leaf.index for leaf in leaves}
        given = "selected by inputs="
        roles = [("data", given) if leaf.index in chosen else ("other", f"not {given}")
                 for leaf in program.arguments]
    else:
        found = program.roles
        data = found.data(program.arguments, _axis_size(mesh, axis, who))
        if isinstance(data, str):
            raise TacticError(f"{who}: {data}")
        roles = [found.describe(leaf, data) for leaf in program.arguments]
    tiles = tuple(
        _plan(leaf, dim, axis, mesh, who, role, why)
        for leaf, (kind, why) in zip(program.arguments, roles, strict=True)
        if kind == "data"
    )
    passed = tuple(
        PassedLeaf(leaf, kind, why)
        for leaf, (kind, why) in zip(program.arguments, roles, strict=True)
        if kind != "data"
    )
    return tiles, passed


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


@dataclass(frozen=True, repr=False)
class Megatron(Tactic):
    """Tensor parallelism for transformer blocks (Megatron-LM's split) over `axis`.

    Column weights (q/k/v projections, the MLP's first weight) and their biases
    are split on their output (last) dim, so attention splits by heads and the
    MLP by hidden units; row weights (attention output projection, the MLP's
    second weight) on their input dim (`-2`); a weight stored `[out, in]`
    (named `weight`, `OUT_IN_WEIGHTS`) the other way round. Each block's
    forward pass then needs exactly two sums over `axis`. Names follow `MEGATRON_COLUMN`,
    `MEGATRON_COLUMN_BIAS` and `MEGATRON_ROW`, at any depth under the
    parameters (`partir.roles`: an argument whatever it is called, or the
    model's part of a combined NNX state; any root where the program does
    not say), and with the defaults the tree's structure adds what names
    miss (`partir.blocks`): attention kernels with a heads dim of their own
    (flax's `[in, heads, head_dim]`) split on heads, a generically named
    output projection, an MLP pair named by position. A leaf named like a
    weight but of too low a rank (a counter, a scalar) is left whole. Pass
    your own selectors to override them; each must select an argument.
    """

    axis: str
    column: Sequence[str] = MEGATRON_COLUMN
    column_bias: Sequence[str] = MEGATRON_COLUMN_BIAS
    row: Sequence[str] = MEGATRON_ROW

    CLI_NAME = "partir-megatron"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        roles = program.roles
        roots = [glob_escaped(node) for node in roles.parameters] or ["*"]
        kinds = (
            ("column weight", -1, self.column, MEGATRON_COLUMN, "column"),
            ("column bias", -1, self.column_bias, MEGATRON_COLUMN_BIAS, "column_bias"),
            ("row weight", -2, self.row, MEGATRON_ROW, "row"),
        )
        defaults = all(selectors is default for _, _, selectors, default, _ in kinds)
        trained = [
            leaf for leaf in program.arguments
            if not roles.parameters or roles.parameters_of(leaf) is not None
        ]
        chosen = {leaf.index for leaf in trained}
        picks: dict[int, tuple[Leaf, int, str, str]] = {}
        skipped: dict[int, str] = {}
        for role, dim, selectors, default, option in kinds:
            conventional = selectors is default
            if conventional:  # the conventions, under the parameters' nodes
                found = program.find(_under(default, roots), who=self.name, required=False)
            else:  # each of yours selects something, as in ManualPartition
                found = _each_selects(program, selectors, self.name, option)
            for leaf in found:
                if leaf.index in picks or (conventional and leaf.index not in chosen):
                    continue
                rank = 1 if role == "column bias" else 2
                if conventional and len(leaf.shape) < rank:
                    skipped[leaf.index] = f"named like a {role}, but of rank {len(leaf.shape)}"
                    continue
                why = _megatron_reason(leaf, role, dim, conventional, option)
                picks[leaf.index] = (leaf, _megatron_dim(leaf, dim), role, why)
        if defaults:  # what the structure says: heads dims, generic names
            for split in block_splits(trained, named=set(picks)):
                picks[split.leaf.index] = (split.leaf, split.dim, split.role, split.reason)
        if not picks:
            raise TacticError(
                f"{self.name}: no parameter is named like a Megatron column or row weight "
                "(e.g. params/**/wq or params/**/w_out); pass column=, row= selectors"
            )
        planned = [
            _plan(leaf, dim, self.axis, mesh, self.name, role, why)
            for leaf, dim, role, why in sorted(picks.values(), key=lambda p: p[0].index)
        ]
        unnamed = "not named like a Megatron weight" if defaults else (
            "not selected by column=, column_bias= or row="
        )
        passed = tuple(
            PassedLeaf(leaf, "parameter", skipped.get(leaf.index, unnamed))
            for leaf in program.arguments
            if leaf.index not in picks and roles.parameters_of(leaf) is not None
        )
        return Plan(self.name, tuple(planned), passed, tactic_label(self.name, self.axis))


def _each_selects(
    program: ProgramView, selectors: str | Sequence[str], who: str, option: str
) -> list[Leaf]:
    """The leaves `selectors` (a `Megatron` option) select; a `TacticError`
    naming one that selects nothing."""
    given = [selectors] if isinstance(selectors, str) else list(selectors)
    found: list[Leaf] = []
    for selector in given:
        found += program.find(selector, who=f"{who} {option}=")
    return found


_MEGATRON_KINDS = {
    "column weight": "a q/k/v or MLP-in weight",
    "column bias": "the bias of a q/k/v or MLP-in weight",
    "row weight": "an attention-out or MLP-out weight",
}


def _megatron_reason(leaf: Leaf, role: str, dim: int, conventional: bool, option: str) -> str:
    """Why Megatron splits `leaf` where it does: the name it matched (or the
    option that selected it) and which of its dims, in its layout."""
    segments = slash_path(leaf.name).split("/")
    tail = segments[-2:] if segments[-1] in LEAF_NAMES else segments[-1:]
    named = "/".join(tail).replace(KEY_SLASH, "/")
    why = f"named {named}, {_MEGATRON_KINDS[role]}" if conventional else f"selected by {option}="
    where = "output" if dim == -1 else "input"
    if _megatron_dim(leaf, dim) != dim:
        return f"{why}: split on its {where} dim (stored [out, in])"
    return f"{why}: split on its {where} dim" if role != "column bias" else f"{why}: split like it"




EXPERT_WEIGHTS = ("**/*expert*", "**/*expert*/**")
"""Leaves named like a mixture-of-experts layer's stacked weights
(`experts_w1`, `moe/experts/w_in`), under the parameters' roots."""


@dataclass(frozen=True, repr=False)
class ExpertParallel(Tactic):
    """Expert parallelism in GShard's layout over `axis`: the experts' stacked
    weights split on their expert dim (`expert_dim`), the tokens (the data
    arguments, as `BatchParallel` finds them, or `inputs=`) on `token_dim`.

    After a `BatchParallel` on another axis the tokens are split over every
    device and the experts over `axis`. Propagation then meets each expert
    einsum with the tokens split one way and the weights another; it keeps
    the weights split and sends the dispatched tokens to their experts'
    devices by all-to-all (and the results back), unless gathering the
    weights moves fewer bytes (`rewrites.conflicts.cheaper_exchange`); the
    report's conflicts say which was given up. `experts` selects the weights
    (default `EXPERT_WEIGHTS` under the parameters' roots); the selected
    leaves must agree on the number of experts. A layer that runs every
    token through every expert (no dispatch, so no expert dim on the tokens'
    side) has nothing to exchange and gathers the weights: split only the
    weights there (`ManualPartition`).
    """

    axis: str
    experts: str | Sequence[str] | None = None
    inputs: str | Sequence[str] | None = None
    expert_dim: int = 0
    token_dim: int = 0

    CLI_NAME = "partir-expert-parallel"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        """The tokens first (their action is the earlier one), then the experts."""
        roles = program.roles
        tokens, _ = _data_tiles(
            self.name, self.axis, self.inputs, self.token_dim, program, mesh, "token"
        )
        if self.experts is None:
            roots = [glob_escaped(node) for node in roles.parameters] or ["*"]
            selectors = [f"{root}/{glob}" for root in roots for glob in EXPERT_WEIGHTS]
            found = program.find(selectors, who=self.name, required=False)
            if not found:
                raise TacticError(
                    f"{self.name}: no parameter is named like an expert weight "
                    f"({', '.join(EXPERT_WEIGHTS)} under {', '.join(roots)}); "
                    'pass experts=, e.g. experts=["params/w_in", "params/w_out"]'
                )
            why = "named like an expert weight"
        else:
            found = program.find(self.experts, who=self.name)
            why = "selected by experts="
        counts = self._expert_counts(found)
        reason = f"{why}: split on its expert dim ({next(iter(counts))} experts)"
        experts = tuple(
            _plan(leaf, self.expert_dim, self.axis, mesh, self.name, "expert weight", reason)
            for leaf in found
        )
        split = {leaf.index for leaf in found}
        passed = tuple(
            PassedLeaf(leaf, "parameter", "not an expert weight")
            for leaf in program.arguments
            if roles.parameters_of(leaf) is not None and leaf.index not in split
        )
        return Plan(self.name, tokens + experts, passed, tactic_label(self.name, self.axis))

    def _expert_counts(self, leaves: Sequence[Leaf]) -> dict[int, list[Leaf]]:
        """The selected leaves by their size on `expert_dim`: one size (the
        number of experts), or a `TacticError` listing them."""
        counts: dict[int, list[Leaf]] = {}
        for leaf in leaves:
            rank = len(leaf.shape)
            if not -rank <= self.expert_dim < rank:
                raise TacticError(
                    f"{self.name}: {leaf.name} has shape {leaf.shape}, which has no expert dim "
                    f"{self.expert_dim}; select only the experts' stacked weights with experts="
                )
            counts.setdefault(leaf.shape[self.expert_dim], []).append(leaf)
        if len(counts) > 1:
            sizes = "; ".join(
                f"{n}: {', '.join(display_path(leaf.name) for leaf in group[:3])}"
                for n, group in sorted(counts.items())
            )
            raise TacticError(
                f"{self.name}: the selected expert weights disagree on the number of experts "
                f"(dim {self.expert_dim}: {sizes}); select only the experts' stacked weights "
                "with experts=, or set expert_dim="
            )
        return counts


@dataclass(frozen=True, repr=False)
class ZeRO(Tactic):
    """ZeRO sharding over the data axis: state split on dim 0 instead of replicated.

    - stage 1: the optimizer state (`opt_state`; by default the state that
      mirrors the parameters' tree, `partir.roles`: Adam's `m` and `v`); the
      updated parameters return as they came, whole over `axis` (the step
      all-gathers each update's shards, in `.collectives` and the estimate);
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
    replicated. After other tactics the dim is picked from the per-device
    shape they leave (`ProgramView.splits`), and a leaf they split over
    `axis` already is left so. A selector you pass must select leaves whose
    dim 0 has at least one element per device.
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
        trained: Callable[[Leaf], str | None] | None = None,
    ) -> list[PlannedTile]:
        """The leaves `given` selects (dim 0), or by default those `default`
        selects, each on its `zero_dim` (those with none go to `passed`, and
        so do the state beside the parameters that `trained` says is none:
        NNX's RNG counters)."""
        parts = _axis_size(mesh, self.axis, self.name)
        option = "updates" if results else ("opt_state" if role == "optimizer state" else "params")
        if given is not None:
            return [
                self._given(program, leaf, mesh, role, f"selected by {option}=")
                for leaf in program.find(given, who=self.name, results=results)
            ]
        planned = []
        for leaf in program.find(default, who=self.name, results=results, required=False):
            if trained is not None and trained(leaf) is None:
                passed.append(PassedLeaf(leaf, "state", "beside the parameters, not trained "
                                         "(no optimizer state mirrors it), left whole"))
                continue
            earlier = program.splits.get(leaf.name, ())
            if any(axis == self.axis for _, axis in earlier):
                already = f"already split over {quoted(self.axis)} by the tactics before, left so"
                passed.append(PassedLeaf(leaf, role, f"{why(leaf)}; {already}"))
                continue
            shape = program.local_shape(leaf, mesh)  # per device, after the tactics before
            dim = zero_dim(shape, parts, split=[d for d, _ in earlier])
            if dim is None:
                short = _too_short(leaf, shape, parts)
                passed.append(PassedLeaf(leaf, role, f"{why(leaf)}; {short}"))
                continue
            how = _zero_where(shape, dim, parts)
            reason = f"{why(leaf)}; {how}" if how else why(leaf)
            planned.append(PlannedTile(leaf, dim, self.axis, role, reason))
        return planned

    def _given(
        self, program: ProgramView, leaf: Leaf, mesh: Mesh, role: str, reason: str
    ) -> PlannedTile:
        """A leaf a selector named, on dim 0: refused where the tactics
        before leave dim 0 too short per device to split over the axis."""
        planned = _plan(leaf, 0, self.axis, mesh, self.name, role, reason)
        parts = mesh.axes[self.axis]
        earlier = program.splits.get(leaf.name, ())
        local = program.local_shape(leaf, mesh)
        over = [quoted(a) for d, a in earlier if d == 0]
        if over and (self.axis in [a for d, a in earlier] or local[0] < parts or local[0] % parts):
            raise TacticError(
                f"{self.name}: {leaf.name}'s dim 0 is already split over {', '.join(over)} by "
                f"the tactics before, {local[0]} elements per device, which {quoted(self.axis)} "
                f"({parts} devices) cannot split again; leave {leaf.name} out of the selector, "
                "or use the default selectors (they pick the dim from the per-device shape)"
            )
        return planned

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        if self.stage not in (1, 2, 3):
            raise TacticError(f"{self.name}: stage must be 1, 2 or 3, got {self.stage}")
        passed: list[PassedLeaf] = []
        roles = program.roles
        planned = self._leaves(
            program, mesh, self.opt_state, [f"{glob_escaped(r)}/**" for r in roles.optimizer],
            results=False, role="optimizer state",
            why=lambda leaf: roles.why_optimizer(str(roles.optimizer_of(leaf))), passed=passed,
        )
        whole: tuple[ReturnedWhole, ...] = ()
        if self.stage == 1:
            whole = self._returned_whole(program, roles)
        if self.stage >= 2:
            planned += self._leaves(
                program, mesh, self.updates, ["result/**"], results=True, role="update",
                why=lambda leaf: "returned by the step", passed=passed,
            )
        if self.stage >= 3:
            planned += self._leaves(
                program, mesh, self.params, [f"{glob_escaped(r)}/**" for r in roles.parameters],
                results=False, role="parameter",
                why=lambda leaf: roles.why_parameters(str(roles.parameters_of(leaf))),
                passed=passed, trained=roles.parameters_of,
            )
        if not planned:
            split = [p for p in passed if "already split over" in p.reason]
            if split:
                raise TacticError(
                    f"{self.name}: nothing to shard: the tactics before split every leaf it "
                    f"would ({display_path(split[0].leaf.name)}, ...) over "
                    f"{quoted(self.axis)} already; give ZeRO another axis"
                )
            raise TacticError(
                f"{self.name}: nothing to shard (no optimizer state, updates "
                "or parameters with a dim 0 of at least one element per device)"
            )
        label = tactic_label(f"{self.name}-{self.stage}", self.axis)
        return Plan(self.name, tuple(planned), tuple(passed), label, whole)

    def _returned_whole(self, program: ProgramView, roles: Roles) -> tuple[ReturnedWhole, ...]:
        """Stage 1 returns the updated parameters as they came: whole over
        the axis (the step gathers each update's shards), which stage 2
        leaves split."""
        came_split = set()  # the result paths of parameters split over the axis already
        for node in roles.parameters:
            result = roles.returned_node(node)
            for leaf in program.arguments:
                path = slash_path(leaf.name)
                earlier = program.splits.get(leaf.name, ())
                under = path == node or path.startswith(f"{node}/")
                if under and result is not None and any(a == self.axis for _, a in earlier):
                    came_split.add(result + path[len(node):])
        nodes = [n for n in map(roles.returned_node, roles.parameters) if n is not None]
        leaves = [
            leaf for leaf in program.results
            if any(f"{slash_path(leaf.name)}/".startswith(f"{n}/") for n in nodes)
            and slash_path(leaf.name) not in came_split
        ]
        reason = "returned whole as the parameters came (ZeRO-2 returns them split)"
        return tuple(ReturnedWhole(leaf, self.axis, "updated parameter", reason) for leaf in leaves)


def _too_short(leaf: Leaf, shape: tuple[int, ...], parts: int) -> str:
    if not shape:
        return "a scalar, left whole"
    local = f" ({shape} per device after the tactics before)" if shape != leaf.shape else ""
    return f"no dim of {leaf.shape}{local} has an element per device ({parts}), left whole"


def _zero_where(shape: tuple[int, ...], dim: int, parts: int) -> str:
    """Why ZeRO splits `dim` of `shape` and how: dim 0 too short, padding."""
    notes = [f"dim 0 has {shape[0]} elements, fewer than {parts} devices"] if dim else []
    if shape[dim] % parts:
        padded = -(-shape[dim] // parts) * parts
        notes.append(f"dim {dim} padded {shape[dim]} -> {padded}")
    return ", ".join(notes)


def zero_dim(shape: tuple[int, ...], parts: int, split: Sequence[int] = ()) -> int | None:
    """The dim ZeRO splits a state leaf of `shape` (per device) on over
    `parts` devices: dim 0 where it has an element per device (padded where
    `parts` does not divide it), else the first dim `parts` divides, else
    the first with an element per device; None where no dim has (a scalar, a
    tiny vector). A dim in `split` (split by the tactics before) only where
    `parts` divides it, unpadded.

    A leaf, its optimizer state and its update share a shape, so they agree."""
    usable = [d for d, n in enumerate(shape) if d not in split or n % parts == 0]
    if 0 in usable and shape[0] >= parts:
        return 0
    enough = [d for d in usable if shape[d] >= parts]
    divided = [d for d in enough if shape[d] % parts == 0]
    return next(iter(divided or enough), None)


@dataclass(frozen=True, repr=False)
class Automatic(Tactic):
    """Search the rest of the schedule: partitioning actions on `axes`,
    evaluated by propagation, lowering and the cost model (`partir.search`).

    It comes after the manual tactics (PartIR's order: they fix what you
    decided, it decides the rest) and searches, by default, the mesh axes no
    earlier tactic uses. Candidates whose predicted peak memory per device
    exceeds `memory_limit_bytes` are rejected; the search stops after
    `time_budget_s` with the best candidate so far. `profile` names the
    machine it predicts for (a shipped profile's name or a JSON file; by
    default the shipped `cpu-host-8`; `"calibrated"` for this machine's
    profile as `partir.calibrate` saved it).
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
    """A progress bar and the top candidates on stderr; without it, only the pick."""
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


@dataclass(frozen=True, repr=False)
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
    constraints out of the program (each is its value), except a reshard
    of a value already stated split otherwise, kept as a value of its own
    (`partir.annotations.is_reshard`). IR with no locations (`partir-opt`
    on text printed without debug info) cannot tell JAX's own replicated
    constraints from the user's: each is taken as stated, and a tactic
    splitting one is a reported conflict saying so
    (`partir.annotations.states_replication`)."""

    CLI_NAME = "partir-annotations"

    def plan(self, program: ProgramView, mesh: Mesh) -> Plan:
        tiles: list[PlannedTile] = []
        kept: list[PassedLeaf] = []
        for note in program.annotations:
            if note.kept_whole:  # no tile: the value stays whole, as stated
                kept.append(PassedLeaf(AnnotatedValue(note.index, note.value, note.kind),
                                       "annotated", note.describe))
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
        return Plan(self.name, tuple(tiles), tuple(kept), label=self.name,
                    removes_annotations=True)

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
    BatchParallel, Megatron, ExpertParallel, ZeRO, ManualPartition, Automatic, Annotations
)
"""Every tactic; each is also a `partir-opt` pass (`partir.passes.tactic_pass`)."""
