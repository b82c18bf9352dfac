"""Telling a program's state from its data, by the program's structure.

A training step takes its state (parameters, optimizer state) and returns it
updated: an argument whose whole tree comes back as a result subtree, leaf
for leaf (same path below it, shape and dtype), is state, whatever it is
called (an argument is a parameter's tree, or one positional `args[i]`:
`partir.selectors.argument_root`). Each result subtree is matched to one
argument, in argument order, so gradients passed in beside the parameters
are not state. A lone array
counts only where it comes back as a result of its own among several, not as
a forward function's only output. Arguments rooted at a conventional state
name (`STATE_ROOTS`) are state too. The data are the other arguments of rank
>= 1, and must share their leading dimension (the batch); where they do not,
the program does not say which arguments are data, and the error lists them.
Among the state, the optimizer state is what holds copies of the parameters'
tree (Adam's `m` and `v`), found by structure: a node of one argument (or
of one top-level entry of a combined state argument, Flax NNX's
`nnx.split((model, optimizer))`) whose leaves recur, path, shape and dtype,
in a node of another, the parameters. The parameters' leaves it does not
copy (NNX's RNG counters and keys) are state but not trained.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from xdsl.ir import Attribute

from partir.selectors import argument_root, display_path, slash_path

STATE_ROOTS = ("params", "opt_state", "optimizer_state", "state", "variables")
"""Argument roots that hold model state rather than data, whatever the results."""


class NamedLeaf(Protocol):
    """An argument or result of the entry function (`partir.tactics.Leaf`)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> Attribute: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


L = TypeVar("L", bound=NamedLeaf)


Signature = frozenset[tuple[str, tuple[int, ...], Attribute]]
"""A subtree: (path below its root, shape, element type) of each leaf."""


def _element(leaf: NamedLeaf) -> Attribute:
    return getattr(leaf.type, "element_type", leaf.type)


def _subtrees(leaves: Sequence[NamedLeaf]) -> dict[str, Signature]:
    """Each node of the leaves' trees (a path prefix), with its subtree."""
    found: dict[str, set[tuple[str, tuple[int, ...], Attribute]]] = defaultdict(set)
    for leaf in leaves:
        segments = slash_path(leaf.name).split("/")
        for cut in range(1, len(segments) + 1):
            below = "/".join(segments[cut:])
            found["/".join(segments[:cut])].add((below, leaf.shape, _element(leaf)))
    return {node: frozenset(tree) for node, tree in found.items()}


