"""The fold (current state as of an LSN) against a model of the source table.

Hypothesis generates what a source table goes through: a snapshot, then
transactions of inserts, updates (some with an unchanged TOAST column that was
not sent), deletes, key changes (delete + insert) and truncates. The changelog a
shape would hold is folded by Spark (``tidemark.read.fold``); the result must
equal the source table's state at a random LSN. Many independent cases go into
one Spark job (the case number is part of the key) to keep this fast.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings

from tests.fold_cases import (
    KEYLESS_KEY,
    KEYLESS_SCHEMA,
    SCHEMA,
    cases,
    fold_model,
    keyless_cases,
    simulate,
    simulate_keyless,
)
from tidemark import read


@settings(max_examples=15, deadline=None)
@given(cases)
def test_fold_equals_the_source_state_at_any_lsn(spark, batch) -> None:  # type: ignore[no-untyped-def]
    all_rows = []
    expected: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    as_of_by_case = {}
    for case, (snap, script, txn_size, pick) in enumerate(batch):
        rows, states = simulate(case, snap, script, txn_size)
        all_rows += rows
        as_of, state = states[pick % len(states)]
        as_of_by_case[case] = as_of
        # the row we fold is filtered per case below; the expected state is the source's
        for k, v in state.items():
            expected[(case, k)] = v
    columns = list(zip(*all_rows, strict=True)) if all_rows else [[]] * len(SCHEMA)
    table = pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA
    )
    frame = spark.createDataFrame(table)
    # cases have different as-of LSNs: fold each case's rows up to its own LSN by
    # dropping later rows first, then folding everything at once
    from pyspark.sql import functions as F

    limit = F.create_map(*[x for c, lsn in as_of_by_case.items() for x in (F.lit(c), F.lit(lsn))])
    frame = frame.where(F.col("_lsn") <= limit[F.col("case")])
    folded = read.fold(frame, ["case", "id"], scope=["case"])
    got = {(r["case"], r["id"]): (r["a"], r["big"]) for r in folded.collect()}
    assert got == expected
    # and the plain model agrees with the source too (a check of the test itself)
    model = {}
    for case in as_of_by_case:
        case_rows = [dict(zip(SCHEMA.names, r, strict=True)) for r in all_rows if r[0] == case]
        for key, values in fold_model(case_rows, ["id"], as_of_by_case[case]).items():
            model[(case, key[0])] = (values["a"], values["big"])
    assert model == expected


@settings(max_examples=10, deadline=None)
@given(keyless_cases)
def test_a_keyless_fold_keeps_every_copy_the_source_has(spark, batch) -> None:  # type: ignore[no-untyped-def]
    """A table without a primary key: the whole row is the key and Postgres may hold a
    row several times; the fold (and a fold onto a state folded part way, as a current
    table's refresh does) holds each row as many times as the source does."""
    from pyspark.sql import functions as F

    all_rows, expected = [], Counter()
    as_of_by_case, base_by_case = {}, {}
    for case, (snap, script, txn_size, pick, middle) in enumerate(batch):
        rows, states = simulate_keyless(case, snap, script, txn_size)
        all_rows += rows
        as_of, state = states[pick % len(states)]
        base_lsn, _ = states[min(middle % len(states), pick % len(states))]
        as_of_by_case[case], base_by_case[case] = as_of, base_lsn
        expected.update({(case, *row): n for row, n in state.items()})
    columns = list(zip(*all_rows, strict=True)) if all_rows else [[]] * len(KEYLESS_SCHEMA)
    table = pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, KEYLESS_SCHEMA, strict=True)],
        schema=KEYLESS_SCHEMA,
    )
    frame = spark.createDataFrame(table)
    limit = F.create_map(*[x for c, lsn in as_of_by_case.items() for x in (F.lit(c), F.lit(lsn))])
    middle = F.create_map(*[x for c, lsn in base_by_case.items() for x in (F.lit(c), F.lit(lsn))])
    frame = frame.where(F.col("_lsn") <= limit[F.col("case")])
    folded = read.fold(frame, KEYLESS_KEY, scope=["case"])
    assert Counter((r["case"], r["n"], r["s"]) for r in folded.collect()) == expected

    # fold_onto folds one shape: a truncate in its tail clears the whole base, so the
    # cases folded together here are those whose tail has none
    plain = [
        c
        for c in as_of_by_case
        if not any(
            r[0] == c and r[5] == "truncate" and base_by_case[c] < r[3] <= as_of_by_case[c]
            for r in all_rows
        )
    ]
    frame = frame.where(F.col("case").isin(plain))
    base = read.fold(
        frame.where(F.col("_lsn") <= middle[F.col("case")]), KEYLESS_KEY, scope=["case"]
    )
    tail = frame.where(F.col("_lsn") > middle[F.col("case")])
    onto = read.fold_onto(read.snapshot_rows(base, frame.schema), tail, KEYLESS_KEY)
    got = Counter((r["case"], r["n"], r["s"]) for r in onto.collect())
    assert got == Counter({k: n for k, n in expected.items() if k[0] in plain})
