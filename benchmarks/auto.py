"""`partir.Automatic`'s pick against every hand strategy, predicted and measured.

For the MLP and transformer-block training steps (the examples) and a
Llama-style step the search was not designed around (`tests/test_partial_sums`:
RMSNorm, separate q/k/v, SwiGLU, parameters under `p`), on the 4x2 CPU mesh:
each hand strategy (DP, DP+ZeRO-1, DP+TP, DP+TP+ZeRO-1, DP+TP+ZeRO-3) and
`Automatic` (profile: this machine's calibrated one if `partir.calibrate()`
saved one, else the shipped `cpu-host-8`), with the predicted and measured
step time (median of paired rounds: every round runs every row once, in a
shuffled order, inputs pre-sharded), the bytes each device moves per step,
the predicted peak memory per device, and the search's wall time.

CPU caveat (shared/guides/jax.md): the 8 devices share this host's cores;
measured times of different rows are comparable within one run only.

    python -m benchmarks.auto [--rounds 10] [--budget 60] [--only block]
    python -m benchmarks.auto --scaling   # search time against the number of layers
    python -m benchmarks.auto --inner     # values inside the program (`partir.values`)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import NamedSharding

import partir
from benchmarks.simulator import time_rounds
from examples import block_train_step, mlp_train_step
from partir.search import resolve_profile, schedule_source
from partir.values import is_reference

MESH = partir.Mesh({"batch": 4, "model": 2})
DP, TP = partir.BatchParallel("batch"), partir.Megatron("model")
HANDS: dict[str, list[partir.Tactic]] = {
    "DP": [DP],
    "DP+ZeRO-1": [DP, partir.ZeRO("batch", 1)],
    "DP+TP": [DP, TP],
    "DP+TP+ZeRO-1": [DP, TP, partir.ZeRO("batch", 1)],
    "DP+TP+ZeRO-3": [DP, TP, partir.ZeRO("batch", 3)],
}


def programs() -> dict[str, tuple]:
    from tests import test_partial_sums as llama

    return {
        "MLP step": (mlp_train_step.program, mlp_train_step.make_args(
            batch=256, d_in=512, hidden=2048, d_out=512)),
        "block step": (block_train_step.program, block_train_step.make_args(
            batch=8, seq=128, width=256, mlp_width=1024)),
        "Llama step (unseen)": (llama.step, llama.make_args(
            batch=8, seq=128, width=256, hidden=512, layers=2)),
    }


def scaling(budget: float, layers: tuple[int, ...] = (1, 4, 12, 24, 96)) -> None:
    """Search time against program size: `Automatic` on the N-layer step's
    "model" axis after BatchParallel, nothing run (abstract arguments); the
    search's own seconds, and the Automatic tactic's (the search, then its
    pick made on the module)."""
    from examples import stack_train_step
    from partir.simulation import abstract

    print("| layers | ops | candidates | s per candidate | search s | Automatic s | ended by "
          "| pick |")
    print("|---|---|---|---|---|---|---|---|")
    for n in layers:
        args = abstract(stack_train_step.make_args(layers_=n, batch=8, seq=64, width=128,
                                                   mlp_width=512))
        module = partir.import_jax(stack_train_step.program, *args)
        ops = sum(1 for _ in module.walk())
        auto = partir.Automatic(time_budget_s=budget, progress=False)
        partir.partition(module, MESH, [DP])
        start = time.perf_counter()
        (found,) = partir.partition(module, MESH, [auto]).searches
        wall = time.perf_counter() - start  # the search, then its pick made on the module
        per = found.seconds / found.evaluated if found.evaluated else float("nan")
        ended = "converged" if found.finished else "budget"
        print(f"| {n} | {ops} | {found.evaluated} | {per:.2f} | {found.seconds:.1f} "
              f"| {wall:.1f} | {ended} | `{found.schedule_source}` |")


def _row(program: str, name: str, lowered: partir.Lowered, args: tuple,
         profile: partir.Profile, wall: float) -> dict:
    """A row for `time_rounds`: the compiled strategy, its inputs placed as its
    shardings say, its prediction, and the search's wall time if it searched."""
    compiled = lowered.compile()
    inputs = [
        jax.device_put(x, NamedSharding(compiled.jax_mesh, spec))
        for x, spec in zip(jax.tree.leaves(args), compiled.program.IN_SPECS, strict=True)
    ]
    return {
        "program": program, "name": name, "run": compiled.run, "inputs": inputs,
        "predicted": lowered.estimate(profile),
        "search": wall if lowered.searches else None, "times": [],
    }


