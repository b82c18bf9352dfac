"""Running many fuzz cases: explore, summarise by class, shrink each failure class.

Exploring runs `max_examples` hypothesis-generated cases without stopping at
a failure and groups the outcomes. Shrinking then replays the same seeded
generation up to a class's first failing case (skipping the work for the cases
before it: hypothesis draws the same cases when the test behaves the same) and
lets hypothesis shrink it to a minimal program of the same class.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from tests.fuzz.grammar import Case, cases
from tests.fuzz.oracle import Outcome, run_case

FAILURES = ("wrong", "internal", "invalid")
"""Outcome kinds that fail a run (refusals are allowed, and counted)."""

CLEAR_CACHES_EVERY = 100


def _settings(count: int, phases: tuple[Phase, ...]) -> settings:
    return settings(
        max_examples=count,
        phases=phases,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
    )


@dataclass
class Summary:
    """Outcomes of a run, grouped: counts by kind, and per failure or refusal
    class the number of cases and the first one (its index and case)."""

    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    classes: dict[tuple[str, str], list] = field(default_factory=dict)  # -> [count, index, case]
    worst_match_ratio: float = 0.0
    worst_match: Case | None = None  # the match closest to the tolerance (for calibration)
    spmd_checked: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    def add(self, index: int, case: Case, outcome: Outcome) -> None:
        self.kinds[outcome.kind] += 1
        self.spmd_checked += case.check_spmd and outcome.kind == "match"
        if outcome.kind == "match":
            if outcome.worst_ratio > self.worst_match_ratio:
                self.worst_match_ratio, self.worst_match = outcome.worst_ratio, case
            return
        entry = self.classes.setdefault((outcome.kind, outcome.key), [0, index, case, outcome])
        entry[0] += 1

    def failures(self) -> list[tuple[str, str, int, int, Case, Outcome]]:
        return [
            (kind, key, n, index, case, outcome)
            for (kind, key), (n, index, case, outcome) in sorted(
                self.classes.items(), key=lambda kv: (-kv[1][0], kv[0])
            )
            if kind in FAILURES
        ]

    def text(self) -> str:
        total = sum(self.kinds.values())
        lines = [
            f"{total} cases in {self.seconds:.0f}s{' (interrupted)' if self.interrupted else ''}: "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())),
            f"SPMD interpreter checked on {self.spmd_checked} matching cases; "
            f"worst match used {self.worst_match_ratio:.3f} of the tolerance",
        ]
        for kind in ("wrong", "internal", "invalid", "refusal"):
            rows = sorted(
                ((n, key) for (k, key), (n, *_rest) in self.classes.items() if k == kind),
                reverse=True,
            )
            if rows:
                lines.append(f"{kind} ({sum(n for n, _ in rows)}), by class:")
                lines += [f"  {n:5d}  {key}" for n, key in rows]
        return "\n".join(lines)


def explore(
    count: int,
    seed: int,
    spmd_every: int = 8,
    progress: Callable[[int, Summary], None] | None = None,
    stop: threading.Event | None = None,
) -> Summary:
    """Run `count` cases drawn with hypothesis seed `seed`; never stops early
    on a failure, only when `stop` is set (or on Ctrl-C), keeping what ran."""
    summary = Summary()
    counter = itertools.count()
    start = time.perf_counter()

    @hypothesis_seed(seed)
    @_settings(count, (Phase.generate,))
    @given(cases(spmd_every=spmd_every))
    def run(case: Case) -> None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        index = next(counter)
        if index and index % CLEAR_CACHES_EVERY == 0:
            jax.clear_caches()
        summary.add(index, case, run_case(case))
        if progress is not None:
            progress(index + 1, summary)

    try:
        run()
    except KeyboardInterrupt:  # a long run stopped early still reports what it ran
        summary.interrupted = True
    summary.seconds = time.perf_counter() - start
    return summary


class _Found(Exception):
    def __init__(self, case: Case, outcome: Outcome):
        super().__init__(outcome.key)
        self.case, self.outcome = case, outcome


def shrink(
    kind: str,
    key: str,
    first_index: int,
    seed: int,
    count: int,
    spmd_every: int = 8,
    budget: float = 120.0,
) -> tuple[Case, Outcome] | None:
    """The minimal case of class (kind, key) hypothesis finds from the
    explored run's case `first_index` (None if the replay does not reach it).

    After `budget` seconds of shrinking, only the smallest failure found so
    far still fails, so hypothesis stops there (and replays it consistently)."""
    counter = itertools.count()
    smallest: list[Case] = []
    deadline: list[float] = []

    @hypothesis_seed(seed)
    @_settings(count, (Phase.generate, Phase.shrink))
    @given(cases(spmd_every=spmd_every))
    def run(case: Case) -> None:
        if next(counter) < first_index:
            return  # explored already, and not of this class: the same draws follow
        if deadline and time.perf_counter() > deadline[0]:
            if case == smallest[-1]:
                raise _Found(case, run_case(case))
            return
        outcome = run_case(case)
        if outcome.kind == kind and outcome.key == key:
            smallest.append(case)
            deadline[:] = deadline or [time.perf_counter() + budget]
            raise _Found(case, outcome)

    try:
        run()
    except _Found as found:
        return found.case, found.outcome
    return None
