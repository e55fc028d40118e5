"""The fold without Spark (``tidemark.sink.fold_arrow``) against the source's state.

The same histories as the Spark fold's test (``tests/fold_cases.py``: a snapshot, then
inserts, updates with and without an unchanged TOAST column, deletes, key changes and
truncates): folded as of any transaction's LSN, the Arrow fold must equal the source
table's state then; folded from a state part way (a current table) plus the rest, too.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.fold_cases import (
    KEYLESS_KEY,
    KEYLESS_SCHEMA,
    SCHEMA,
    fold_model,
    keyless_cases,
    ops,
    simulate,
    simulate_keyless,
)

from tidemark.sink.fold_arrow import fold_arrow, fold_arrow_onto

history = st.tuples(
    st.lists(st.integers(0, 6), unique=True, max_size=4),
    ops,
    st.integers(1, 4),
    st.integers(0, 30),
    st.integers(0, 30),
)


def _table(rows: list[tuple[object, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[]] * len(SCHEMA)
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA
    )


def _state(table: pa.Table) -> dict[int, tuple[object, object]]:
    return {r["id"]: (r["a"], r["big"]) for r in table.to_pylist()}


@settings(max_examples=300, deadline=None)
@given(history)
def test_the_arrow_fold_equals_the_source_at_any_lsn(case) -> None:  # type: ignore[no-untyped-def]
    snapshot, script, txn_size, pick, middle = case
    rows, states = simulate(0, snapshot, script, txn_size)
    changes = _table(rows)
    as_of, expected = states[pick % len(states)]

    folded = fold_arrow(changes, ["case", "id"], as_of)
    assert _state(folded) == expected
    assert folded.column_names == ["case", "id", "a", "big", "_lsn"]
    model = fold_model(changes.to_pylist(), ["id"], as_of)
    assert {k[0]: (v["a"], v["big"]) for k, v in model.items()} == expected

    # from a current table folded through an earlier LSN, plus the rows after it
    base_lsn, _ = states[min(middle % len(states), pick % len(states))]
    base = fold_arrow(changes, ["case", "id"], base_lsn)
    lsn = changes["_lsn"].to_pylist()
    tail = changes.filter(pa.array([base_lsn < x <= as_of for x in lsn], pa.bool_()))
    assert _state(fold_arrow_onto(base, tail, ["case", "id"])) == expected


def test_a_key_whose_last_change_left_a_column_unchanged_keeps_its_earlier_value() -> None:
    rows = [
        (0, 1, "a", "BIG", 100, 0, "snapshot", None),
        (0, 1, "b", None, 200, 0, "update", ["big"]),
        (0, 1, "c", None, 300, 0, "update", ["big"]),
        (0, 2, "x", None, 300, 2, "insert", None),
    ]
    state = _state(fold_arrow(_table(rows), ["case", "id"]))
    assert state == {1: ("c", "BIG"), 2: ("x", None)}


def test_an_empty_changelog_folds_to_an_empty_state() -> None:
    folded = fold_arrow(_table([]), ["case", "id"])
    assert folded.num_rows == 0 and folded.column_names == ["case", "id", "a", "big", "_lsn"]


# -- keyless tables: the whole row is the key, and a row may be there several times -------

keyless_history = keyless_cases.map(lambda cases: cases[0])


def _copies(table: pa.Table) -> Counter:
    return Counter((r["n"], r["s"]) for r in table.to_pylist())


def _keyless_table(rows: list[tuple[object, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[]] * len(KEYLESS_SCHEMA)
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, KEYLESS_SCHEMA, strict=True)],
        schema=KEYLESS_SCHEMA,
    )


@settings(max_examples=300, deadline=None)
@given(keyless_history)
def test_a_keyless_fold_keeps_every_copy_the_source_has(case) -> None:  # type: ignore[no-untyped-def]
    snapshot, script, txn_size, pick, middle = case
    rows, states = simulate_keyless(0, snapshot, script, txn_size)
    changes = _keyless_table(rows)
    as_of, expected = states[pick % len(states)]

    folded = fold_arrow(changes, KEYLESS_KEY, as_of)
    assert _copies(folded) == expected
    assert folded.column_names == ["case", "n", "s", "_lsn"]

    # a current table folded through an earlier LSN holds the copies as rows; the rest on it
    base_lsn, _ = states[min(middle % len(states), pick % len(states))]
    base = fold_arrow(changes, KEYLESS_KEY, base_lsn)
    lsn = changes["_lsn"].to_pylist()
    tail = changes.filter(pa.array([base_lsn < x <= as_of for x in lsn], pa.bool_()))
    assert _copies(fold_arrow_onto(base, tail, KEYLESS_KEY)) == expected


def test_deleting_one_copy_of_a_keyless_row_keeps_the_others() -> None:
    rows = [
        (0, 1, "x", 100, 0, "snapshot", None),
        (0, 1, "x", 100, 1, "snapshot", None),
        (0, 1, "x", 100, 2, "snapshot", None),
        (0, 6, None, 100, 3, "snapshot", None),
        (0, 6, None, 100, 4, "snapshot", None),
        (0, 1, "x", 200, 0, "delete", None),
        (0, 6, None, 200, 1, "delete", None),
        (0, 7, "dup", 300, 0, "insert", None),
        (0, 7, "dup", 300, 1, "insert", None),
    ]
    folded = fold_arrow(_keyless_table(rows), KEYLESS_KEY)
    assert _copies(folded) == Counter({(1, "x"): 2, (6, None): 1, (7, "dup"): 2})
    assert sorted(folded["_lsn"].to_pylist()) == [200, 200, 200, 300, 300]
