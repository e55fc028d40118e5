"""The fold (current state as of an LSN) against a model of the source table.

Hypothesis generates what a source table goes through: a snapshot, then
transactions of inserts, updates (some with an unchanged TOAST column that was
not sent), deletes, key changes (delete + insert) and truncates. The changelog a
shape would hold is folded by Spark (``tidemark.read.fold``); the result must
equal the source table's state at a random LSN. Many independent cases go into
one Spark job (the case number is part of the key) to keep this fast.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark import read

from .sink_support import fold_model

SCHEMA = pa.schema(
    [
        ("case", pa.int32()),
        ("id", pa.int32()),
        ("a", pa.string()),
        ("big", pa.string()),
        ("_lsn", pa.int64()),
        ("_op", pa.int32()),
        ("_kind", pa.string()),
        ("_unchanged", pa.list_(pa.string())),
    ]
)

ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "update", "update_toast", "delete", "rekey", "truncate"]),
        st.integers(0, 6),  # key
        st.integers(0, 6),  # new key (rekey)
        st.text(alphabet="xyz", max_size=3) | st.none(),  # value (None = SQL NULL)
    ),
    max_size=25,
)


def simulate(
    case: int,
    snapshot_keys: list[int],
    script: list[tuple[str, int, int, str | None]],
    txn_size: int,
):  # type: ignore[no-untyped-def]
    """Rows of the changelog, and the source state after each transaction."""
    state: dict[int, tuple[str | None, str | None]] = {}
    rows = []
    lsn = 1000
    for op, k in enumerate(snapshot_keys):
        state[k] = (f"s{k}", f"B{k}")
        rows.append((case, k, f"s{k}", f"B{k}", lsn, op, "snapshot", None))
    states = [(lsn, dict(state))]
    for start in range(0, len(script), txn_size):
        lsn += 100
        for i, (kind, k, k2, v) in enumerate(script[start : start + txn_size]):
            op = 2 * i  # as the collector numbers rows: change i -> 2i (and 2i + 1)
            if kind == "insert" and k not in state:
                state[k] = (v, f"B{v}")
                rows.append((case, k, v, f"B{v}", lsn, op, "insert", None))
            elif kind == "update" and k in state:
                state[k] = (v, f"b{v}")
                rows.append((case, k, v, f"b{v}", lsn, op, "update", None))
            elif kind == "update_toast" and k in state:
                state[k] = (v, state[k][1])  # big unchanged: not sent
                rows.append((case, k, v, None, lsn, op, "update", ["big"]))
            elif kind == "delete" and k in state:
                del state[k]
                rows.append((case, k, None, None, lsn, op, "delete", None))
            elif kind == "rekey" and k in state and k2 not in state:
                old = state.pop(k)
                state[k2] = old
                rows.append((case, k, None, None, lsn, op, "delete", None))
                rows.append((case, k2, old[0], old[1], lsn, op + 1, "insert", None))
            elif kind == "truncate":
                state.clear()
                rows.append((case, None, None, None, lsn, op, "truncate", None))
        states.append((lsn, dict(state)))
    return rows, states


cases = st.lists(
    st.tuples(
        st.lists(st.integers(0, 6), unique=True, max_size=4),
        ops,
        st.integers(1, 4),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=12,
)


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
