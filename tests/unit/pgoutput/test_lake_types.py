"""Lake types: what a column's Postgres type is (catalog descriptions, declared casts)
and how its text output becomes an Arrow column, refused rather than rounded."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import ProtocolError, ShapeError, SinkError, UnfitValue
from tidemark.pgoutput.messages import Relation, RelationColumn
from tidemark.pgoutput.values import CatalogType, describe, lake_column, python_parser, to_arrow
from tidemark.pgoutput.values.pgtype import (
    FIRST_CATALOG_OID,
    PgType,
    is_described,
    pack_numeric_typmod,
    resolve_domain,
)
from tidemark.pgoutput.values.record_text import split_multirange, split_range, split_record
from tidemark.shapes.catalog import CatalogColumn, CatalogTable, Collation, check_shape
from tidemark.shapes.column_casts import ColumnCast, parse_cast, split_column_list
from tidemark.shapes.model import ShapeDefinition, ShapeResync, bind, rebind
from tidemark.sink.schema import column_specs, table_schema
from tidemark.writers.arrow_batch import build_table
from tidemark.writers.buffer import Rows

INT4, INT8, TEXT, NUMERIC, INTERVAL, TIME, TIMETZ, POINT = 23, 20, 25, 1700, 1186, 1083, 1266, 600
INT4RANGE, INT4MULTIRANGE, INTERVAL_ARRAY, INET = 3904, 4451, 1187, 869
MOOD, ADDRESS, ADDRESS_ARRAY, MONEY_D, AMOUNT_D, FLOATRANGE = (
    20001,
    20002,
    20003,
    20004,
    20005,
    20006,
)
INTERVAL_TYPE = pa.struct(
    [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
)

CATALOG = {
    MOOD: CatalogType(MOOD, "mood", "e"),
    ADDRESS: CatalogType(
        ADDRESS,
        "address",
        "c",
        fields=(("street", TEXT, -1), ("zip", INT4, -1), ("fee", MONEY_D, -1)),
    ),
    ADDRESS_ARRAY: CatalogType(ADDRESS_ARRAY, "address[]", "a", ADDRESS),
    # a domain over a domain over numeric(10,2): the outermost modifier set wins
    AMOUNT_D: CatalogType(AMOUNT_D, "amount", "d", NUMERIC, pack_numeric_typmod(10, 2)),
    MONEY_D: CatalogType(MONEY_D, "money_d", "d", AMOUNT_D, -1),
    FLOATRANGE: CatalogType(FLOATRANGE, "floatrange", "r", 701),
}


# --- what a type is ---


def test_built_in_types_are_described_without_the_catalog() -> None:
    assert describe(INT4) == PgType("integer", "scalar", INT4)
    assert describe(NUMERIC, pack_numeric_typmod(18, 4)).name == "numeric(18,4)"
    interval_array = describe(INTERVAL_ARRAY)
    assert interval_array.kind == "array" and interval_array.element == describe(INTERVAL)
    assert describe(INT4RANGE).element == describe(INT4)
    multirange = describe(INT4MULTIRANGE)
    assert multirange.kind == "multirange" and multirange.element == describe(INT4RANGE)
    assert describe(INET).kind == "text"  # no deliberate mapping


def test_user_types_are_described_from_the_catalog() -> None:
    assert describe(MOOD, -1, CATALOG).kind == "enum"
    address = describe(ADDRESS, -1, CATALOG)
    assert address.kind == "composite"
    assert [name for name, _ in address.fields] == ["street", "zip", "fee"]
    fee = dict(address.fields)["fee"]
    assert (fee.kind, fee.oid, fee.typmod) == ("scalar", NUMERIC, pack_numeric_typmod(10, 2))
    assert describe(ADDRESS_ARRAY, -1, CATALOG).element == address
    assert describe(FLOATRANGE, -1, CATALOG).element == describe(701)
    # without the catalog, a user type is text (counted), never guessed
    assert describe(MOOD).kind == "text"


def test_the_catalog_never_overrides_a_fixed_oid() -> None:
    fake = {INT4: CatalogType(INT4, "int4", "e"), 9000: CatalogType(9000, "x", "e")}
    assert describe(INT4, -1, fake).kind == "scalar"
    assert describe(9000, -1, fake).kind == "text"
    assert is_described(9000, {}) and not is_described(FIRST_CATALOG_OID, {})


def test_domains_resolve_to_their_base_with_the_outermost_modifier() -> None:
    assert resolve_domain(MONEY_D, -1, CATALOG) == (NUMERIC, pack_numeric_typmod(10, 2))
    assert resolve_domain(MONEY_D, pack_numeric_typmod(5, 1), CATALOG) == (
        NUMERIC,
        pack_numeric_typmod(5, 1),
    )
    assert resolve_domain(INT4, -1, CATALOG) == (INT4, -1)


# --- text syntax of composites and ranges ---


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        (b"(1,abc,)", [b"1", b"abc", None]),
        (b"(,)", [None, None]),
        (b'("")', [b""]),
        (b'(1,"a ""b"" \\\\ c",)', [b"1", b'a "b" \\ c', None]),
        (b'("(1,""x y"")","{1,2}")', [b'(1,"x y")', b"{1,2}"]),
        (b"(a\\,b)", [b"a,b"]),  # record_in accepts a backslash escape too
    ],
)
def test_composite_text_splits_into_raw_fields(text: bytes, fields: list[bytes | None]) -> None:
    assert split_record(text) == fields


def record_out(fields: list[str | None]) -> bytes:
    """Postgres's record_out: quote when needed, double quotes and backslashes."""
    out = []
    for field in fields:
        if field is None:
            out.append("")
        elif field == "" or any(c in field for c in '"\\(),') or any(c.isspace() for c in field):
            out.append('"' + field.replace("\\", "\\\\").replace('"', '""') + '"')
        else:
            out.append(field)
    return ("(" + ",".join(out) + ")").encode()


