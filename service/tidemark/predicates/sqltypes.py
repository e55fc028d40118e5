"""The SQL types a shape predicate computes with, and Postgres's input of their literals.

``SqlType`` describes a Postgres type as far as predicates are concerned: its name,
oid, *family* (how Python represents and compares it), width for integers and floats,
and element type for arrays. ``sql_type(oid)`` gives the type of a column, or None
when predicates cannot evaluate the type exactly (see ``values.is_supported``; arrays
of real, double precision and character are excluded on purpose: element comparison
would not be exact). ``type_name(oid)`` names any oid for messages.

``input_function(type, typmod params)`` is Postgres's type input function for that
type, used for literals (``'17'`` compared with an integer column becomes 17) and for
explicit casts from text. It accepts what Postgres accepts for the types above
(e.g. ``'yes'``, ``'on'``, ``'t'`` for boolean; ``' 12 '`` for integers), and raises
``ValueError`` or ``ArithmeticError`` where Postgres raises, with two deliberate
refusals: the date and time words that depend on the clock (``'now'``, ``'today'``
...; ``'epoch'`` and ``'allballs'`` too), and timestamptz text without a UTC offset
(Postgres would read it in the session time zone, which differs between
connections). ``'infinity'``, ``'-infinity'`` and the time ``'24:00:00'`` become
``operators.TemporalExtreme`` values, as column values do.

Python representations: bool, int, Decimal, float, str, bytes, uuid.UUID, date,
time, naive datetime (timestamp), datetime in UTC (timestamptz), nested lists
(arrays). ``RAW_EQUALITY`` lists the types whose text output is canonical, so two
values are equal exactly when their text is: equality can compare raw bytes.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any, Final

from tidemark.errors import ShapeError
from tidemark.pgoutput import values
from tidemark.predicates.operators import INT_CHECK, OutOfRange, f4, numeric_typmod
from tidemark.predicates.temporal import END_OF_DAY, NEG_INFINITY, POS_INFINITY, TemporalExtreme


@dataclass(frozen=True, slots=True)
class SqlType:
    """A Postgres type as far as predicates are concerned."""

    name: str
    oid: int
    family: str  # bool int numeric float text bytea uuid date time timestamp timestamptz array
    bits: int = 0  # width of int / float types
    element: SqlType | None = None  # arrays only


BOOL: Final = SqlType("boolean", 16, "bool")
INT2: Final = SqlType("smallint", 21, "int", 16)
INT4: Final = SqlType("integer", 23, "int", 32)
INT8: Final = SqlType("bigint", 20, "int", 64)
NUMERIC: Final = SqlType("numeric", 1700, "numeric")
FLOAT4: Final = SqlType("real", 700, "float", 32)
FLOAT8: Final = SqlType("double precision", 701, "float", 64)
TEXT: Final = SqlType("text", 25, "text")
VARCHAR: Final = SqlType("character varying", 1043, "text")
BPCHAR: Final = SqlType("character", 1042, "text")
BYTEA: Final = SqlType("bytea", 17, "bytea")
UUID: Final = SqlType("uuid", 2950, "uuid")
DATE: Final = SqlType("date", 1082, "date")
TIME: Final = SqlType("time without time zone", 1083, "time")
TIMESTAMP: Final = SqlType("timestamp without time zone", 1114, "timestamp")
TIMESTAMPTZ: Final = SqlType("timestamp with time zone", 1184, "timestamptz")
UNKNOWN: Final = SqlType("unknown", 705, "unknown")

SCALARS: Final = (
    BOOL,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    FLOAT4,
    FLOAT8,
    TEXT,
    VARCHAR,
    BPCHAR,
    BYTEA,
    UUID,
    DATE,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
)
_ARRAY_OIDS: Final = {
    BOOL: 1000,
    INT2: 1005,
    INT4: 1007,
    INT8: 1016,
    NUMERIC: 1231,
    TEXT: 1009,
    VARCHAR: 1015,
    BYTEA: 1001,
    UUID: 2951,
    DATE: 1182,
    TIME: 1183,
    TIMESTAMP: 1115,
    TIMESTAMPTZ: 1185,
}
_ARRAYS: Final = {
    element: SqlType(element.name + "[]", oid, "array", element=element)
    for element, oid in _ARRAY_OIDS.items()
}
_BY_OID: Final[dict[int, SqlType]] = {t.oid: t for t in (*SCALARS, *_ARRAYS.values())}
# Array oids we know but cannot compute with exactly (float NaN, char padding).
_UNSUPPORTED_ARRAYS: Final = {1021: "real[]", 1022: "double precision[]", 1014: "character[]"}

# Types whose text output is canonical: equal values have equal bytes, so equality
# can compare the raw bytes and never parse them.
RAW_EQUALITY: Final = frozenset({INT2, INT4, INT8, TEXT, VARCHAR, UUID, BOOL})


def sql_type(type_oid: int) -> SqlType | None:
    """The predicate type for a column type oid, or None when predicates cannot use it."""
    found = _BY_OID.get(type_oid)
    if found is None or not values.is_supported(type_oid):
        return None
    return found


def type_name(type_oid: int) -> str:
    """Postgres's name for a type oid, for messages."""
    known = _BY_OID.get(type_oid)
    if known is not None:
        return known.name
    return (
        values.TYPE_NAMES.get(type_oid)
        or _UNSUPPORTED_ARRAYS.get(type_oid)
        or (f"type oid {type_oid}")
    )