@dataclass(frozen=True)
class Roles:
    """Argument roots that are state, and why (root -> reason); among them
    the model's parameters and the optimizer state that mirrors them, each a
    node (slash path): an argument's root, or a node inside a combined one."""

    state: dict[str, str]
    parameters: tuple[str, ...] = ()
    optimizer: tuple[str, ...] = ()
    mirrors: dict[str, str] = field(default_factory=dict)
    """Optimizer node -> the parameters' node whose tree it holds copies of
    (absent where a root is told apart by its name alone)."""
    untrained: frozenset[str] = frozenset()
    """Slash paths of the leaves under a parameters node that no optimizer
    state copies (NNX's RNG counters and keys): state, not parameters."""
    returned: dict[str, str] = field(default_factory=dict)
    """State root -> the result subtree (slash form) it comes back updated as."""

    @staticmethod
    def of(arguments: Sequence[NamedLeaf], results: Sequence[NamedLeaf]) -> Roles:
        returned = _subtrees(results)
        by_signature: dict[Signature, list[str]] = defaultdict(list)
        for node, tree in returned.items():
            by_signature[tree].append(node)
        roots: dict[str, list[NamedLeaf]] = defaultdict(list)
        for leaf in arguments:
            roots[_root(leaf)].append(leaf)
        state: dict[str, str] = {}
        returned_as: dict[str, str] = {}
        claimed = _Nodes()
        # Where each candidate list's first unclaimed node is: claims only
        # grow, so a node passed over once stays taken.
        cursors: dict[tuple[Signature, bool], int] = defaultdict(int)
        lone_results: dict[Signature, list[str]] = {}
        trees = {root: _subtrees(leaves) for root, leaves in roots.items()}
        for root, leaves in roots.items():
            tree = trees[root][root]
            nodes = by_signature.get(tree, [])
            lone = len(leaves) == 1 and slash_path(leaves[0].name) == root
            if lone:
                # A lone array: only as a result of its own (`result/1`) among
                # others, not as the only result (a forward function's output).
                if tree not in lone_results:
                    lone_results[tree] = [
                        n for n in nodes if n.count("/") == 1 and len(results) > 1
                    ]
                nodes = lone_results[tree]
            # Each result subtree is one argument's: gradients passed in beside
            # the parameters match the same updated tree, but it is taken.
            at = cursors[tree, lone]
            while at < len(nodes) and claimed.overlaps(nodes[at]):
                at += 1
            cursors[tree, lone] = at
            if at < len(nodes):
                claimed.add(nodes[at])
                returned_as[root] = nodes[at]
                state[root] = f"returned updated as {display_path(nodes[at])}"
            elif root in STATE_ROOTS:
                state[root] = "named as state"
        parameters, optimizer, mirrors, untrained = _parameters_and_optimizer(list(state), trees)
        return Roles(state, parameters, optimizer, mirrors, untrained, returned_as)

    def returned_node(self, node: str) -> str | None:
        """The result subtree (slash form) a state node (a root, or a node
        inside one, such as NNX's `state/0`) comes back updated as."""
        for root, result in self.returned.items():
            if node == root or node.startswith(f"{root}/"):
                return result + node[len(root):]
        return None

    def parameters_of(self, leaf: NamedLeaf) -> str | None:
        """The parameters node `leaf` is a trained leaf of, or None."""
        path = slash_path(leaf.name)
        return None if path in self.untrained else _node_of(path, self.parameters)

    def optimizer_of(self, leaf: NamedLeaf) -> str | None:
        """The optimizer state node `leaf` lies under, or None."""
        return _node_of(slash_path(leaf.name), self.optimizer)

    def describe(self, leaf: NamedLeaf, data: Sequence[NamedLeaf]) -> tuple[str, str]:
        """(role, why) of an argument: "state" (returned updated, or named
        so), "data" (one of `data`, as `data()` found them) or "scalar"."""
        root = _root(leaf)
        if root in self.state:
            return "state", self.state[root]
        if not any(d is leaf for d in data):
            return "scalar", "not returned updated; rank 0, no dim to split"
        others = [display_path(d.name) for d in data if d is not leaf]
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        lead = f"leading dim {leaf.shape[0]}"
        return "data", f"not returned updated; {f'shares {lead} with {shown}' if others else lead}"

    def why_optimizer(self, root: str) -> str:
        """Why the leaves under `root` (an optimizer node) are optimizer
        state: the parameters' tree it mirrors, or its name."""
        mirrored = self.mirrors.get(root)
        if mirrored is None:
            return f"under {display_path(root)}, named as optimizer state"
        return f"under {display_path(root)}, which mirrors the parameters {display_path(mirrored)}"

    def why_parameters(self, root: str) -> str:
        """Why the leaves under `root` (a parameters node) are parameters:
        the optimizer state that mirrors its tree, or that it is state no
        other state mirrors."""
        mirrored_by = [display_path(o) for o, p in self.mirrors.items() if p == root]
        if mirrored_by:
            by = ", ".join(mirrored_by)
            return f"under {display_path(root)}, mirrored by the optimizer state {by}"
        why = self.state.get(root, "named as state")
        return f"under {display_path(root)}: {why}, and no optimizer state mirrors it"

    def data(self, arguments: Sequence[L], parts: int = 1) -> list[L] | str:
        """The data arguments (not state, rank >= 1, one leading dimension),
        or why the program does not say which they are, with the `inputs=`
        (and, for data too short on dim 0 for `parts` devices, the `dim=`)
        that would split them."""
        candidates = [leaf for leaf in arguments if leaf.shape and _root(leaf) not in self.state]
        if not candidates:
            stated = ", ".join(f"{root} ({why})" for root, why in self.state.items())
            return f"found no data arguments; name them with inputs= (state: {stated})"
        leading: dict[int, list[L]] = defaultdict(list)
        for leaf in candidates:
            leading[leaf.shape[0]].append(leaf)
        if len(leading) == 1:
            return candidates
        groups = "; ".join(
            f"leading dim {n}: " + ", ".join(display_path(leaf.name) for leaf in leaves[:4])
            + (f", ... ({len(leaves)} in all)" if len(leaves) > 4 else "")
            for n, leaves in sorted(leading.items())
        )
        by_root: dict[str, set[int]] = defaultdict(set)
        lone: set[str] = set()
        for leaf in candidates:
            by_root[_root(leaf)].add(leaf.shape[0])
            if slash_path(leaf.name) == _root(leaf):
                lone.add(_root(leaf))
        # A guess for the message: roots with one leading dim, lone arrays first.
        batch_like = [root for root, dims in by_root.items() if len(dims) == 1]
        batch_like = [r for r in batch_like if r in lone] or batch_like or list(by_root)
        short = [r for r in batch_like if min(by_root[r]) < parts]
        named = [r for r in batch_like if r not in short] or batch_like
        return (
            f"cannot tell the data from the state: the arguments not returned updated "
            f"({', '.join(by_root)}) do not share a leading dimension ({groups}); "
            f"name the data, e.g. inputs={named!r}"
            + "".join(_other_dim(r, candidates, parts) for r in short)
        )


