"""Per-shape conversion of table changes, and the invariant that folding a shape's
changes reproduces the source table filtered by the shape."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.pgoutput.messages import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    Update,
)
from tidemark.shapes.convert import (
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    Routed,
    convert,
    convert_truncate,
)
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync, bind
from tidemark.shapes.routing import ShapeIndex


def relation(identity: str) -> Relation:
    full = identity == "f"
    return Relation(
        16384,
        "public",
        "orders",
        identity,  # type: ignore[arg-type]
        (
            RelationColumn("id", 23, -1, True),
            RelationColumn("region", 25, -1, full),
            RelationColumn("amount", 23, -1, full),
            RelationColumn("note", 25, -1, full),
        ),
    )


FULL, DEFAULT = relation("f"), relation("d")


def index_of(rel: Relation, *specs: tuple[str, str | None, list[str] | None]) -> ShapeIndex:
    index = ShapeIndex(rel)
    for name, where, columns in specs:
        definition = ShapeDefinition.model_validate(
            {"name": name, "table": "orders", "where": where, "columns": columns}
        )
        index.add(bind(definition, rel, ["id"]))
    return index


def r(*values: Any) -> tuple[Any, ...]:
    return tuple(v.encode() if isinstance(v, str) else v for v in values)


def by_shape(items: Routed) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in items:
        if isinstance(item, ShapeResync):
            out.setdefault(item.shape, []).append("resync")
        else:
            name, kind, values, unchanged = item
            out.setdefault(name, []).append((kind, values, unchanged))
    return out


EU = ("eu", "region = 'eu'", None)
EU_AMOUNT = ("eu_amount", "region = 'eu'", ["amount"])
ALL = ("all", None, None)
SMALL_IDS = ("small_ids", "id < 10", ["region"])


# --- inserts, deletes, truncate -----------------------------------------------------------


def test_an_insert_reaches_matching_shapes_projected_to_their_columns() -> None:
    index = index_of(FULL, EU, EU_AMOUNT, ALL)
    result = by_shape(convert(index, Insert(1, r("1", "eu", "5", "n"))))
    assert result == {
        "eu": [(INSERT, r("1", "eu", "5", "n"), None)],
        "eu_amount": [(INSERT, r("1", "5"), None)],
        "all": [(INSERT, r("1", "eu", "5", "n"), None)],
    }
    assert by_shape(convert(index, Insert(1, r("2", "us", "5", "n")))) == {
        "all": [(INSERT, r("2", "us", "5", "n"), None)]
    }


def test_a_delete_with_the_full_old_row_reaches_the_shapes_it_was_in() -> None:
    index = index_of(FULL, EU, ALL)
    result = by_shape(convert(index, Delete(1, r("1", "eu", "5", "n"), "O")))
    assert result == {
        "eu": [(DELETE, r("1", "eu", "5", "n"), None)],
        "all": [(DELETE, r("1", "eu", "5", "n"), None)],
    }


def test_a_delete_with_only_the_key_carries_the_key_and_nulls() -> None:
    index = index_of(DEFAULT, SMALL_IDS, ALL)
    result = by_shape(convert(index, Delete(1, r("3", None, None, None), "K")))
    assert result == {
        "small_ids": [(DELETE, r("3", None), None)],
        "all": [(DELETE, r("3", None, None, None), None)],
    }
    assert by_shape(convert(index, Delete(1, r("30", None, None, None), "K"))) == {
        "all": [(DELETE, r("30", None, None, None), None)]
    }


def test_truncate_reaches_every_shape_of_the_table() -> None:
    index = index_of(FULL, EU, ALL)
    assert sorted(convert_truncate(index)) == [  # type: ignore[type-var]
        ("all", TRUNCATE, (), None),
        ("eu", TRUNCATE, (), None),
    ]


# --- updates ------------------------------------------------------------------------------


def test_an_update_inside_the_shape_is_an_update() -> None:
    index = index_of(FULL, EU)
    change = Update(1, r("1", "eu", "5", "n"), "O", r("1", "eu", "6", "n"))
    assert by_shape(convert(index, change)) == {"eu": [(UPDATE, r("1", "eu", "6", "n"), None)]}


def test_an_update_moving_a_row_out_of_the_shape_is_a_delete_of_the_old_row() -> None:
    index = index_of(FULL, EU)
    change = Update(1, r("1", "eu", "5", "n"), "O", r("1", "us", "5", "n"))
    assert by_shape(convert(index, change)) == {"eu": [(DELETE, r("1", "eu", "5", "n"), None)]}


def test_an_update_moving_a_row_into_the_shape_is_an_insert_of_the_new_row() -> None:
    index = index_of(FULL, EU)
    change = Update(1, r("1", "us", "5", "n"), "O", r("1", "eu", "5", "n"))
    assert by_shape(convert(index, change)) == {"eu": [(INSERT, r("1", "eu", "5", "n"), None)]}


def test_an_update_outside_the_shape_before_and_after_does_not_reach_it() -> None:
    index = index_of(FULL, EU)
    assert convert(index, Update(1, r("1", "us", "5", "n"), "O", r("1", "fr", "5", "n"))) == []


def test_a_primary_key_change_is_a_delete_of_the_old_key_then_an_insert() -> None:
    index = index_of(FULL, EU, EU_AMOUNT)
    change = Update(1, r("1", "eu", "5", "n"), "O", r("2", "eu", "5", "n"))
    assert by_shape(convert(index, change)) == {
        "eu": [(DELETE, r("1", "eu", "5", "n"), None), (INSERT, r("2", "eu", "5", "n"), None)],
        "eu_amount": [(DELETE, r("1", "5"), None), (INSERT, r("2", "5"), None)],
    }


def test_with_the_default_identity_a_key_change_sends_the_old_key() -> None:
    # given a key-only predicate; the old key decides the old membership
    index = index_of(DEFAULT, SMALL_IDS, ALL)
    change = Update(1, r("5", None, None, None), "K", r("50", "eu", "1", "n"))
    assert by_shape(convert(index, change)) == {
        "small_ids": [(DELETE, r("5", None), None)],
        "all": [(DELETE, r("5", None, None, None), None), (INSERT, r("50", "eu", "1", "n"), None)],
    }


def test_without_an_old_tuple_the_key_did_not_change_and_membership_is_the_same() -> None:
    index = index_of(DEFAULT, SMALL_IDS, ALL)
    change = Update(1, None, None, r("5", "eu", "1", "n"))
    assert by_shape(convert(index, change)) == {
        "small_ids": [(UPDATE, r("5", "eu"), None)],
        "all": [(UPDATE, r("5", "eu", "1", "n"), None)],
    }


def test_an_update_that_changes_none_of_the_shape_columns_is_dropped() -> None:
    # given the full old row: only note changes, which eu_amount does not project
    index = index_of(FULL, EU, EU_AMOUNT)
    change = Update(1, r("1", "eu", "5", "n"), "O", r("1", "eu", "5", "changed"))
    assert by_shape(convert(index, change)) == {
        "eu": [(UPDATE, r("1", "eu", "5", "changed"), None)]
    }
    same = Update(1, r("1", "eu", "5", "n"), "O", r("1", "eu", "5", "n"))
    assert convert(index, same) == []


# --- unchanged TOAST ------------------------------------------------------------------------


def test_unchanged_toast_is_filled_from_the_full_old_row() -> None:
    index = index_of(FULL, EU)
    change = Update(1, r("1", "eu", "5", "long"), "O", r("1", "eu", "6", UNCHANGED_TOAST))
    assert by_shape(convert(index, change)) == {"eu": [(UPDATE, r("1", "eu", "6", "long"), None)]}


def test_unchanged_toast_without_the_old_row_is_reported_by_column_name() -> None:
    index = index_of(DEFAULT, SMALL_IDS, ALL)
    change = Update(1, None, None, r("5", "eu", "1", UNCHANGED_TOAST))
    assert by_shape(convert(index, change)) == {
        "small_ids": [(UPDATE, r("5", "eu"), None)],
        "all": [(UPDATE, r("5", "eu", "1", UNCHANGED_TOAST), ("note",))],
    }


def test_a_row_entering_a_shape_without_its_toast_value_needs_a_resync() -> None:
    # the key moves into small_ids; note was not sent and no previous row can supply it
    index = index_of(DEFAULT, ("small_note", "id < 10", ["note"]), SMALL_IDS)
    change = Update(1, r("50", None, None, None), "K", r("5", "eu", "1", UNCHANGED_TOAST))
    result = convert(index, change)
    assert by_shape(result) == {
        "small_note": ["resync"],
        "small_ids": [(INSERT, r("5", "eu"), None)],
    }
    resync = next(i for i in result if isinstance(i, ShapeResync))
    assert "note" in resync.reason and "REPLICA IDENTITY FULL" in resync.reason


def test_a_predicate_on_a_toast_value_that_was_not_sent_needs_a_resync() -> None:
    # identity DEFAULT with a key-only predicate cannot read a TOASTed key that was not
    # sent; the shape resyncs rather than guess
    index = index_of(DEFAULT, SMALL_IDS, ALL)
    change = Update(1, None, None, r(UNCHANGED_TOAST, "eu", "1", "n"))
    result = by_shape(convert(index, change))
    assert result["small_ids"] == ["resync"]
    assert result["all"] == [(UPDATE, r(UNCHANGED_TOAST, "eu", "1", "n"), ("id",))]


def test_a_value_a_predicate_cannot_evaluate_resyncs_only_that_shape() -> None:
    rel = Relation(
        16384,
        "public",
        "orders",
        "f",
        (RelationColumn("id", 23, -1, True), RelationColumn("d", 1082, -1, True)),
    )
    index = ShapeIndex(rel)
    for name, where in (("recent", "d > '2000-01-01'"), ("everything", None)):
        index.add(bind(ShapeDefinition(name=name, table="orders", where=where), rel, ["id"]))
    result = by_shape(convert(index, Insert(1, r("1", "0044-03-15 BC"))))
    assert result == {"recent": ["resync"], "everything": [(INSERT, r("1", "0044-03-15 BC"), None)]}


# --- invariant: folding each shape's changes reproduces the filtered source table ----------

COLUMNS = ("id", "region", "amount", "note")
SHAPES_FULL = [
    ("eu", "region = 'eu'", None),
    ("eu_amount", "region = 'eu' AND amount > 2", ["amount"]),
    ("big", "amount >= 3", ["note"]),
    ("some_ids", "id IN (1, 2, 3)", None),
    ("all", None, ["region"]),
    ("note_like", "note LIKE 'b%'", None),
]
SHAPES_DEFAULT = [
    ("small", "id < 4", None),
    ("ids", "id IN (2, 5)", ["amount"]),
    ("all", None, None),
]

ids = st.integers(1, 6)
payload = st.tuples(
    st.sampled_from(["eu", "us", None]), st.integers(0, 5), st.sampled_from(["a", "b", "bb"])
)
operation = st.one_of(
    st.tuples(st.just("insert"), ids, payload, st.booleans()),
    st.tuples(st.just("update"), ids, payload, st.booleans()),
    st.tuples(st.just("rekey"), ids, ids, st.booleans()),
    st.tuples(st.just("delete"), ids, st.none(), st.booleans()),
    st.tuples(st.just("truncate"), st.none(), st.none(), st.booleans()),
)


def _text(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(None if v is None else str(v).encode() for v in row)


class Sink:
    """A shape's table folded by primary key, as the lake table's reader would."""

    def __init__(self, shape: BoundShape) -> None:
        self.shape = shape
        self.rows: dict[Any, tuple[Any, ...]] = {}
        self.resyncing = False
        names = [c.name for c in shape.output_columns]
        self.key_at = [names.index(k) for k in shape.primary_key]

    def key(self, values: tuple[Any, ...]) -> Any:
        return tuple(values[i] for i in self.key_at)

    def apply(self, kind: str, values: tuple[Any, ...], unchanged: tuple[str, ...] | None) -> None:
        if kind == TRUNCATE:
            self.rows.clear()
            return
        key = self.key(values)
        if kind == INSERT:
            assert key not in self.rows, f"{self.shape.name}: insert of a present key {key}"
            self.rows[key] = values
        elif kind == UPDATE:
            assert key in self.rows, f"{self.shape.name}: update of an absent key {key}"
            if unchanged:
                names = [c.name for c in self.shape.output_columns]
                previous = self.rows[key]
                values = tuple(
                    previous[i] if name in unchanged else v
                    for i, (name, v) in enumerate(zip(names, values, strict=True))
                )
            self.rows[key] = values
        elif kind == DELETE:
            assert key in self.rows, f"{self.shape.name}: delete of an absent key {key}"
            del self.rows[key]
        else:
            raise AssertionError(f"unknown kind {kind!r}")


def expected_rows(shape: BoundShape, table: dict[int, tuple[Any, ...]]) -> dict[Any, Any]:
    out = {}
    for row in table.values():
        data = _text(row)
        if shape.predicate is None or shape.predicate.matches(data):
            values = shape.project(data)
            out[tuple(values[i] for i in range(len(shape.primary_key)))] = values
    return out


def run_stream(identity: str, specs: list[Any], ops: list[Any]) -> None:
    rel = relation(identity)
    index = index_of(rel, *specs)
    sinks = {s.name: Sink(s) for s in index.shapes}
    table: dict[int, tuple[Any, ...]] = {}
    for op, a, b, toast in ops:
        change: Any = None
        if op == "insert" and a not in table:
            table[a] = (a, *b)
            change = Insert(1, _text(table[a]))
        elif op == "update" and a in table:
            old, new = table[a], (a, *b)
            table[a] = new
            new_text = _text(new)
            if toast and old[3] == new[3]:  # Postgres sends 'u' only for an unchanged value
                new_text = (*new_text[:3], UNCHANGED_TOAST)
            if identity == "f":
                change = Update(1, _text(old), "O", new_text)
            else:
                change = Update(1, None, None, new_text)
        elif op == "rekey" and a in table and b not in table:
            old = table.pop(a)
            new = (b, *old[1:])
            table[b] = new
            new_text = _text(new)
            if toast:
                new_text = (*new_text[:3], UNCHANGED_TOAST)
            if identity == "f":
                change = Update(1, _text(old), "O", new_text)
            else:
                change = Update(1, _text((a, None, None, None)), "K", new_text)
        elif op == "delete" and a in table:
            old = table.pop(a)
            if identity == "f":
                change = Delete(1, _text(old), "O")
            else:
                change = Delete(1, _text((a, None, None, None)), "K")
        elif op == "truncate":
            table.clear()
            items: Routed = convert_truncate(index)
            change = None
            for name, kind, values, unchanged in items:  # type: ignore[misc]
                sinks[name].apply(kind, values, unchanged)
        if change is not None:
            for item in convert(index, change):
                if isinstance(item, ShapeResync):
                    sinks[item.shape].resyncing = True
                    continue
                name, kind, values, unchanged = item
                if not sinks[name].resyncing:
                    sinks[name].apply(kind, values, unchanged)
        for sink in sinks.values():
            if sink.resyncing:  # the collector rebuilds the shape from a snapshot
                sink.rows = expected_rows(sink.shape, table)
                sink.resyncing = False
            assert sink.rows == expected_rows(sink.shape, table), (sink.shape.name, op, a, b)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=40))
def test_folding_shape_changes_equals_the_filtered_source_with_identity_full(
    ops: list[Any],
) -> None:
    run_stream("f", SHAPES_FULL, ops)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=40))
def test_folding_shape_changes_equals_the_filtered_source_with_identity_default(
    ops: list[Any],
) -> None:
    run_stream("d", SHAPES_DEFAULT, ops)