def array_of(element: SqlType, what: str) -> SqlType:
    found = _ARRAYS.get(element)
    if found is None:
        raise ShapeError(
            f"arrays of {element.name} are not supported in a shape predicate ({what}): "
            "element comparison would not be exact"
        )
    return found


def text_key(t: SqlType) -> SqlType:
    return TEXT if t.family == "text" else t


_INT_TEXT: Final = re.compile(r"\s*[+-]?\d+\s*\Z")
_NUMERIC_TEXT: Final = re.compile(
    r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)\s*\Z", re.IGNORECASE
)
_FLOAT_TEXT: Final = re.compile(
    r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)\s*\Z", re.IGNORECASE
)


def _in_bool(text: str) -> bool:
    s = text.strip().lower()
    if s and ("true".startswith(s) or "yes".startswith(s) or s in ("on", "1")):
        return True
    if s and ("false".startswith(s) or "no".startswith(s) or s in ("off", "of", "0")):
        return False
    raise ValueError(f"invalid input syntax for type boolean: {text!r}")


def _in_int(bits: int) -> Callable[[str], int]:
    check = INT_CHECK[bits]

    def parse(text: str) -> int:
        if not _INT_TEXT.match(text):
            raise ValueError(f"invalid input syntax for type integer: {text!r}")
        return check(int(text))

    return parse


def _in_numeric(text: str) -> Decimal:
    if not _NUMERIC_TEXT.match(text):
        raise ValueError(f"invalid input syntax for type numeric: {text!r}")
    return Decimal(text.strip())


def _in_float(bits: int) -> Callable[[str], float]:
    def parse(text: str) -> float:
        if not _FLOAT_TEXT.match(text):
            raise ValueError(f"invalid input syntax for type {bits}-bit float: {text!r}")
        value = float(text)
        if math.isinf(value) and "inf" not in text.lower():
            raise OutOfRange(f"{text!r} is out of range for a {bits}-bit float")
        return f4(value) if bits == 32 else value

    return parse


def _in_bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode()
            i += 1
        elif text[i + 1 : i + 2] == "\\":
            out.append(0x5C)
            i += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[i + 1 : i + 4]):
            out.append(int(text[i + 1 : i + 4], 8))
            i += 4
        else:
            raise ValueError(f"invalid input syntax for type bytea: {text!r}")
    return bytes(out)


def _in_uuid(text: str) -> uuid.UUID:
    s = text.strip()
    if s.lower().startswith("urn:"):
        raise ValueError(f"invalid input syntax for type uuid: {text!r}")
    return uuid.UUID(s)


_TIME_WORDS: Final = frozenset({"now", "today", "tomorrow", "yesterday", "allballs", "epoch"})
_END_OF_DAY: Final = re.compile(r"24:00(?::00(?:\.0*)?)?\Z")


def _special(text: str, kind: str) -> TemporalExtreme | None:
    """'infinity' / '-infinity' as Postgres reads them; the words that depend on the
    clock (or that tidemark does not implement) are refused."""
    s = text.strip().lower()
    if s in ("infinity", "+infinity"):
        return POS_INFINITY
    if s == "-infinity":
        return NEG_INFINITY
    if s in _TIME_WORDS:
        raise ValueError(f"{kind} value {text!r} is not supported in a shape predicate")
    return None


def _in_date(text: str) -> date | TemporalExtreme:
    return _special(text, "date") or date.fromisoformat(text.strip())