def _other_dim(root: str, leaves: Sequence[L], parts: int) -> str:
    """How to split `root`, whose dim 0 is too short for `parts` devices
    (a graph's `edge_index [2, E]`): on the first dim all its leaves share
    with an element per device, by a BatchParallel of its own."""
    shapes = [leaf.shape for leaf in leaves if _root(leaf) == root]
    rank = min(len(shape) for shape in shapes)
    dims = [d for d in range(1, rank) if len({s[d] for s in shapes}) == 1 and shapes[0][d] >= parts]
    where = (
        f"add a BatchParallel of its own with inputs=[{root!r}], dim={dims[0]}"
        if dims else "leave it out"
    )
    return (
        f"; {root}'s dim 0 has {min(s[0] for s in shapes)} elements, fewer than {parts} "
        f"devices: {where}"
    )


def _parameters_and_optimizer(
    state: list[str], trees: dict[str, dict[str, Signature]]
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str], frozenset[str]]:
    """Which state nodes are parameters and which optimizer state: optimizer
    state holds copies of the parameters' tree (Adam's `m` and `v`, a
    momentum), so an argument (or a top-level entry of a combined one) whose
    tree recurs elsewhere in the state is the parameters (`_mirrors`; the
    largest, and of equal ones the first), and the argument holding the
    copies, or the entry where the parameters share the argument, the
    optimizer state. With no such pair, every state root is parameters
    (plain SGD), unless its name says otherwise. Also the parameters'
    leaves no copy holds (`Roles.untrained`)."""
    nodes = {node: tree for root in state for node, tree in trees[root].items()}
    order = {node: i for i, node in enumerate(nodes)}
    roots = _Nodes(state)
    mirrored_by = _Mirrors(roots, nodes, order)
    parameters: list[str] = []
    optimizer: list[str] = []
    mirrors: dict[str, str] = {}
    untrained: set[str] = set()
    taken = _Nodes()
    for node in sorted(mirrored_by.holders, key=lambda n: (-len(nodes[n]), order[n])):
        if taken.overlaps(node):
            continue
        copies = [m for m in mirrored_by(node) if not taken.overlaps(m)]
        if not copies:
            continue
        parameters.append(node)
        taken.add(node)
        copied: set[str] = set()
        for copy in copies:
            if taken.overlaps(copy):
                continue
            taken.add(copy)
            copied |= {below for below, _, _ in nodes[copy]}
            holder = _holder(copy, node, roots)
            if holder not in mirrors:
                optimizer.append(holder)
            mirrors.setdefault(holder, node)
        untrained |= {_join(node, below) for below, _, _ in nodes[node] if below not in copied}
    if not parameters:
        named_optimizer = {"opt_state", "optimizer_state"}
        parameters = [r for r in state if r not in named_optimizer]
        optimizer = [r for r in state if r in named_optimizer]
    return tuple(parameters), tuple(optimizer), mirrors, frozenset(untrained)


class _Mirrors:
    """Argument (or top-level entry) -> the nodes that mirror it, in order:
    in another argument, or strictly inside another entry of the same one
    (an optimizer's state holds more than the copy: NNX's `Optimizer` a
    step, optax a tuple), holding its tree or, with two leaves or more, a
    part of it (NNX's optimizer copies the parameters, not the RNG counters
    beside them). A lone leaf mirrors only a whole argument (a lone array
    and its momentum). Found when asked, for the nodes not yet taken: a
    program whose arrays are all lone arguments of a few shapes would
    otherwise pair every array with every other of its shape."""

    def __init__(self, state: _Nodes, nodes: dict[str, Signature], order: dict[str, int]) -> None:
        self.state, self.nodes, self.order = state, nodes, order
        self.holders = [
            node for node, tree in nodes.items()
            if tree and (node in state or _entry(node, state) == node)
        ]
        """The nodes that may be mirrored, in order."""
        self.by_leaf: dict[tuple[str, tuple[int, ...], Attribute], list[str]] = defaultdict(list)
        """One leaf of each node's tree -> the nodes: a copy's tree lies in
        what it mirrors, that leaf among them."""
        for node, tree in nodes.items():
            if tree:
                self.by_leaf[next(iter(tree))].append(node)

    def __call__(self, node: str) -> list[str]:
        tree, state = self.nodes[node], self.state
        found = {copy for leaf in tree for copy in self.by_leaf.get(leaf, ())}
        copies = []
        for copy in sorted(found, key=self.order.__getitem__):
            held = self.nodes[copy]
            if not held <= tree or not _apart(node, copy, state):
                continue
            inner = len(held) > 1 and all(below for below, _, _ in held)
            if inner or (node in state and tree == held):
                copies.append(copy)
        return _only_copies(copies, node, self.nodes, state)


