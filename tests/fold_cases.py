"""A source table's history and the fold written plainly, shared by the fold tests.

``simulate`` plays what a source table goes through (a snapshot, then transactions of
inserts, updates, some with an unchanged TOAST column not sent, deletes, key changes
and truncates) and returns the changelog rows a shape would hold with the source's
state after each transaction; ``fold_model`` is the fold rule by rule. The Spark fold
(tests/integration/test_fold.py) and the Arrow fold (tests/unit/sink/test_fold_arrow.py)
are both held to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from hypothesis import strategies as st

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


def fold_model(
    rows: Sequence[dict[str, object]], key: Sequence[str], as_of: int | None = None
) -> dict[tuple[object, ...], dict[str, object]]:
    """The fold, written plainly (for comparison with tidemark.read.fold)."""
    ordered = sorted(
        (r for r in rows if as_of is None or int(r["_lsn"]) <= as_of),  # type: ignore[call-overload]
        key=lambda r: (r["_kind"] != "snapshot", r["_lsn"], r["_op"]),
    )
    state: dict[tuple[object, ...], dict[str, object]] = {}
    for r in ordered:
        kind = r["_kind"]
        if kind == "truncate":
            state.clear()
            continue
        k = tuple(r[c] for c in key)
        if kind == "delete":
            state.pop(k, None)
            continue
        values = {c: v for c, v in r.items() if not c.startswith("_")}
        for c in r.get("_unchanged") or []:  # type: ignore[attr-defined]
            values[c] = state.get(k, {}).get(c)
        state[k] = values
    return state


# -- a table without a primary key (REPLICA IDENTITY FULL): the whole row is the key ------

KEYLESS_SCHEMA = pa.schema(
    [
        ("case", pa.int32()),
        ("n", pa.int32()),
        ("s", pa.string()),
        ("_lsn", pa.int64()),
        ("_op", pa.int32()),
        ("_kind", pa.string()),
        ("_unchanged", pa.list_(pa.string())),
    ]
)
KEYLESS_KEY = ["case", "n", "s"]

_keyless_row = st.tuples(st.integers(0, 3) | st.none(), st.sampled_from(["x", "y"]) | st.none())
keyless_ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "insert", "delete_one", "delete_some", "update_one", "truncate"]
        ),
        _keyless_row,
        _keyless_row,  # the new row of an update
        st.integers(1, 4),  # copies inserted or deleted
    ),
    max_size=25,
)


def simulate_keyless(
    case: int,
    snapshot: list[tuple[int | None, str | None]],
    script: list[tuple[str, tuple, tuple, int]],
    txn_size: int,
):  # type: ignore[no-untyped-def]
    """A keyless table's changelog as the collector writes it (an update of one copy is
    the delete of the old row and the insert of the new one; a delete carries the whole
    row), and its state after each transaction as a multiset: {row: copies}."""
    from collections import Counter

    state: Counter = Counter()
    rows = []
    lsn = 1000
    for op, row in enumerate(snapshot):
        state[row] += 1
        rows.append((case, *row, lsn, op, "snapshot", None))
    states = [(lsn, +state)]
    for start in range(0, len(script), txn_size):
        lsn += 100
        op = 0
        for kind, row, new, copies in script[start : start + txn_size]:
            if kind == "insert":
                for _ in range(copies):
                    state[row] += 1
                    rows.append((case, *row, lsn, op, "insert", None))
                    op += 1
            elif kind in ("delete_one", "delete_some") and state[row]:
                for _ in range(1 if kind == "delete_one" else min(copies, state[row])):
                    state[row] -= 1
                    rows.append((case, *row, lsn, op, "delete", None))
                    op += 1
            elif kind == "update_one" and state[row] and new != row:
                state[row] -= 1
                state[new] += 1
                rows.append((case, *row, lsn, op, "delete", None))
                rows.append((case, *new, lsn, op + 1, "insert", None))
                op += 2
            elif kind == "truncate":
                state.clear()
                rows.append((case, None, None, lsn, op, "truncate", None))
                op += 1
        states.append((lsn, +state))
    return rows, states


keyless_cases = st.lists(
    st.tuples(
        st.lists(_keyless_row, max_size=6),
        keyless_ops,
        st.integers(1, 4),
        st.integers(0, 30),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=8,
)
