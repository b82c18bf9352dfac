"""The long fuzz profile: `python -m tests.fuzz --cases 3000 --seed 0`.

Prints progress, then the per-class summary (outcomes, refusals by reason,
internal errors by exception type and message pattern), then for each failure
class a shrunk, replayable case (Python to paste into a file at the repo root).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=1000, help="how many cases to run")
    parser.add_argument("--seed", type=int, default=0, help="the hypothesis seed")
    parser.add_argument("--spmd-every", type=int, default=8,
                        help="about one case in N also runs the SPMD interpreter")
    parser.add_argument("--shrink", type=int, default=20,
                        help="shrink at most this many failure classes (0: none)")
    parser.add_argument("--shrink-seconds", type=float, default=120.0,
                        help="stop shrinking a class after this long")
    parser.add_argument("--report", help="also write the summary and repros to this file")
    opts = parser.parse_args(argv)

    from tests.fuzz.profile import explore, shrink

    def progress(done: int, summary) -> None:
        if done % 100 == 0:
            counts = ", ".join(f"{k} {n}" for k, n in sorted(summary.kinds.items()))
            print(f"[{done}/{opts.cases}] {counts}", file=sys.stderr, flush=True)
            if opts.report:  # readable while the run goes on
                with open(opts.report, "w") as fh:
                    fh.write(f"seed {opts.seed}, {done} of {opts.cases} cases so far\n")
                    fh.write(summary.text() + "\n")

    stop = threading.Event()  # SIGTERM: finish the current case, then report
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())

    summary = explore(opts.cases, opts.seed, opts.spmd_every, progress, stop)
    out = [f"seed {opts.seed}, {opts.cases} cases", summary.text()]
    if summary.worst_match is not None:
        out.append(f"the closest match:\n```python\n{summary.worst_match.script()}```")
    for n, (kind, key, count, index, case, outcome) in enumerate(summary.failures()):
        out.append(f"\n=== {kind} ({count} cases): {key}\nfirst at case {index}; {outcome.detail}")
        if n < opts.shrink and not summary.interrupted:
            found = shrink(
                kind, key, index, opts.seed, opts.cases, opts.spmd_every, opts.shrink_seconds
            )
            if found is not None:
                case, outcome = found
                out.append(f"shrunk: {outcome.detail}")
        out.append(f"```python\n{case.script()}```")
    text = "\n".join(out)
    print(text)
    if opts.report:
        with open(opts.report, "w") as fh:
            fh.write(text + "\n")
    return 1 if summary.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
