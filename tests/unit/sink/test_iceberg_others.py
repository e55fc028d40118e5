"""What other writers may do to an Iceberg changelog between tidemark's commits
(``snapshots.others_change``, the rule both commit paths apply)."""

from __future__ import annotations

from tidemark.sink.iceberg.snapshots import is_own, others_change, others_refusal


def test_a_summary_with_a_key_of_tidemarks_is_tidemarks() -> None:
    assert is_own({"tidemark.generation": "0"})
    assert is_own({"tidemark-epoch": "3", "added-records": "1"})
    assert not is_own({"added-records": "1", "spark.app.id": "x"})
    assert not is_own({})


def test_others_appends_are_built_on() -> None:
    assert others_change([], 7, False) is None
    assert others_change([(8, "append"), (9, "append")], 7, False) is None


def test_anything_but_an_append_is_refused_the_oldest_first() -> None:
    assert others_change([(8, "append"), (9, "overwrite"), (10, "delete")], 7, False) == (
        "overwrite",
        9,
    )
    assert others_change([(8, "replace")], 7, False) == ("replace", 8)


def test_a_schema_changed_by_others_is_refused_even_without_a_snapshot() -> None:
    assert others_change([], 7, True) == ("schema", 7)
    assert others_change([(8, "append")], 7, True) == ("schema", 7)


def test_a_history_without_tidemarks_snapshots_is_refused() -> None:
    assert others_change([(8, "append"), (9, "append")], None, False) == ("history", 8)
    assert others_change([], None, False) is None  # (a table with no snapshot yet)


def test_the_refusal_names_the_shape_the_table_and_what_to_do() -> None:
    text = others_refusal("orders", "tidemark.orders", "overwrite", 9, 7)
    assert "shape 'orders'" in text and "tidemark.orders" in text
    assert "snapshot 9 is another writer's 'overwrite'" in text
    assert "rollback_to_snapshot('tidemark.orders', 7)" in text
    assert "tidemark shapes resync orders" in text
    schema = others_refusal("orders", "tidemark.orders", "schema", 7, 7)
    assert "schema was changed" in schema and "rollback" not in schema
    assert "resync orders" in schema