def inner_values(rounds: int, budget: float) -> None:
    """Steps where the batch split stops inside the program (`tests/test_values`'
    table built from iota; `tests/test_automatic`'s cumulative sum over the
    batch): the batch split alone against it followed by `Automatic`, which
    may tile the values the split left whole by their `@`-references."""
    from tests import test_automatic, test_values

    profile, note = resolve_profile(None)
    print(f"profile: {note}")
    rng = np.random.default_rng(0)
    cases = {
        "table step": (test_values.with_table, test_values.table_args(), "tokens"),
        "blocked step": (
            test_automatic.blocked_step,
            ({"w": rng.random((64, 256), np.float32), "v": rng.random((256, 512), np.float32)},
             rng.random((128, 64), np.float32)),
            "batch",
        ),
    }
    rows = []
    for prog_name, (program, args, data) in cases.items():
        dp = partir.BatchParallel("batch", inputs=data)
        auto = partir.Automatic(time_budget_s=budget, progress=False)
        strategies: list[tuple[str, list[partir.Tactic]]] = [
            ("DP", [dp]), ("DP + Automatic", [dp, auto])
        ]
        for name, tactics in strategies:  # grows by the pick without its references
            start = time.perf_counter()
            lowered = partir.jit(program, mesh=MESH, tactics=tactics).lower(*args)
            wall = time.perf_counter() - start
            if lowered.searches:
                found = lowered.searches[0]
                name = f"DP + {found.schedule_source}"
                plain = [
                    t for t in found.chosen.schedule
                    if not isinstance(t, partir.ManualPartition)
                    or not any(map(is_reference, t.spec))
                ]
                if plain and len(plain) < len(found.chosen.schedule):
                    strategies.append((f"DP + {schedule_source(plain)}", [dp, *plain]))
            rows.append(_row(prog_name, name, lowered, args, profile, wall))
    time_rounds(rows, rounds)
    print("\n| program | strategy | predicted ms | measured ms | vs DP (measured) | search s |")
    print("|---|---|---|---|---|---|")
    for prog_name in cases:
        mine = [r for r in rows if r["program"] == prog_name]
        measured = [statistics.median(r["times"]) * 1e3 for r in mine]
        for r, ms in zip(mine, measured, strict=True):
            search = f"{r['search']:.1f}" if r["search"] is not None else "-"
            print(f"| {prog_name} | `{r['name']}` | {r['predicted'].seconds * 1e3:.2f} "
                  f"| {ms:.2f} | {ms / measured[0]:.2f} | {search} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--only", help="run the programs whose name contains this")
    parser.add_argument("--scaling", action="store_true",
                        help="search time against the number of layers instead")
    parser.add_argument("--inner", action="store_true",
                        help="steps whose batch split stops inside the program instead")
    opts = parser.parse_args()
    if opts.scaling:
        scaling(opts.budget)
        return
    if opts.inner:
        inner_values(opts.rounds, opts.budget)
        return
    profile, note = resolve_profile(None)
    print(f"profile: {note}")
    rows = []
    for prog_name, (program, args) in programs().items():
        if opts.only and opts.only not in prog_name:
            continue
        strategies = dict(HANDS)
        strategies["Automatic"] = [partir.Automatic(time_budget_s=opts.budget, progress=False)]
        for name, tactics in strategies.items():
            start = time.perf_counter()
            try:
                lowered = partir.jit(program, mesh=MESH, tactics=tactics).lower(*args)
            except partir.TacticError as err:  # e.g. ZeRO-1 of a step with no optimizer state
                print(f"skipped {prog_name} {name}: {err}")
                continue
            wall = time.perf_counter() - start
            label = name
            if lowered.searches:
                found = lowered.searches[0]
                label = f"Automatic = {found.schedule_source}"
                print(f"{prog_name}: {found.message()}")
                print(found.table())
            rows.append(_row(prog_name, label, lowered, args, profile, wall))
    time_rounds(rows, opts.rounds)
    print("\n| program | strategy | predicted ms | measured ms | vs best hand (measured) "
          "| MB moved | peak MiB | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for prog_name in dict.fromkeys(r["program"] for r in rows):
        mine = [r for r in rows if r["program"] == prog_name]
        measured = {id(r): statistics.median(r["times"]) * 1e3 for r in mine}
        best_hand = min(measured[id(r)] for r in mine if r["search"] is None)
        for r in mine:
            e = r["predicted"]
            moved = sum(c.bytes_per_device * c.count for c in e.collectives) / 1e6
            search = f"{r['search']:.1f}" if r["search"] is not None else "-"
            print(f"| {prog_name} | {r['name']} | {e.seconds * 1e3:.2f} | {measured[id(r)]:.2f} "
                  f"| {measured[id(r)] / best_hand:.2f} | {moved:.3f} "
                  f"| {e.peak_bytes / 2**20:.1f} | {search} |")


if __name__ == "__main__":
    main()