@given(
    st.lists(
        st.none()
        | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
        min_size=1,
    )
)
def test_any_composite_round_trips_through_record_out(fields: list[str | None]) -> None:
    expected = [None if f is None else f.encode() for f in fields]
    assert split_record(record_out(fields)) == expected


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        (b"[1,5)", (b"1", b"5", True, False, False, False, False)),
        (b"(,6)", (None, b"6", False, False, True, False, False)),
        (b"(,)", (None, None, False, False, True, True, False)),
        (b"empty", (None, None, False, False, False, False, True)),
        (b'["2020-01-01 00:00:00+00",infinity)',
         (b"2020-01-01 00:00:00+00", b"infinity", True, False, False, False, False)),
        (b'["a,b","c""d"]', (b"a,b", b'c"d', True, True, False, False, False)),
        (b'["",""]', (b"", b"", True, True, False, False, False)),  # empty strings, bounded
    ],
)  # fmt: skip
def test_range_text_splits_into_bounds_and_flags(text: bytes, parts: tuple[Any, ...]) -> None:
    assert split_range(text) == parts


def test_multirange_text_splits_into_ranges() -> None:
    assert split_multirange(b"{}") == []
    assert split_multirange(b"{[1,3),[5,7)}") == [
        (b"1", b"3", True, False, False, False, False),
        (b"5", b"7", True, False, False, False, False),
    ]
    assert split_multirange(b"{(,0), [10,)}")[1][5] is True  # upper_inf


@pytest.mark.parametrize(
    ("split", "text"),
    [
        (split_record, b"1,2"),
        (split_record, b'("unclosed)'),
        (split_range, b"[1,5"),
        (split_range, b"1,5)"),
        (split_range, b"[1,5) x"),
        (split_multirange, b"{[1,3),}"),
        (split_multirange, b"[1,3)"),
    ],
)
def test_malformed_composite_and_range_text_raises_protocol_error(split: Any, text: bytes) -> None:
    with pytest.raises(ProtocolError):
        split(text)


# --- interval, time, timetz, point ---


