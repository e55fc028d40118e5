"""Routing throughput: changes/s through ``shapes.convert`` for one table.

The table is ``orders(id int4 primary key, region text, amount int4, note text)``
with REPLICA IDENTITY FULL. Each scenario binds N shapes on it, then converts a
fixed batch of pre-built changes (so decoding is not measured) and reports changes
per second and per-shape rows emitted per second, best of three runs, on one core.

Scenarios: N = 1, 10, 100, 1000 shapes with equality predicates (``region = 'r17'``:
hash-indexed, cost independent of N); the same N with a mix (every tenth shape a
range predicate ``amount > k``, evaluated per shape); and inserts vs updates.

Run: ``.venv/bin/python -m bench.routing_bench`` (about 30 s). Target: >= 100k
changes/s with 100 equality shapes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from tidemark.pgoutput.messages import Insert, Relation, RelationColumn, Update
from tidemark.shapes import ShapeDefinition, ShapeIndex, bind, convert

RELATION = Relation(
    oid=16384,
    namespace="public",
    name="orders",
    replica_identity="f",
    columns=(
        RelationColumn("id", 23, -1, True),
        RelationColumn("region", 25, -1, True),
        RelationColumn("amount", 23, -1, True),
        RelationColumn("note", 25, -1, True),
    ),
)
REGIONS = 1000


def build_index(n: int, range_every: int | None) -> ShapeIndex:
    index = ShapeIndex(RELATION)
    rng = random.Random(n)
    for i in range(n):
        if range_every and i % range_every == range_every - 1:
            where = f"amount > {rng.randrange(1000)}"
        else:
            where = f"region = 'r{i % REGIONS}'"
        definition = ShapeDefinition(name=f"s{i}", table="orders", where=where)
        index.add(bind(definition, RELATION, ["id"]))
    return index


def make_changes(count: int, kind: str, seed: int = 7) -> list[Insert | Update]:
    rng = random.Random(seed)
    changes: list[Insert | Update] = []
    for i in range(count):
        row = (
            str(i).encode(),
            f"r{rng.randrange(REGIONS)}".encode(),
            str(rng.randrange(1000)).encode(),
            b"some note text",
        )
        if kind == "insert":
            changes.append(Insert(RELATION.oid, row))
        else:
            old = (row[0], f"r{rng.randrange(REGIONS)}".encode(), row[2], row[3])
            changes.append(Update(RELATION.oid, old, "O", row))
    return changes


def measure(index: ShapeIndex, changes: Sequence[Insert | Update]) -> tuple[float, float]:
    """(changes/s, emitted rows/s), best of three."""
    best = 0.0
    emitted = 0
    run: Callable[[ShapeIndex, Insert | Update], list[object]] = convert  # type: ignore[assignment]
    for _ in range(3):
        start = time.perf_counter()
        emitted = 0
        for change in changes:
            emitted += len(run(index, change))
        elapsed = time.perf_counter() - start
        best = max(best, len(changes) / elapsed)
    return best, best * emitted / len(changes)


def main() -> None:
    print(f"{'scenario':<34}{'shapes':>7}{'changes/s':>13}{'rows out/s':>13}")
    inserts = make_changes(50_000, "insert")
    updates = make_changes(50_000, "update")
    for label, range_every in (("equality", None), ("mix (1 in 10 range)", 10)):
        for n in (1, 10, 100, 1000):
            index = build_index(n, range_every)
            # fewer changes when every change evaluates many range predicates
            batch = inserts if not range_every or n <= 100 else inserts[:5_000]
            rate, rows = measure(index, batch)
            print(f"{label + ', insert':<34}{n:>7}{rate:>13,.0f}{rows:>13,.0f}")
    for n in (1, 100):
        rate, rows = measure(build_index(n, None), updates)
        print(f"{'equality, update (FULL)':<34}{n:>7}{rate:>13,.0f}{rows:>13,.0f}")


if __name__ == "__main__":
    main()
