"""Transformer blocks in a parameter tree, found by structure, for Megatron.

Megatron's default conventions name the weights (`partir.tactics`); this
finds what names alone get wrong or miss, from the tree's shape:

- attention whose kernels keep the heads as a dim of their own (flax
  linen's and NNX's `query`/`key`/`value` `[in, heads, head_dim]`, `out`
  `[heads, head_dim, out]`): q/k/v are split on their heads dim (not
  head_dim, which would make the scores partial sums), their biases
  `[heads, head_dim]` alike, and the output projection on its heads dim;
- attention without a heads dim whose layers names alone do not reach
  (haiku's `'multi_head_attention/query'`, one key with its module, and
  its output projection `linear`): q/k/v on their output dim (heads-major,
  so by heads), the output projection beside them on its input dim;
- an MLP pair whose layers are named by position or freely (flax's
  `Dense_0`/`Dense_1`, `up`/`down`): two sibling layers `[d, h]` and
  `[h, d]` with `h > d`, split column (the widening one) then row.

A layer is a node holding a weight leaf (`kernel`, `weight`, `w`; `weight`
stored `[out, in]`) and maybe a bias (`bias`, `b`); haiku's module paths in
one key (`'multi_head_attention/query'`) count as nested layers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from partir.plan import Leaf
from partir.selectors import KEY_SLASH, slash_path

WEIGHT_NAMES = ("kernel", "weight", "w")
BIAS_NAMES = ("bias", "b")
LEAF_NAMES = (*WEIGHT_NAMES, *BIAS_NAMES)
"""Leaf names a layer's weight or bias goes by (the layer is named one level up)."""

OUT_IN_WEIGHTS = ("weight",)
"""Leaf names of weights stored `[out, in]` (PyTorch's and equinox's
`Linear.weight`): Megatron splits the other of their last two dims."""

QKV_NAMES = (
    "query", "key", "value", "q_proj", "k_proj", "v_proj", "query_proj", "key_proj",
    "value_proj", "wq", "wk", "wv", "w_q", "w_k", "w_v", "q", "k", "v",
)
"""Layers projecting attention's queries, keys or values (one each)."""

ATTENTION_OUT_NAMES = (
    "out", "o_proj", "out_proj", "output_proj", "wo", "w_o", "o", "linear", "output", "dense",
)
"""Layers that, beside query/key/value, are attention's output projection."""


@dataclass(frozen=True)
class Layer:
    """One layer: its weight (rank >= 2) and bias leaves, by its path."""

    path: tuple[str, ...]
    weight: Leaf
    bias: Leaf | None

    @property
    def name(self) -> str:
        return self.path[-1].replace(KEY_SLASH, "/")

    @property
    def out_in(self) -> bool:
        return slash_path(self.weight.name).split("/")[-1] in OUT_IN_WEIGHTS

    @property
    def in_out(self) -> tuple[int, int]:
        """(inputs, outputs) of its last two dims, in either layout."""
        a, b = self.weight.shape[-2:]
        return (b, a) if self.out_in else (a, b)

    def shown(self) -> str:
        return f"{self.name}/{slash_path(self.weight.name).split('/')[-1]}"


@dataclass(frozen=True)
class BlockSplit:
    """Split `leaf` on `dim` (negative, in its own layout) as `role`, and why."""

    leaf: Leaf
    dim: int
    role: str
    reason: str


def layers(leaves: Sequence[Leaf]) -> list[Layer]:
    """The layers among `leaves`: nodes with a weight of rank >= 2."""
    found: dict[tuple[str, ...], dict[str, Leaf]] = defaultdict(dict)
    for leaf in leaves:
        parts = slash_path(leaf.name).replace(KEY_SLASH, "/").split("/")
        if len(parts) > 1 and parts[-1] in LEAF_NAMES:
            found[tuple(parts[:-1])][parts[-1]] = leaf
    out = []
    for path, named in found.items():
        weight = next((named[n] for n in WEIGHT_NAMES if n in named), None)
        if weight is not None and len(weight.shape) >= 2:
            bias = next((named[n] for n in BIAS_NAMES if n in named), None)
            out.append(Layer(path, weight, bias))
    return out