def _in_time(text: str) -> time | TemporalExtreme:
    s = text.strip()
    if s.lower() in _TIME_WORDS or s.lower().endswith("infinity"):
        raise ValueError(f"time value {text!r} is not supported in a shape predicate")
    if _END_OF_DAY.match(s):
        return END_OF_DAY
    value = time.fromisoformat(s)
    if value.tzinfo is not None:
        raise ValueError(f"time without time zone cannot carry a zone: {text!r}")
    return value


def _iso_datetime(text: str) -> datetime:
    s = text.strip()
    if s.upper().endswith(" UTC"):
        s = s[:-4] + "+00:00"
    return datetime.fromisoformat(s)


def _in_timestamp(text: str) -> datetime | TemporalExtreme:
    # Postgres ignores a zone written in a timestamp-without-zone literal.
    return _special(text, "timestamp") or _iso_datetime(text).replace(tzinfo=None)


def _in_timestamptz(text: str) -> datetime | TemporalExtreme:
    special = _special(text, "timestamptz")
    if special is not None:
        return special
    value = _iso_datetime(text)
    if value.tzinfo is None:
        raise ValueError(
            f"timestamptz value {text!r} has no UTC offset; Postgres would read it in the "
            "session time zone, which differs between connections: write e.g. "
            "'2024-01-01 00:00:00+00'"
        )
    return value.astimezone(UTC)


def _parse_array_text(text: str) -> list[Any]:
    """Postgres array input syntax ``{a,"b c",NULL,{1,2}}`` into nested lists of str|None."""
    pos = 0
    s = text.strip()

    def skip_space() -> None:
        nonlocal pos
        while pos < len(s) and s[pos].isspace():
            pos += 1

    def parse_list() -> list[Any]:
        nonlocal pos
        if pos >= len(s) or s[pos] != "{":
            raise ValueError(f"malformed array literal: {text!r}")
        pos += 1
        items: list[Any] = []
        skip_space()
        if pos < len(s) and s[pos] == "}":
            pos += 1
            return items
        while True:
            skip_space()
            if pos < len(s) and s[pos] == "{":
                items.append(parse_list())
            elif pos < len(s) and s[pos] == '"':
                pos += 1
                chars: list[str] = []
                while pos < len(s) and s[pos] != '"':
                    if s[pos] == "\\":
                        pos += 1
                    if pos < len(s):
                        chars.append(s[pos])
                    pos += 1
                if pos >= len(s):
                    raise ValueError(f"malformed array literal: {text!r}")
                pos += 1
                items.append("".join(chars))
            else:
                start = pos
                while pos < len(s) and s[pos] not in ',}{"':
                    pos += 1
                raw = s[start:pos].strip()
                if not raw:
                    raise ValueError(f"malformed array literal: {text!r}")
                items.append(None if raw.upper() == "NULL" else raw.replace("\\", ""))
            skip_space()
            if pos < len(s) and s[pos] == ",":
                pos += 1
                continue
            if pos < len(s) and s[pos] == "}":
                pos += 1
                return items
            raise ValueError(f"malformed array literal: {text!r}")

    result = parse_list()
    if s[pos:].strip():
        raise ValueError(f"malformed array literal: {text!r}")
    return result


def length_limited(n: int | None, pad_char: bool) -> Callable[[str], str]:
    def limit(v: str) -> str:
        cut = v[:n] if n is not None else v
        return cut.rstrip(" ") if pad_char else cut

    return limit


def input_function(t: SqlType, params: tuple[int, ...]) -> Callable[[str], Any]:
    """Text -> value for ``t`` (raises ValueError / ArithmeticError on bad input)."""
    f = t.family
    if f == "bool":
        return _in_bool
    if f == "int":
        return _in_int(t.bits)
    if f == "numeric":
        if params:
            typmod = numeric_typmod(params[0], params[1] if len(params) > 1 else 0)
            return lambda s: typmod(_in_numeric(s))
        return _in_numeric
    if f == "float":
        return _in_float(t.bits)
    if f == "text":
        if t is BPCHAR or params:
            return length_limited(params[0] if params else None, t is BPCHAR)
        return str
    simple: dict[str, Callable[[str], Any]] = {
        "bytea": _in_bytea,
        "uuid": _in_uuid,
        "date": _in_date,
        "time": _in_time,
        "timestamp": _in_timestamp,
        "timestamptz": _in_timestamptz,
    }
    if f in simple:
        return simple[f]
    assert t.element is not None, t
    element_input = input_function(t.element, params)

    def parse_array(text: str) -> list[Any]:
        def convert(items: list[Any]) -> list[Any]:
            return [
                convert(e) if type(e) is list else (None if e is None else element_input(e))
                for e in items
            ]

        return convert(_parse_array_text(text))

    return parse_array