def _only_copies(
    copies: list[str], node: str, nodes: dict[str, Signature], state: _Nodes
) -> list[str]:
    """The `copies` that mirror `node`: where one shares the parameters'
    argument, the entry holding it must be optimizer state through and
    through: each of its arrays inside one of the copies (a step count
    beside them is a scalar). A layer list whose blocks each hold a norm
    shaped like a final norm beside them does not mirror that norm: the
    blocks hold weights no copy accounts for."""
    root = _root_of(node, state)
    inside: dict[str, _Nodes] = defaultdict(_Nodes)
    for copy in copies:
        if _overlap(copy, root):
            inside[_entry(copy, state)].add(copy)
    whole = {
        entry: all(
            not shape or held.overlaps(_join(entry, below)) for below, shape, _ in nodes[entry]
        )
        for entry, held in inside.items()
    }
    return [c for c in copies if not _overlap(c, root) or whole[_entry(c, state)]]


def _root_of(node: str, state: _Nodes) -> str:
    root = state.first(node)
    assert root is not None, f"{node} lies under no state root"  # callers pass state nodes
    return root


def _entry(node: str, state: _Nodes) -> str:
    """The top-level entry of an argument `node` lies in (the root itself
    for the root)."""
    root = _root_of(node, state)
    return node if node == root else f"{root}/{node[len(root) + 1 :].split('/')[0]}"


def _apart(node: str, copy: str, state: _Nodes) -> bool:
    """Whether `copy` may mirror `node`: in another argument, or strictly
    inside another top-level entry of the same one."""
    root = _root_of(node, state)
    if not _overlap(copy, root):
        return True
    if node == root or copy == root:
        return False
    entry = _entry(copy, state)
    return entry != _entry(node, state) and entry != copy


def _holder(copy: str, node: str, state: _Nodes) -> str:
    """The optimizer state holding `copy` of the parameters `node`: its
    argument, or its entry where it shares the parameters' argument."""
    root = _root_of(copy, state)
    return _entry(copy, state) if _overlap(node, root) else root


def _join(node: str, below: str) -> str:
    return f"{node}/{below}" if below else node


def _node_of(path: str, nodes: Sequence[str]) -> str | None:
    return next((n for n in nodes if path == n or path.startswith(n + "/")), None)


class _Nodes:
    """Tree nodes (slash paths), in the order added, that tell which of
    them a node overlaps (`_overlap`) in the node's depth rather than their
    number: one of them is the node or one of its ancestors, or lies below
    it. Each step's search over the state and the nodes taken so far stays
    linear in the program's size."""

    def __init__(self, nodes: Sequence[str] = ()) -> None:
        self.members: dict[str, int] = {}
        self.below: dict[str, int] = {}
        """A strict ancestor of members -> the first of them it is above."""
        self.ordered: list[str] = []
        for node in nodes:
            self.add(node)

    def add(self, node: str) -> None:
        if node in self.members:
            return
        self.members[node] = len(self.ordered)
        for above in _ancestors(node):
            self.below.setdefault(above, len(self.ordered))
        self.ordered.append(node)

    def __contains__(self, node: object) -> bool:
        return node in self.members

    def first(self, node: str) -> str | None:
        """The first node added that overlaps `node`, or None."""
        found = [self.members[a] for a in (node, *_ancestors(node)) if a in self.members]
        if node in self.below:
            found.append(self.below[node])
        return self.ordered[min(found)] if found else None

    def overlaps(self, node: str) -> bool:
        return (
            node in self.members
            or node in self.below
            or any(a in self.members for a in _ancestors(node))
        )


def _ancestors(node: str) -> list[str]:
    """The nodes `node` lies strictly within (`a/b/c`: `a`, `a/b`)."""
    found = []
    at = node.find("/")
    while at != -1:
        found.append(node[:at])
        at = node.find("/", at + 1)
    return found


def _overlap(node: str, other: str) -> bool:
    """Whether one of two tree nodes (slash paths) lies within the other."""
    return node == other or node.startswith(other + "/") or other.startswith(node + "/")


def _root(leaf: NamedLeaf) -> str:
    return argument_root(leaf.name)