def pg_interval(months: int, days: int, micros: int) -> bytes:
    """Postgres's interval output in IntervalStyle=postgres (EncodeInterval)."""
    years = int(months / 12)  # C division truncates toward zero
    out, is_zero, is_before = "", True, False
    for value, unit in ((years, "year"), (months - years * 12, "mon"), (days, "day")):
        if value:
            plus = "+" if is_before and value > 0 else ""
            out += ("" if is_zero else " ") + f"{plus}{value} {unit}" + ("" if value == 1 else "s")
            is_before, is_zero = value < 0, False
    if is_zero or micros:
        sign = "-" if micros < 0 else ("+" if is_before else "")
        hours, rest = divmod(abs(micros), 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, fraction = divmod(rest, 1_000_000)
        clock = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
        if fraction:
            clock += "." + f"{fraction:06d}".rstrip("0")
        out += ("" if is_zero else " ") + sign + clock
    return out.encode()


@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
)
def test_interval_text_converts_to_postgres_own_three_fields(
    months: int, days: int, micros: int
) -> None:
    text = pg_interval(months, days, micros)
    column = to_arrow([text, None], INTERVAL)
    assert column.type == INTERVAL_TYPE
    assert column.to_pylist() == [{"months": months, "days": days, "microseconds": micros}, None]
    # the predicates' parser reads the same text to the same fields
    parsed = python_parser(INTERVAL)(text)
    assert (parsed.months, parsed.days, parsed.microseconds) == (months, days, micros)


def test_infinite_intervals_keep_postgres_encoding() -> None:
    column = to_arrow([b"infinity", b"1 day", b"-infinity"], INTERVAL).to_pylist()
    assert column[0] == {"months": 2**31 - 1, "days": 2**31 - 1, "microseconds": 2**63 - 1}
    assert column[1] == {"months": 0, "days": 1, "microseconds": 0}
    assert column[2] == {"months": -(2**31), "days": -(2**31), "microseconds": -(2**63)}


def test_time_is_microseconds_since_midnight_and_timetz_keeps_its_offset() -> None:
    times = [b"00:00:00", b"12:34:56.789", b"24:00:00", None]
    assert to_arrow(times, TIME).to_pylist() == [0, 45_296_789_000, 86_400_000_000, None]
    zoned = to_arrow([b"12:00:00+05:30", b"00:00:00.5-01:02:03", None], TIMETZ).to_pylist()
    assert zoned == [
        {"microseconds": 43_200_000_000, "utc_offset_seconds": 19_800},
        {"microseconds": 500_000, "utc_offset_seconds": -3723},
        None,
    ]


def test_points_are_two_doubles() -> None:
    points = to_arrow([b"(1.5,-2)", b"(NaN,-Infinity)", None], POINT).to_pylist()
    assert points[0] == {"x": 1.5, "y": -2.0}
    assert math.isnan(points[1]["x"]) and points[1]["y"] == -math.inf
    assert points[2] is None


@pytest.mark.parametrize(
    ("type_oid", "text"),
    [(TIME, b"12:34"), (TIMETZ, b"12:00:00"), (INTERVAL, b"1 fortnight"), (INTERVAL, b""),
     (POINT, b"(1;2)"), (POINT, b"(a,b)")],
)  # fmt: skip
def test_text_these_types_never_output_raises_protocol_error(type_oid: int, text: bytes) -> None:
    with pytest.raises(ProtocolError):
        to_arrow([b"12:00:00" if type_oid == TIME else None, text], type_oid)


# --- containers: ranges, arrays, composites ---


def test_ranges_and_multiranges_become_structs_of_typed_bounds() -> None:
    ranges = to_arrow([b"[1,5)", b"(,6)", b"empty", None], INT4RANGE)
    assert ranges.type.field("lower").type == pa.int32()
    assert ranges.to_pylist()[1] == {
        "lower": None, "upper": 6, "lower_inc": False, "upper_inc": False,
        "lower_inf": True, "upper_inf": False, "empty": False,
    }  # fmt: skip
    assert ranges.to_pylist()[2]["empty"] is True and ranges.to_pylist()[3] is None
    multiranges = to_arrow([b"{[1,3),[5,7)}", b"{}", None], INT4MULTIRANGE).to_pylist()
    assert [r["lower"] for r in multiranges[0]] == [1, 5] and multiranges[1:] == [[], None]


