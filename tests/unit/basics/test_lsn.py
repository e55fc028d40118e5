"""Lsn text form and LogOffset ordering (tidemark.lsn)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.lsn import LAST_OP, MAX_LSN, LogOffset, Lsn, format_lsn, offset_of

lsns = st.integers(0, MAX_LSN)
offsets = st.builds(LogOffset, st.integers(0, MAX_LSN), st.integers(0, LAST_OP))


@given(lsns)
def test_format_then_parse_gives_the_same_lsn(value: int) -> None:
    text = format_lsn(value)
    assert Lsn.parse(text) == value
    assert Lsn(text) == value
    assert str(Lsn(value)) == text


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_parse_reads_two_hex_halves_in_any_case_and_padding(hi: int, lo: int) -> None:
    assert Lsn.parse(f"{hi:x}/{lo:08X}") == (hi << 32) | lo
    assert Lsn.parse(f" {hi:X}/{lo:x} ") == (hi << 32) | lo


def test_postgres_examples() -> None:
    assert Lsn.parse("16/B374D848") == 0x16_B374_D848
    assert str(Lsn(0x16_B374_D848)) == "16/B374D848"
    assert str(Lsn(0)) == "0/0"
    assert repr(Lsn("0/1")) == "Lsn('0/1')"


@pytest.mark.parametrize("text", ["", "16", "16/", "/1", "G/1", "1/123456789", "1/2/3", "-1/0"])
def test_malformed_text_is_rejected_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="16/B374D848"):
        Lsn.parse(text)


@pytest.mark.parametrize("value", [-1, MAX_LSN + 1])
def test_lsn_outside_64_bits_is_rejected(value: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        Lsn(value)


@given(lsns, st.integers(0, 1000))
def test_lsn_arithmetic_stays_an_lsn(value: int, delta: int) -> None:
    if value + delta <= MAX_LSN:
        assert isinstance(Lsn(value) + delta, Lsn)
        assert Lsn(value) + delta == value + delta
    if value - delta >= 0:
        assert isinstance(Lsn(value) - delta, Lsn)


@given(lsns, lsns)
def test_lsn_order_is_numeric_order_not_text_order(a: int, b: int) -> None:
    assert (Lsn(a) < Lsn(b)) == (a < b)


@given(offsets, offsets)
def test_log_offsets_are_ordered_by_transaction_then_operation(a: LogOffset, b: LogOffset) -> None:
    assert (a < b) == ((a.tx_offset, a.op_offset) < (b.tx_offset, b.op_offset))
    assert (a == b) == ((a.tx_offset, a.op_offset) == (b.tx_offset, b.op_offset))


@given(st.lists(offsets, min_size=1, max_size=20))
def test_sorting_offsets_is_a_total_order(items: list[LogOffset]) -> None:
    ordered = sorted(items)
    assert all(x <= y for x, y in pairwise(ordered))


@given(offsets)
def test_before_all_precedes_every_real_offset(offset: LogOffset) -> None:
    assert LogOffset.before_all() < offset
    assert LogOffset.before_all() < LogOffset(0, 0)


@given(st.integers(1, MAX_LSN), st.integers(0, LAST_OP), st.integers(0, MAX_LSN), st.data())
def test_prev_tx_lies_between_earlier_transactions_and_this_one(
    tx: int, op: int, other_tx: int, data: st.DataObject
) -> None:
    offset = LogOffset(tx, op)
    boundary = offset.prev_tx()
    other = LogOffset(other_tx, data.draw(st.integers(0, LAST_OP - 1)))
    # every change of this transaction comes after the boundary
    assert boundary < LogOffset(tx, 0) <= offset
    # every change of an earlier transaction comes before it, every later one after
    if other_tx < tx:
        assert other < boundary
    else:
        assert other > boundary
    assert boundary == LogOffset.last_of(tx - 1)


def test_offset_text_form() -> None:
    assert str(LogOffset(0x16_B374_D848, 3)) == "16/B374D848:3"
    assert str(LogOffset.last_of(1)) == "0/1:last"
    assert str(LogOffset.before_all()) == "-1:0"


@given(st.integers(-1, MAX_LSN), st.integers(0, LAST_OP))
def test_the_fast_constructor_builds_the_same_log_offset(tx: int, op: int) -> None:
    made = offset_of((tx, op))
    assert type(made) is LogOffset and made == LogOffset(tx, op)
    assert (made.tx_offset, made.op_offset, str(made)) == (tx, op, str(LogOffset(tx, op)))
