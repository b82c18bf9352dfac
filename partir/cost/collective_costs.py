"""How long a collective takes: α-β over the links its group crosses.

A group of n devices spread over levels (n_1 devices per innermost unit,
n_2 units per next, ..., `Profile.axis_levels`) runs each collective
hierarchically, innermost level first, as NCCL and XLA's collective
libraries do. On a `RING` level of n_k devices with latency α_k and
per-device bandwidth β_k, a ring (DistPar's appendix A.3) costs, for B bytes:

- reduce-scatter of B (input):   (n_k - 1) α_k + (n_k - 1)/n_k · B / β_k,
  after which each device holds B/n_k for the next level;
- all-gather to B (output): the same, levels in the other order;
- all-reduce of B: a reduce-scatter then an all-gather (2 (n-1)/n · B/β on
  one level: the busbw figure nccl-tests reports is B/t · 2(n-1)/n);
- all-to-all of B: every device keeps 1/n_k of its data on each level and
  sends the rest, (n_k - 1) α_k + (n_k - 1)/n_k · B / β_k;
- collective permute of B: one hop, α + B / β over the outermost level crossed.

On a `SHARED_MEMORY` level (XLA's CPU devices, threads of one process) a
collective is one rendezvous, α, then each device copies its B bytes
through the host's memory, B / β (an all-reduce two passes, its sum then its
copy out), whatever the group's size: on the 8-device CPU host an
all-reduce of 4 MiB takes as long over 2 devices as over 8.

Each kind takes its own α and β where the profile measured them apart
(`Link.per_kind`; `partir.calibrate` fits each kind), else the link's.

The program's collective is not always what runs: on CPU partir writes a
reduce-scatter as a sum then each device's slice (`lowering.to_jax.
_reduce_scatter`), so it costs an all-reduce of its input there (`RUN_AS`).
XLA's combiner merges all-reduces over the same group that do not depend
on each other (a step's gradient sums, and on CPU the reduce-scatters'
sums) into one: the group pays α once, for all their bytes
(`combined_seconds`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from xdsl.ir import Block, SSAValue

from dialects.spmd import CollectiveOp
from partir.cost.profile import RING, Link, Profile

RUN_AS: dict[str, dict[str, str]] = {"cpu": {"reduce_scatter": "all_reduce"}}
"""Per platform, the collective partir's lowering runs for a program's kind
where they differ (`lowering.to_jax._reduce_scatter`: on CPU a sum then a
slice, as XLA's own partitioner writes it there)."""


def run_kind(kind: str, platform: str) -> str:
    """The collective that runs on `platform` for the program's `kind`."""
    return RUN_AS.get(platform, {}).get(kind, kind)


def factors(kind: str, n: int, algorithm: str = RING) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of `kind` on one level of n devices
    running `algorithm`: seconds = steps · α + factor · B / β."""
    if kind not in KINDS:
        raise KeyError(f"no cost model for collective {kind!r} in partir.cost.collective_costs")
    if algorithm != RING:  # shared memory: one rendezvous, B through memory
        return 1, 2 if kind == "all_reduce" else 1
    if kind == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind == "collective_permute":
        return 1, 1
    return n - 1, (n - 1) / n


KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
"""The collectives that communicate (a local slice does not)."""

_SHRINKING = frozenset({"all_reduce", "reduce_scatter", "all_gather", "all_to_all"})
"""Kinds that leave B/n per device for the next level (an all-gather mirrors
a reduce-scatter)."""


def collective_seconds(
    kind: str, nbytes: float, levels: list[tuple[int, Link]]
) -> float:
    """Seconds for collective `kind` moving `nbytes` (the larger of its
    per-device input and output) over `levels`."""
    if not levels:
        factors(kind, 1)  # an unknown kind is an error even where nothing moves
        return 0.0
    if kind == "collective_permute":
        levels = levels[-1:]  # one hop over the outermost level crossed
    seconds = 0.0
    for n, link in levels:
        steps, factor = factors(kind, n, link.algorithm)
        alpha, beta = link.alpha_beta(kind)
        seconds += steps * alpha + factor * nbytes / beta
        if kind in _SHRINKING:
            nbytes /= n
    return seconds


def op_seconds(op: CollectiveOp, mesh: Mapping[str, int], profile: Profile) -> float:
    """Seconds `op` takes on `profile`, its group being its axes of `mesh`
    (the op says its `kind` and `bytes_per_device`)."""
    if not op.communicates:
        return 0.0
    levels = profile.axis_levels(mesh, op.axis_names)
    return collective_seconds(run_kind(op.kind, profile.platform), op.bytes_per_device, levels)


COMBINED_KINDS = frozenset({"all_reduce"})
"""The collectives (as they run, `run_kind`) XLA's combiner merges when
independent (on CPU it does not merge all-gathers: their counts in the
compiled HLO are the program's)."""


def combined_groups(block: Block, platform: str = "") -> list[list[CollectiveOp]]:
    """The collectives of `block` as XLA runs them on `platform`: each a group
    of the program's collectives, in order. One that runs (`run_kind`) as a
    `COMBINED_KINDS` kind joins the first group of that kind over the same
    axes none of whose members it depends on (through any chain of values),
    as XLA's combiner merges independent collectives; every other collective
    is a group of its own. Collectives in nested regions are their regions'
    (a loop's body is a block of its own)."""
    upstream: dict[SSAValue, int] = {}
    """Per value, the collectives it depends on (a bit per group member)."""
    index: dict[CollectiveOp, int] = {}
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[int, list[CollectiveOp]]]] = (
        defaultdict(list)
    )
    found: list[list[CollectiveOp]] = []
    for op in block.ops:
        used = (v for inner in op.walk() for v in inner.operands)
        mask = 0
        for value in used:
            mask |= upstream.get(value, 0)
        if isinstance(op, CollectiveOp) and op.communicates:
            kind = run_kind(op.kind, platform)
            index[op] = len(index)
            if kind in COMBINED_KINDS:
                candidates = groups[(kind, op.axis_names)]
                for i, (members, group) in enumerate(candidates):
                    if not mask & members:
                        group.append(op)
                        candidates[i] = (members | 1 << index[op], group)
                        break
                else:
                    found.append([op])
                    candidates.append((1 << index[op], found[-1]))
            else:
                found.append([op])
            mask |= 1 << index[op]
        for result in op.results:
            upstream[result] = mask
    return found


def combined_seconds(
    block: Block, mesh: Mapping[str, int], profile: Profile
) -> dict[CollectiveOp, float]:
    """Seconds of each collective of `block` that XLA combines with others
    (`combined_groups`): a group runs as one collective of its summed bytes,
    each member taking its share by bytes. Collectives not combined are
    left out (`op_seconds`)."""
    seconds: dict[CollectiveOp, float] = {}
    for ops in combined_groups(block, profile.platform):
        if len(ops) < 2:
            continue
        kind = run_kind(ops[0].kind, profile.platform)
        total = sum(op.bytes_per_device for op in ops)
        together = collective_seconds(kind, total, profile.axis_levels(mesh, ops[0].axis_names))
        for op in ops:
            seconds[op] = together * op.bytes_per_device / max(total, 1)
    return seconds