def test_composites_become_structs_and_arrays_of_them_lists_of_structs() -> None:
    column = lake_column(describe(ADDRESS_ARRAY, -1, CATALOG))
    assert column.arrow_type == pa.list_(
        pa.struct([("street", pa.string()), ("zip", pa.int32()), ("fee", pa.decimal128(10, 2))])
    )
    values = [b'{"(\\"1 Main St\\",12345,1.50)",NULL,"(,,)"}', b"{}", None]
    assert column.to_arrow(values).to_pylist() == [
        [
            {"street": "1 Main St", "zip": 12345, "fee": Decimal("1.50")},
            None,
            {"street": None, "zip": None, "fee": None},
        ],
        [],
        None,
    ]


def test_a_composite_altered_since_the_catalog_was_read_is_refused() -> None:
    column = lake_column(describe(ADDRESS, -1, CATALOG))
    with pytest.raises(UnfitValue) as refused:
        column.to_arrow([b"(a,1,2.00,extra)"])
    assert "it has 4 fields, but the type had 3" in str(refused.value)
    assert "Resync the shape" in str(refused.value)


def test_a_snapshot_column_converts_like_the_stream_values() -> None:
    samples: dict[PgType, list[bytes | None]] = {
        describe(INTERVAL): [b"1 year -2 days +03:00:00", None],
        describe(TIME): [b"24:00:00", None],
        describe(TIMETZ): [b"01:00:00-03", None],
        describe(POINT): [b"(1,2)", None],
        describe(INT4RANGE): [b"[1,2)", b"empty", None],
        describe(INT4MULTIRANGE): [b"{[1,2)}", None],
        describe(ADDRESS_ARRAY, -1, CATALOG): [b'{"(x,1,)"}', None],
        describe(MOOD, -1, CATALOG): [b"happy", None],
    }
    for pg_type, values in samples.items():
        column = lake_column(pg_type)
        as_arrow = pa.array([None if v is None else v.decode() for v in values], pa.string())
        assert column.to_arrow(as_arrow).equals(column.to_arrow(values)), pg_type.name


# --- declared numeric: refused, never rounded ---


def declared(precision: int, scale: int) -> Any:
    return lake_column(ColumnCast("numeric", precision, scale).lake_type(describe(NUMERIC)))


def test_a_declared_numeric_holds_values_that_fit_exactly() -> None:
    column = declared(18, 4).to_arrow([b"12345678901234.5678", b"1.23450000", b"-0.0001", None])
    assert column.type == pa.decimal128(18, 4)
    assert column.to_pylist() == [
        Decimal("12345678901234.5678"),
        Decimal("1.2345"),  # trailing zeros are not digits that would be lost
        Decimal("-0.0001"),
        None,
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"NaN", "NaN has no decimal value"),
        (b"Infinity", "an infinite value has no decimal value"),
        (b"-Infinity", "an infinite value has no decimal value"),
        (b"123456789012345.5", "it has 15 digits before the decimal point and decimal128(18, 4) "
                               "holds 14"),
        (b"1.23456", "it has 5 digits after the decimal point and the scale is 4; tidemark "
                     "does not round"),
    ],
)  # fmt: skip
def test_a_declared_numeric_refuses_what_does_not_fit(value: bytes, reason: str) -> None:
    with pytest.raises(UnfitValue) as refused:
        declared(18, 4).to_arrow([b"1", value, b"2"])
    message = str(refused.value)
    assert f"value {value.decode()!r} does not fit decimal128(18, 4)" in message
    assert "numeric(18,4), declared by the shape" in message
    assert reason in message


def test_the_batch_refusal_names_the_shape_and_the_column() -> None:
    definition = ShapeDefinition(
        name="orders_lake", table="orders", columns=["amount::numeric(9,2)"]
    )
    relation = Relation(
        16400, "public", "orders", "d",
        (RelationColumn("id", INT4, -1, True), RelationColumn("amount", NUMERIC, -1, False)),
    )  # fmt: skip
    specs = column_specs(bind(definition, relation, ["id"]))
    rows = Rows(
        values=[(b"1", b"10.5"), (b"2", b"0.125")],
        ops=[0, 1],
        kinds=["insert", "insert"],
        unchanged=[None, None],
        runs=[(100, 7, 0, 2)],
    )
    with pytest.raises(UnfitValue) as refused:
        build_table(table_schema(specs), specs, rows, "orders_lake")
    message = str(refused.value)
    assert message.startswith("shape 'orders_lake', column amount: value '0.125' does not fit")
    assert "'amount::text'" in message