def block_splits(leaves: Sequence[Leaf], named: Collection[int] = ()) -> list[BlockSplit]:
    """Megatron's splits that the tree's structure says (see the module
    docstring), for the parameter `leaves`; an MLP pair is looked for among
    the layers whose weight is not `named` (the conventions' picks, by index)."""
    siblings: dict[tuple[str, ...], list[Layer]] = defaultdict(list)
    for layer in layers(leaves):
        siblings[layer.path[:-1]].append(layer)
    splits: list[BlockSplit] = []
    in_attention: set[tuple[str, ...]] = set()
    stacked = 0  # leading dims of a stack of layers (nn.scan's), from attention's kernels
    for parent, group in siblings.items():
        qkv = [layer for layer in group if layer.name in QKV_NAMES]
        outs = [layer for layer in group if layer.name in ATTENTION_OUT_NAMES]
        if len(qkv) < 2 or len(outs) != 1:
            continue
        (out,) = outs
        in_attention |= {layer.path for layer in (*qkv, out)}
        heads = _heads_layout(qkv, out)
        stacked = len(out.weight.shape) - (3 if heads else 2)
        where = "/".join(parent).replace(KEY_SLASH, "/")
        splits += _attention_splits(qkv, out, heads, where, named)
    for group in siblings.values():
        free = [
            layer for layer in group
            if layer.path not in in_attention and layer.weight.index not in named
            and len(layer.weight.shape) == 2 + stacked
        ]
        splits += _mlp_pair_splits(free)
    return splits


def _heads_layout(qkv: list[Layer], out: Layer) -> bool:
    """Whether q/k/v are `[in, heads, head_dim]` and out `[heads, head_dim,
    out]` (after any stacked dims): flax's `LinearGeneral` kernels."""
    rank = len(out.weight.shape)
    return rank >= 3 and not out.out_in and all(
        len(layer.weight.shape) == rank and not layer.out_in
        and layer.weight.shape[-2:] == out.weight.shape[-3:-1]
        for layer in qkv
    )


def _attention_splits(
    qkv: list[Layer], out: Layer, heads: bool, parent: str, named: Collection[int]
) -> list[BlockSplit]:
    """q/k/v column, out row: on their heads dims in the heads layout (over
    what their names said), else on their output and input dims, for the
    layers their names did not already pick (haiku's `query`, `linear` in
    one key with their module)."""
    names = "/".join(layer.name for layer in qkv)
    where = f"attention {parent}" if parent else "attention"
    splits = []
    if heads:
        for layer in qkv:
            why = f"{layer.shown()} [in, heads, head_dim] of {where}: split on its heads dim"
            splits.append(BlockSplit(layer.weight, -2, "column weight", why))
            if layer.bias is not None and len(layer.bias.shape) >= 2:
                why = f"{layer.name}'s bias [heads, head_dim]: split on its heads dim"
                splits.append(BlockSplit(layer.bias, -2, "column bias", why))
        why = (f"{out.shown()} [heads, head_dim, out], the output projection of {where}: "
               "split on its heads dim")
        return [*splits, BlockSplit(out.weight, -3, "row weight", why)]
    stored = " (stored [out, in])"
    for layer in qkv:
        if layer.weight.index in named:
            continue
        why = f"{layer.shown()}, a q/k/v projection of {where}: split on its output dim"
        why += stored if layer.out_in else ""
        splits.append(BlockSplit(layer.weight, -2 if layer.out_in else -1, "column weight", why))
        if layer.bias is not None:
            splits.append(BlockSplit(layer.bias, -1, "column bias",
                                     f"{layer.name}'s bias: split like it"))
    if out.weight.index not in named:
        why = f"{out.shown()}, the output projection beside {names}: split on its input dim"
        why += stored if out.out_in else ""
        splits.append(BlockSplit(out.weight, -1 if out.out_in else -2, "row weight", why))
    return splits


def _mlp_pair_splits(free: list[Layer]) -> list[BlockSplit]:
    """Two sibling layers `[d, h]` and `[h, d]`, `h > d` (and nothing else
    of their rank beside them): column then row."""
    if len(free) != 2:
        return []
    first, second = sorted(free, key=lambda layer: layer.in_out[1] < layer.in_out[0])
    (d, h), (h2, d2) = first.in_out, second.in_out
    leading = first.weight.shape[:-2] == second.weight.shape[:-2]
    if not (leading and h == h2 and d == d2 and h > d):
        return []
    pair = f"the MLP pair {first.shown()} [{d}, {h}] then {second.shown()} [{h}, {d}]"
    column_dim, row_dim = (-2, -1) if first.out_in else (-1, -2)
    if second.out_in != first.out_in:
        row_dim = -1 if second.out_in else -2
    splits = [BlockSplit(first.weight, column_dim, "column weight",
                         f"{first.shown()}, the first of {pair}: split on its output dim")]
    if first.bias is not None:
        splits.append(BlockSplit(first.bias, -1, "column bias",
                                 f"{first.name}'s bias, the first of {pair}: split like it"))
    splits.append(BlockSplit(second.weight, row_dim, "row weight",
                             f"{second.shown()}, the second of {pair}: split on its input dim"))
    return splits
