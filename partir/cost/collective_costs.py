"""How long a collective takes: α-β over the links its group crosses.

A group of n devices spread over levels (n_1 devices per innermost unit,
n_2 units per next, ..., `Profile.axis_levels`) runs each collective
hierarchically, innermost level first, as NCCL and XLA's collective
libraries do; on one level of n_k devices with latency α_k and per-device
bandwidth β_k, a ring (DistPar's appendix A.3) costs, for B bytes:

- reduce-scatter of B (input):   (n_k - 1) α_k + (n_k - 1)/n_k · B / β_k,
  after which each device holds B/n_k for the next level;
- all-gather to B (output): the same, levels in the other order;
- all-reduce of B: a reduce-scatter then an all-gather (2 (n-1)/n · B/β on
  one level: the busbw figure nccl-tests reports is B/t · 2(n-1)/n);
- all-to-all of B: every device keeps 1/n_k of its data on each level and
  sends the rest, (n_k - 1) α_k + (n_k - 1)/n_k · B / β_k;
- collective permute of B: one hop, α + B / β over the outermost level crossed.

XLA's combiner merges all-reduces over the same group that do not depend
on each other (a step's gradient sums) into one: the group pays α once, for
all their bytes (`combined_seconds`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from xdsl.ir import Block, SSAValue

from dialects.spmd import CollectiveOp
from partir.cost.profile import Link, Profile


def _scatter(levels: list[tuple[int, Link]], nbytes: float) -> float:
    """A hierarchical reduce-scatter of `nbytes` (all-gather to `nbytes` mirrors it)."""
    seconds = 0.0
    for n, link in levels:
        seconds += (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth
        nbytes /= n
    return seconds


def collective_seconds(
    kind: str, nbytes: float, levels: list[tuple[int, Link]]
) -> float:
    """Seconds for collective `kind` moving `nbytes` (the larger of its
    per-device input and output) over `levels`."""
    if not levels:
        return 0.0
    if kind == "all_reduce":
        return 2 * _scatter(levels, nbytes)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return _scatter(levels, nbytes)
    if kind == "collective_permute":
        outer = levels[-1][1]
        return outer.latency_s + nbytes / outer.bandwidth
    raise KeyError(f"no cost model for collective {kind!r} in partir.cost.collective_costs")


def op_seconds(op: CollectiveOp, mesh: Mapping[str, int], profile: Profile) -> float:
    """Seconds `op` takes on `profile`, its group being its axes of `mesh`
    (the op says its `kind` and `bytes_per_device`)."""
    if not op.communicates:
        return 0.0
    levels = profile.axis_levels(mesh, op.axis_names)
    return collective_seconds(op.kind, op.bytes_per_device, levels)


COMBINED_KINDS = frozenset({"all_reduce"})
"""The collectives XLA's combiner merges when independent (on CPU it does
not merge reduce-scatters or all-gathers: their counts in the compiled HLO
are the program's)."""


def combined_seconds(
    block: Block, mesh: Mapping[str, int], profile: Profile
) -> dict[CollectiveOp, float]:
    """Seconds of each collective of `block` that XLA combines with others:
    those of a `COMBINED_KINDS` kind over the same axes at the same depth
    (the number of collectives on the longest path of values leading to
    it, so none of them depends on another) run as one collective of their
    summed bytes, each taking its share by bytes. Collectives not combined
    are left out (`op_seconds`)."""
    depth: dict[SSAValue, int] = {}
    groups: dict[tuple[str, tuple[str, ...], int], list[CollectiveOp]] = defaultdict(list)
    for op in block.ops:
        level = max((depth.get(v, 0) for v in op.operands), default=0)
        if isinstance(op, CollectiveOp) and op.communicates:
            if op.kind in COMBINED_KINDS:
                groups[(op.kind, op.axis_names, level)].append(op)
            level += 1
        for result in op.results:
            depth[result] = level
    seconds: dict[CollectiveOp, float] = {}
    for (kind, axes, _), ops in groups.items():
        if len(ops) < 2:
            continue
        total = sum(op.bytes_per_device for op in ops)
        together = collective_seconds(kind, total, profile.axis_levels(mesh, axes))
        for op in ops:
            seconds[op] = together * op.bytes_per_device / max(total, 1)
    return seconds