# --- shapes declare lake types ---


@pytest.mark.parametrize(
    ("text", "cast"),
    [
        ("numeric(18,4)", ColumnCast("numeric", 18, 4)),
        (" DECIMAL ( 38 , 0 ) ", ColumnCast("numeric", 38, 0)),
        ("numeric(5)", ColumnCast("numeric", 5, 0)),
        ("text", ColumnCast("text")),
    ],
)
def test_declared_types_parse(text: str, cast: ColumnCast) -> None:
    assert parse_cast(text) == cast


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("amount::numeric", "needs a precision and a scale"),
        ("amount::numeric(39,2)", "the precision must be 1 to 38"),
        ("amount::numeric(4,5)", "the scale cannot exceed the precision"),
        ("amount::int", "is not a lake type a shape can declare"),
        ("amount::numeric(10,-2)", "is not a lake type a shape can declare"),
    ],
)
def test_declared_types_that_cannot_be_held_are_refused(entry: str, fragment: str) -> None:
    with pytest.raises(ShapeError) as refused:
        ShapeDefinition(name="s", table="orders", columns=[entry])
    assert fragment in str(refused.value)


def test_columns_with_declared_types_are_stored_canonically() -> None:
    definition = ShapeDefinition(
        name="s", table="orders", columns=["Amount :: NUMERIC(18, 4)", '"a::b"::TEXT', "id"]
    )
    assert definition.columns == ("amount::numeric(18,4)", '"a::b"::text', "id")
    assert definition.column_names == ("amount", "a::b", "id")
    assert definition.casts == {"amount": ColumnCast("numeric", 18, 4), "a::b": ColumnCast("text")}
    assert ShapeDefinition(**definition.model_dump()) == definition
    with pytest.raises(ShapeError, match="listed twice"):
        ShapeDefinition(name="s", table="orders", columns=["amount", "amount::text"])


def test_the_command_line_column_list_keeps_declared_types_whole() -> None:
    assert split_column_list('id, amount::numeric(18,4), "a,b"::text') == [
        "id",
        "amount::numeric(18,4)",
        '"a,b"::text',
    ]


def catalog_table(
    *columns: CatalogColumn, types: dict[int, CatalogType] | None = None
) -> CatalogTable:
    return CatalogTable(
        oid=16400,
        schema="public",
        name="orders",
        kind="r",
        replica_identity="d",
        columns=(CatalogColumn("id", INT4, -1, "integer", "b", False, None), *columns),
        primary_key=("id",),
        identity_index=(),
        can_select=True,
        domain_bases={},
        encoding="UTF8",
        database_collation=Collation("default", "c", "C.UTF-8", True),
        types=types or {},
    )


def test_the_catalog_check_accepts_numeric_casts_on_numeric_columns_only() -> None:
    table = catalog_table(
        CatalogColumn("amount", NUMERIC, -1, "numeric", "b", False, None),
        CatalogColumn("label", TEXT, -1, "text", "b", False, None),
    )
    ok = ShapeDefinition(name="s", table="orders", columns=["amount::numeric(18,4)", "label::text"])
    assert check_shape(ok, table).as_text == ()
    wrong = ShapeDefinition(name="s", table="orders", columns=["label::numeric(18,4)"])
    with pytest.raises(ShapeError, match="'::numeric\\(p,s\\)' applies to numeric columns"):
        check_shape(wrong, table)


