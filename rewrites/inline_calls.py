"""`inline-calls`: replace every `func.call` by the body of its callee.

JAX lowers helpers such as `jax.nn.relu`, `jnp.where` or `log_softmax` to
private functions reached by `func.call`. Partitioning needs one flat program
in which every value is visible to propagation, so calls are inlined (callees
first, so a chain of calls costs one copy each) and private functions nobody
calls any more are erased. An inlined op's location continues the call's
(`dialects.locations.inlined_location`): JAX names the ops of a private
function relative to it, without the user's line.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import LocationAttr, ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from dialects.locations import inlined_location


def _calls(function: func.FuncOp) -> list[func.CallOp]:
    return [op for op in function.walk() if isinstance(op, func.CallOp)]


def _inline_call(call: func.CallOp, callee: func.FuncOp) -> None:
    """Clone `callee`'s body in place of `call` and rewire its results."""
    block = call.parent_block()
    assert block is not None
    mapping: dict[SSAValue, SSAValue] = dict(
        zip(callee.body.block.args, call.arguments, strict=True)
    )
    locations: dict[int, LocationAttr] = {}
    for op in callee.body.block.ops:
        if isinstance(op, func.ReturnOp):
            for old, new in zip(call.results, op.arguments, strict=True):
                old.replace_all_uses_with(mapping.get(new, new))
            break
        clone = op.clone(value_mapper=mapping)
        for inner in clone.walk():
            key = id(inner.location)  # the callee's ops keep theirs alive
            if key not in locations:
                locations[key] = inlined_location(inner.location, call.location)
            inner.location = locations[key]
        block.insert_op_before(clone, call)
    block.erase_op(call)


def _topological_order(
    functions: dict[str, func.FuncOp], calls: dict[str, list[func.CallOp]]
) -> list[str]:
    """Callees before callers (`calls`: each function's); a recursive call is an error."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = " -> ".join([*chain, name])
            raise PassFailedException(f"cannot inline recursive calls: {cycle}")
        state[name] = "active"
        for callee in sorted({call.callee.root_reference.data for call in calls[name]}):
            if callee not in functions:
                raise PassFailedException(f"func.call to unknown function @{callee} in @{name}")
            visit(callee, [*chain, name])
        state[name] = "done"
        order.append(name)

    for name in functions:
        visit(name, [])
    return order


@dataclass(frozen=True)
class InlineCallsPass(ModulePass):
    """Inline every func.call and erase the private functions left unused."""

    name = "inline-calls"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        functions = {f.sym_name.data: f for f in op.body.block.ops if isinstance(f, func.FuncOp)}
        # a function's calls, found once: inlining its callees (first) does
        # not change its own
        calls = {name: _calls(f) for name, f in functions.items()}
        for name in _topological_order(functions, calls):
            for call in calls[name]:
                _inline_call(call, functions[call.callee.root_reference.data])
        for f in functions.values():
            if f.sym_visibility is not None and f.sym_visibility.data == "private":
                op.body.block.erase_op(f)
