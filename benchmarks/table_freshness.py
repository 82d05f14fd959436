"""Whether a table of real runs still describes today's core (issue "Agent IV", tables that cannot go stale).

A table (``agent_efficiency.py collect``) keeps each config's outcome at the commit it was collected at, and each
row's summary keeps the core's memory estimate of that config then (``estimated_memory_bytes``) beside its
measured peak. A replay's memory gate estimates with today's core. When the core's memory use has changed since,
the table's OOMs are no longer today's (a table of ``edge.yaml`` collected at af8130e held OOMs that run ok at
f8af8f1), and a replay mixes two cores.

The test: the estimate's **drift** (median over the table's rows of |today's estimate / the recorded one - 1|)
against the estimate's **own error** on the table (median over its measured rows of |recorded estimate / measured
peak - 1|). A drift beyond that error means the core's memory model moved more than it can resolve: the table is
stale and should be collected again (``search_suite.py --recollect``). The estimate follows the core's memory use
(it is refitted to measured peaks; benchmarks/RESULTS.md, "Memory estimate"), so a change to either shows; but a
refit that only makes the estimate better moves it too. So a drift that brings today's estimate *closer* to the
table's own measured peaks (median error now below the recorded one) is the estimate improving, not the core
leaving the table behind: the table stays fresh, and the verdict says so. A drift under 1% is noise, however small
the table's error. The table also records the memory profile it was
collected with (``memory_profile``), which the verdict names when it changed.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

NOISE = 0.01  # a drift below this is rounding and refits of unrelated terms, never staleness


def memory_profile() -> dict:
    """The core's CPU memory profiles as the table records them (what the estimate multiplies its terms by)."""
    from core.memory.estimate import PROFILES  # function-level: only collect and the check need the core

    return {f"{device}/{mode}": dataclasses.asdict(p) for (device, mode), p in sorted(PROFILES.items())}


@dataclass(frozen=True)
class Freshness:
    rows: int  # rows with an estimate then and now
    drift: float | None  # median |now / then - 1|
    own_error: float | None  # median |then / measured - 1| over rows with a measured peak
    now_error: float | None  # median |now / measured - 1| over the same rows
    profile_changed: bool | None  # None: the table predates the recorded profile

    @property
    def moved(self) -> bool:
        """The estimate moved beyond what it can resolve on the table."""
        return self.drift is not None and self.drift > max(NOISE, self.own_error or 0.0)

    @property
    def improved(self) -> bool:
        """Today's estimate is closer to the table's measured peaks than the recorded one."""
        return None not in (self.now_error, self.own_error) and self.now_error < self.own_error

    @property
    def stale(self) -> bool:
        return self.moved and not self.improved

    def text(self) -> str:
        if self.drift is None:
            return "no row has a memory estimate then and now: freshness unknown"
        said = (
            f"memory estimate moved {100 * self.drift:.1f}% (median of {self.rows} rows) against its own error "
            f"{100 * (self.own_error or 0):.1f}% on the table"
        )
        if self.moved and self.improved:
            said += (
                f", toward the table's measured peaks (its error there {100 * self.own_error:.1f}% -> "
                f"{100 * self.now_error:.1f}%): the estimate improved, the table still agrees with it"
            )
        if self.profile_changed:
            said += "; the memory profile changed since"
        return ("STALE: " if self.stale else "fresh: ") + said


def freshness(table: dict, estimate: Callable[[Sequence[str]], int | None]) -> Freshness:
    """Compare ``table``'s recorded estimates with ``estimate`` (``core_adapter.estimate_with_core``, or a stand-in
    in tests) of the same configs: the table's ``fixed`` values and each row's params, as the space spells them."""
    from core.config import override  # function-level: only collect and the check need the core

    fixed = [override(k, v) for k, v in table.get("fixed", {}).items()]
    drifts, errors, now_errors = [], [], []
    for row in table["rows"]:
        then = row.get("estimated_memory_bytes")
        if not then:
            continue
        now = estimate([*fixed, *(override(k, v) for k, v in row["params"].items())])
        if now:
            drifts.append(abs(now / then - 1.0))
        peak = row.get("peak_memory_bytes")
        if peak and row.get("status") in ("ok", "nan", "timeout"):  # an OOM's peak is where the run was stopped
            errors.append(abs(then / peak - 1.0))
            if now:
                now_errors.append(abs(now / peak - 1.0))
    recorded = table.get("memory_profile")
    return Freshness(
        rows=len(drifts),
        drift=statistics.median(drifts) if drifts else None,
        own_error=statistics.median(errors) if errors else None,
        now_error=statistics.median(now_errors) if now_errors else None,
        profile_changed=None if recorded is None else recorded != memory_profile(),
    )