def test_only_types_without_a_mapping_are_reported_as_text() -> None:
    table = catalog_table(
        CatalogColumn("feeling", MOOD, -1, "mood", "e", False, None),
        CatalogColumn("host", INET, -1, "inet", "b", False, None),
        CatalogColumn("peer", INET, -1, "inet", "b", False, None),
        types={MOOD: CATALOG[MOOD]},
    )
    definition = ShapeDefinition(
        name="s", table="orders", columns=["feeling", "host", "peer::text"]
    )
    checked = check_shape(definition, table)
    assert checked.as_text == (("host", "inet"),)
    specs = column_specs(checked.shape)
    assert [s.arrow_type for s in specs] == [pa.int32(), pa.string(), pa.string(), pa.string()]
    assert [s.pg_type.kind for s in specs if s.pg_type] == ["scalar", "enum", "text", "text"]


# --- columns added later ---


def base_relation(*extra: RelationColumn) -> Relation:
    return Relation(
        16400, "public", "orders", "d", (RelationColumn("id", INT4, -1, True), *extra)
    )  # fmt: skip


def test_a_column_added_with_a_type_the_shape_has_not_read_resyncs_it() -> None:
    shape = bind(ShapeDefinition(name="s", table="orders"), base_relation(), ["id"], CATALOG)
    # an enum the catalog described: joins the shape
    known = rebind(shape, base_relation(RelationColumn("feeling", MOOD, -1, False)))
    assert not isinstance(known, ShapeResync)
    assert [c.name for c in known.output_columns] == ["id", "feeling"]
    assert column_specs(known)[1].arrow_type == pa.string()
    # a built-in type: joins the shape
    assert not isinstance(
        rebind(shape, base_relation(RelationColumn("n", INTERVAL, -1, False))), ShapeResync
    )
    # a type created since: the shape must read the catalog again
    unknown = rebind(shape, base_relation(RelationColumn("e", 30000, -1, False)))
    assert isinstance(unknown, ShapeResync)
    assert "column e was added" in unknown.reason and "oid 30000" in unknown.reason


def test_a_domain_column_the_stream_names_by_its_domain_is_the_same_column() -> None:
    # the catalog bound the column as its base type; the stream still says the domain
    bound_as_base = base_relation(RelationColumn("fee", NUMERIC, pack_numeric_typmod(10, 2), False))
    shape = bind(ShapeDefinition(name="s", table="orders"), bound_as_base, ["id"], CATALOG)
    rebound = rebind(shape, base_relation(RelationColumn("fee", MONEY_D, -1, False)))
    assert not isinstance(rebound, ShapeResync)
    assert column_specs(rebound)[1].arrow_type == pa.decimal128(10, 2)
    retyped = rebind(shape, base_relation(RelationColumn("fee", TEXT, -1, False)))
    assert isinstance(retyped, ShapeResync)


# --- a table written with another mapping ---


def test_a_table_whose_column_has_another_type_refuses_the_batch(tmp_path: Path) -> None:
    from tidemark.sink.delta.table import ShapeTable
    from tidemark.sink.schema import ColumnSpec
    from tidemark.writers.job import check_column_types

    table = ShapeTable(tmp_path, "old")
    table.create(table_schema([ColumnSpec("id", INT4), ColumnSpec("i", TEXT)]), ["id"])
    now = table_schema([ColumnSpec("id", INT4), ColumnSpec("i", INTERVAL)])
    with pytest.raises(SinkError) as refused:
        check_column_types(table, now)
    assert "column i is string in the lake table" in str(refused.value)
    assert "struct<months:int,days:int,microseconds:bigint>" in str(refused.value)
    check_column_types(table, table_schema([ColumnSpec("id", INT4), ColumnSpec("i", TEXT)]))


def test_a_predicate_reads_the_postgres_value_of_a_column_with_a_declared_type() -> None:
    definition = ShapeDefinition(
        name="s", table="orders", where="amount > 5", columns=["amount::numeric(18,4)"]
    )
    relation = Relation(
        16400, "public", "orders", "f",
        (RelationColumn("id", INT4, -1, True), RelationColumn("amount", NUMERIC, -1, True)),
    )  # fmt: skip
    shape = bind(definition, relation, ["id"])
    assert shape.predicate is not None
    assert shape.predicate.matches((b"1", b"5.00001"))
    assert shape.predicate.matches((b"2", b"NaN"))  # NaN sorts above every number in Postgres
    assert not shape.predicate.matches((b"3", b"4.99999"))
