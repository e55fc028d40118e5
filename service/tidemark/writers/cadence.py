"""How old a shape's oldest committed row may get before the shape is flushed.

A fixed age trades acknowledgement lag against Spark's fixed costs the same way under
any load. The flush age adapts instead, between ``min_age_s`` and ``max_age_s``: it
follows how long the recent flush jobs took, from launch (waiting for a Spark slot
included) to their last Delta commit.

* Quick jobs (few shapes, light load): the age falls to ``min_age_s``, so rows reach
  their tables, and the acknowledgement reaches Postgres, soon after they commit.
* Slow or queued jobs (many shapes, heavy load): the age grows with them, up to
  ``max_age_s``, so each round takes more rows per shape: fewer jobs, files and
  commits per row (a size limit or memory pressure still flushes at once).

With ``min_age_s >= max_age_s`` the age is ``max_age_s``, fixed. Pure: the scheduler
measures the jobs and asks.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.5  # weight of the newest job's duration


@dataclass(slots=True)
class Cadence:
    job_s: float | None = None  # smoothed duration of recent flush jobs

    def observe(self, seconds: float) -> None:
        """A flush job (a round or one shape's flush) took ``seconds``."""
        seconds = max(0.0, seconds)
        if self.job_s is None:
            self.job_s = seconds
        else:
            self.job_s += SMOOTHING * (seconds - self.job_s)

    def age_s(self, min_age_s: float | None, max_age_s: float) -> float:
        """The flush age now: recent jobs' duration, within the bounds."""
        low = max_age_s if min_age_s is None else min(min_age_s, max_age_s)
        if self.job_s is None:
            return low
        return min(max_age_s, max(low, self.job_s))


# Rounds of fewer shapes than this (with the shapes still committing) are not split:
# below it a round's fixed cost (a Spark job: ~0.3 s) outweighs its per-file cost.
BALANCE_MIN_SHAPES = 200


def round_share(candidates: int, committing: int, minimum: int = BALANCE_MIN_SHAPES) -> int:
    """How many of ``candidates`` shapes (due or joining) the next round takes while
    ``committing`` shapes still commit the previous round's batches (they cannot join).

    Shapes alternate between two rounds: one writes while the other commits. Left to
    themselves the two sets keep whatever sizes the load's start gave them (900 and
    100 shapes at 1000), and a shape of the big set waits for the small round and
    then its own big one. Taking half of both sets instead makes them even within a
    round or two, so each shape waits for two half-size rounds: 1000 shapes on 2
    cores, two rounds of ~500 take about what 900 + 100 take, but the longest wait
    for a row is one half-round shorter. Few shapes: no split (``minimum``)."""
    if committing <= 0 or candidates <= committing or candidates + committing < minimum:
        return candidates
    return (candidates + committing + 1) // 2
