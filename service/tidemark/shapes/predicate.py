"""Shape predicates: a SQL ``WHERE`` validated once and compiled into a fast row test.

A predicate goes through three steps:

1. ``parse_predicate(text)`` parses it with sqlglot (dialect ``postgres``) and checks
   its *form*: one boolean expression built only from the constructs listed below.
   Anything else raises ``ShapeError`` naming the construct (sub-queries, aggregates,
   window functions, parameters, functions that are not deterministic, unknown
   functions, unsupported operators, references to other tables, several
   statements). Unquoted identifiers are folded to lower case as Postgres does.
2. ``compile_predicate(parsed, columns)`` types it against the table's columns
   (``RelationColumn``: name, type oid, type modifier, position = index in the
   tuple) following Postgres's rules where the result depends on them, and
   generates one Python function. Column values are parsed from their text form
   only for the columns the predicate reads, with ``pgoutput.values.python_parser``.
   Constants reach the generated code through its namespace, never as source text;
   the only source text generated is made of fixed templates, integers and names.
3. ``compiled.matches(row)`` is the hot path (True only when the predicate is TRUE);
   ``compiled.evaluate(row)`` gives the SQL three-valued result (True/False/None).

``predicate_sql(compiled)`` regenerates Postgres SQL from the validated tree with
every identifier quoted (never the user's text), for pushing the predicate into a
snapshot query: the stream and the snapshot then apply the same predicate.

Supported: ``= <> != < <= > >=``, ``AND OR NOT``, ``IS [NOT] NULL``,
``IS [NOT] TRUE/FALSE/UNKNOWN``, ``IS [NOT] DISTINCT FROM``, ``[NOT] IN (...)``,
``[NOT] BETWEEN [SYMMETRIC]``, ``[NOT] LIKE/ILIKE`` with a constant pattern
(``%``, ``_``, backslash escape or ``ESCAPE 'c'``), ``+ - * / %`` and unary minus,
casts (``x::int``, ``CAST(x AS text)``, ``DATE '...'``), ``lower upper length
char_length abs coalesce nullif``, boolean columns used directly, arrays
(``ARRAY[...]``, ``'{...}'::int[]``, ``@> <@ &&``, ``op ANY/SOME/ALL (array)``),
``COLLATE "C"``/``"POSIX"``. Column types: boolean, smallint, integer, bigint,
numeric, real, double precision, text, varchar, char, bytea, uuid, date, time,
timestamp, timestamptz and arrays of these (not of real, double or char).

Decisions where Python and Postgres could differ (each one is tested):

* Errors. Where Postgres raises (division by zero, integer or float out of range,
  invalid input in a cast, ``LIKE`` on an invalid value) the whole predicate is an
  *error*: ``matches`` returns False and ``evaluate`` raises
  ``PredicateEvaluationError``. Postgres never returns a row whose predicate
  raises (its query fails instead), so "not in the shape" is the only answer that
  never adds a row Postgres would not; the error is not NULL, so ``IS NULL`` or
  ``NOT`` around it cannot turn it into a match. ``AND``/``OR`` short-circuit left
  to right as Postgres does in practice, so ``b <> 0 AND a / b > 1`` works. A
  constant sub-expression that fails (``1/0``) is rejected at definition time.
* Literal typing follows Postgres: ``'...'`` is of unknown type and takes the type
  of the other operand (``int_col = '17'`` compares integers, ``ts_col >
  '2024-01-01 00:00+00'`` compares timestamptz); integer literals are int4, else
  int8, else numeric; ``1.5`` and ``1e3`` are numeric. Mixed numeric comparisons
  and arithmetic go through Postgres's common type: int with numeric compares
  exactly as numeric, anything with real/double compares as double (so ``real_col
  = 0.1`` is false, as in Postgres); real values are rounded to single precision.
  Integer arithmetic is checked against the int2/int4/int8 range of its result
  type; ``/`` on integers truncates toward zero and ``%`` takes the dividend's sign.
  Numeric ``+ - * %`` are exact; numeric ``/`` is rejected, because its result
  scale follows Postgres internals that a comparison could expose.
* Float and numeric ``NaN`` equal themselves and sort above every other value.
* Text is compared as Python strings, i.e. in code point order, which is byte
  order of UTF-8: Postgres's ``"C"`` collation. Equality, ``IN``, ``LIKE`` and
  ``length`` do not depend on a (deterministic) collation and are always allowed;
  ordering comparisons on text (``< <= > >= BETWEEN``) depend on the database
  collation and are rejected unless one operand says ``COLLATE "C"`` (or
  ``"POSIX"``), which makes the pushed-down SQL mean exactly what we evaluate.
  ``lower``/``upper``/``ILIKE`` map ASCII exactly; other characters use a
  per-character Unicode mapping (libc-like), and only ASCII under ``COLLATE "C"``.
  ``char(n)`` values compare without trailing spaces, but ``LIKE`` sees them, both
  as in Postgres.
* Times: ``timestamptz`` literals must carry a UTC offset, and mixing ``timestamp``
  or ``date`` with ``timestamptz`` is rejected: Postgres would use the session's
  ``TimeZone``, which differs between the walsender and any snapshot query. Dates
  cast to text use the ISO style. Text is assumed to be UTF-8.
"""

from __future__ import annotations

import math
import re
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_HALF_UP,
    Context,
    Decimal,
)
from typing import Any, Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from tidemark.errors import ShapeError
from tidemark.pgoutput import values
from tidemark.pgoutput.messages import RelationColumn

Row = Sequence[Any]

# --------------------------------------------------------------------------------------
# identifiers

_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def fold_identifier(name: str, quoted: bool) -> str:
    """Postgres's identifier folding: unquoted names lose ASCII capitals only."""
    return name if quoted else name.translate(_ASCII_LOWER)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (always quoted, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------------------
# the SQL types a predicate can compute with


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

_SCALARS: Final = (
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
_BY_OID: Final[dict[int, SqlType]] = {t.oid: t for t in (*_SCALARS, *_ARRAYS.values())}
# Array oids we know but cannot compute with exactly (float NaN, char padding).
_UNSUPPORTED_ARRAYS: Final = {1021: "real[]", 1022: "double precision[]", 1014: "character[]"}

# Types whose text output is canonical: equal values have equal bytes, so equality
# can compare the raw bytes and never parse them.
_RAW_EQUALITY: Final = frozenset({INT2, INT4, INT8, TEXT, VARCHAR, UUID, BOOL})


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


def _array_of(element: SqlType, what: str) -> SqlType:
    found = _ARRAYS.get(element)
    if found is None:
        raise ShapeError(
            f"arrays of {element.name} are not supported in a shape predicate ({what}): "
            "element comparison would not be exact"
        )
    return found


def _text_key(t: SqlType) -> SqlType:
    return TEXT if t.family == "text" else t


# --------------------------------------------------------------------------------------
# errors and runtime helpers used by generated code


class PredicateEvaluationError(ShapeError):
    """The predicate raised for this row where Postgres would raise an error."""


class _OutOfRange(ArithmeticError):
    pass


# What Postgres would report as an error while evaluating: arithmetic problems and
# invalid input in casts. Anything else (TypeError ...) is a bug and propagates.
_EVAL_ERRORS: Final = (ArithmeticError, ValueError)

_INT_RANGE: Final = {
    16: (-(1 << 15), (1 << 15) - 1),
    32: (-(1 << 31), (1 << 31) - 1),
    64: (-(1 << 63), (1 << 63) - 1),
}


def _int_checker(bits: int) -> Callable[[int], int]:
    low, high = _INT_RANGE[bits]

    def check(value: int) -> int:
        if low <= value <= high:
            return value
        raise _OutOfRange(f"{value} is out of range for a {bits}-bit integer")

    return check


_ck2, _ck4, _ck8 = _int_checker(16), _int_checker(32), _int_checker(64)
_INT_CHECK: Final = {16: _ck2, 32: _ck4, 64: _ck8}


def _idiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _imod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


# Exact numeric arithmetic: Postgres's + - * % on numeric never round. Traps are off
# so that Infinity - Infinity gives NaN as in Postgres.
_NCTX: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
_nadd, _nsub, _nmul, _nneg, _nabs = (
    _NCTX.add,
    _NCTX.subtract,
    _NCTX.multiply,
    _NCTX.minus,
    _NCTX.abs,
)


def _nmod(a: Any, b: Any) -> Decimal:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return _NCTX.remainder(a, b)


_F32: Final = struct.Struct("f")


def _f4(x: float) -> float:
    """``x`` rounded to single precision; out of its range is an error, as in Postgres."""
    value: float = _F32.unpack(_F32.pack(x))[0]
    if math.isinf(value) and not math.isinf(x):
        raise _OutOfRange("value out of range: overflow")
    if value == 0.0 and x != 0.0:
        raise _OutOfRange("value out of range: underflow")
    return value


def _fcheck(r: float, a: float, b: float, zero_ok: bool) -> float:
    if math.isinf(r) and not (math.isinf(a) or math.isinf(b)):
        raise _OutOfRange("value out of range: overflow")
    if r == 0.0 and not zero_ok and a != 0.0 and b != 0.0:
        raise _OutOfRange("value out of range: underflow")
    return r


def _fadd(a: float, b: float) -> float:
    return _fcheck(a + b, a, b, True)


def _fsub(a: float, b: float) -> float:
    return _fcheck(a - b, a, b, True)


def _fmul(a: float, b: float) -> float:
    return _fcheck(a * b, a, b, False)


def _fdiv(a: float, b: float) -> float:
    if b == 0.0:
        raise ZeroDivisionError("division by zero")
    return _fcheck(a / b, a, 1.0 if math.isinf(b) else b, a == 0.0 or math.isinf(b))


def _f4op(op: Callable[[float, float], float]) -> Callable[[float, float], float]:
    def single(a: float, b: float) -> float:
        return _f4(op(a, b))

    return single


# NaN-aware comparisons for float and numeric (Postgres: NaN = NaN, NaN > all).
def _nan_eq(a: Any, b: Any) -> bool:
    return a == b or (a != a and b != b)


def _nan_ne(a: Any, b: Any) -> bool:
    return not (a == b or (a != a and b != b))


def _nan_lt(a: Any, b: Any) -> bool:
    if a == a and b == b:
        return bool(a < b)
    return a == a  # a is a number and b is NaN


def _nan_le(a: Any, b: Any) -> bool:
    return _nan_eq(a, b) or _nan_lt(a, b)


def _nan_gt(a: Any, b: Any) -> bool:
    return _nan_lt(b, a)


def _nan_ge(a: Any, b: Any) -> bool:
    return _nan_eq(a, b) or _nan_lt(b, a)


_NAN_KEY: Final = ("NaN",)


def _nkey(v: Any) -> Any:
    """Hashable key with NaN equal to NaN (for sets of float / numeric values)."""
    return _NAN_KEY if v != v else v


def _numeric_to_int(v: Decimal) -> int:
    # Postgres rounds numeric half away from zero when casting to an integer.
    return int(v.to_integral_value(rounding=ROUND_HALF_UP))


def _float_to_int(v: float) -> int:
    return round(v)  # rint(): half to even, as Postgres; NaN/inf raise


def _numeric_typmod(precision: int, scale: int) -> Callable[[Decimal], Decimal]:
    quantum = Decimal(1).scaleb(-scale)
    limit = Decimal(10) ** (precision - scale)

    def apply(v: Decimal | int) -> Decimal:
        v = Decimal(v)
        if v.is_nan():
            return v
        if v.is_infinite():
            raise _OutOfRange("numeric field overflow")
        rounded = Decimal(v).quantize(quantum, rounding=ROUND_HALF_UP, context=_NCTX)
        if abs(rounded) >= limit:
            raise _OutOfRange("numeric field overflow")
        return rounded

    return apply


def _numeric_text(v: Decimal) -> str:
    if v.is_nan():
        return "NaN"
    if v.is_infinite():
        return "Infinity" if v > 0 else "-Infinity"
    return format(v, "f")


def _bool_text(v: bool) -> str:
    return "true" if v else "false"


def _date_ts(v: date) -> datetime:
    return datetime(v.year, v.month, v.day)


def _timestamp_date(v: datetime) -> date:
    return v.date()


def _lower(s: str) -> str:
    if s.isascii():
        return s.lower()
    # One character in, one out (libc towlower style): Python's full mapping can
    # change the length (U+0130), Postgres's per-character mapping does not.
    return "".join(c if len(low := c.lower()) != 1 else low for c in s)


def _upper(s: str) -> str:
    if s.isascii():
        return s.upper()
    return "".join(c if len(up := c.upper()) != 1 else up for c in s)


def _lower_c(s: str) -> str:
    return s.translate(_ASCII_LOWER)


def _upper_c(s: str) -> str:
    return s.translate(_ASCII_UPPER)


def _flat(a: list[Any]) -> list[Any]:
    """Elements of a (possibly multi-dimensional) array in storage order."""
    if not any(type(e) is list for e in a):
        return a
    out: list[Any] = []
    for e in a:
        out.extend(_flat(e) if type(e) is list else (e,))
    return out


def _acontains(a: list[Any], b: list[Any]) -> bool:
    """``a @> b``: every element of b is in a; NULL elements never match."""
    have = {_nkey(e) for e in _flat(a) if e is not None}
    return all(e is not None and _nkey(e) in have for e in _flat(b))


def _aoverlap(a: list[Any], b: list[Any]) -> bool:
    have = {_nkey(e) for e in _flat(a) if e is not None}
    return any(e is not None and _nkey(e) in have for e in _flat(b))


def _any(test: Callable[[Any, Any], bool], x: Any, arr: list[Any], every: bool) -> bool | None:
    """``x op ANY(arr)`` (``every`` False) or ``x op ALL(arr)`` with SQL NULL rules."""
    elements = _flat(arr)
    if not elements:
        return every
    if x is None:
        return None
    unknown = False
    for e in elements:
        if e is None:
            unknown = True
        elif test(x, e) is not every:
            return not every
    return None if unknown else every


_RUNTIME: Final[dict[str, Any]] = {
    name: obj
    for name, obj in globals().items()
    if name.startswith("_") and callable(obj) and not isinstance(obj, type)
}
_RUNTIME.update(
    _EVAL_ERRORS=_EVAL_ERRORS,
    _NCTX=_NCTX,
    __builtins__={
        "float": float,
        "int": int,
        "str": str,
        "len": len,
        "abs": abs,
        "bool": bool,
    },
)


# --------------------------------------------------------------------------------------
# literal input (Postgres's type input functions, for constants and text casts)

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
    check = _INT_CHECK[bits]

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
            raise _OutOfRange(f"{text!r} is out of range for a {bits}-bit float")
        return _f4(value) if bits == 32 else value

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


def _no_infinity(text: str, kind: str) -> str:
    if text.strip().lower() in ("infinity", "-infinity", "+infinity", "epoch", "now", "today"):
        raise ValueError(f"{kind} value {text!r} is not supported in a shape predicate")
    return text.strip()


def _in_date(text: str) -> date:
    return date.fromisoformat(_no_infinity(text, "date"))


def _in_time(text: str) -> time:
    value = time.fromisoformat(_no_infinity(text, "time"))
    if value.tzinfo is not None:
        raise ValueError(f"time without time zone cannot carry a zone: {text!r}")
    return value


def _iso_datetime(text: str) -> datetime:
    s = _no_infinity(text, "timestamp")
    if s.upper().endswith(" UTC"):
        s = s[:-4] + "+00:00"
    return datetime.fromisoformat(s)


def _in_timestamp(text: str) -> datetime:
    # Postgres ignores a zone written in a timestamp-without-zone literal.
    return _iso_datetime(text).replace(tzinfo=None)


def _in_timestamptz(text: str) -> datetime:
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


def _length_limited(n: int | None, pad_char: bool) -> Callable[[str], str]:
    def limit(v: str) -> str:
        cut = v[:n] if n is not None else v
        return cut.rstrip(" ") if pad_char else cut

    return limit


def _input_function(t: SqlType, params: tuple[int, ...]) -> Callable[[str], Any]:
    """Text -> value for ``t`` (raises ValueError / ArithmeticError on bad input)."""
    f = t.family
    if f == "bool":
        return _in_bool
    if f == "int":
        return _in_int(t.bits)
    if f == "numeric":
        if params:
            typmod = _numeric_typmod(params[0], params[1] if len(params) > 1 else 0)
            return lambda s: typmod(_in_numeric(s))
        return _in_numeric
    if f == "float":
        return _in_float(t.bits)
    if f == "text":
        if t is BPCHAR or params:
            return _length_limited(params[0] if params else None, t is BPCHAR)
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
    element_input = _input_function(t.element, params)

    def parse_array(text: str) -> list[Any]:
        def convert(items: list[Any]) -> list[Any]:
            return [
                convert(e) if type(e) is list else (None if e is None else element_input(e))
                for e in items
            ]

        return convert(_parse_array_text(text))

    return parse_array


# --------------------------------------------------------------------------------------
# parsing and validating the form of a predicate

_COMPARISONS: Final[dict[type[exp.Expression], str]] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_ARITHMETIC: Final[dict[type[exp.Expression], str]] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_FUNCTIONS: Final = "lower, upper, length, char_length, abs, coalesce, nullif"
_ALLOWED: Final[frozenset[type[exp.Expression]]] = frozenset(
    {
        *_COMPARISONS,
        exp.And,
        exp.Or,
        exp.Not,
        exp.Paren,
        exp.Is,
        exp.In,
        exp.Between,
        exp.Like,
        exp.ILike,
        exp.Escape,
        exp.Add,
        exp.Sub,
        exp.Mul,
        exp.Div,
        exp.Mod,
        exp.Neg,
        exp.Cast,
        exp.DataType,
        exp.DataTypeParam,
        exp.Column,
        exp.Identifier,
        exp.Literal,
        exp.Null,
        exp.Boolean,
        exp.Lower,
        exp.Upper,
        exp.Length,
        exp.Coalesce,
        exp.Abs,
        exp.Nullif,
        exp.ArrayContainsAll,
        exp.ArrayContainedBy,
        exp.ArrayOverlaps,
        exp.Array,
        exp.Any,
        exp.NullSafeEQ,
        exp.NullSafeNEQ,
        exp.Collate,
        exp.Anonymous,
    }
)
_NON_DETERMINISTIC: Final = frozenset(
    {
        "now",
        "random",
        "setseed",
        "nextval",
        "currval",
        "lastval",
        "setval",
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "txid_current",
        "pg_current_xact_id",
        "gen_random_uuid",
        "uuid_generate_v1",
        "uuid_generate_v4",
        "inet_client_addr",
        "pg_backend_pid",
        "current_setting",
        "pg_postmaster_start_time",
    }
)
_NON_DETERMINISTIC_NODES: Final = tuple(
    getattr(exp, name)
    for name in (
        "CurrentTimestamp",
        "CurrentDate",
        "CurrentTime",
        "CurrentDatetime",
        "CurrentUser",
        "CurrentSchema",
        "Localtimestamp",
        "Localtime",
        "Rand",
        "Uuid",
        "CurrentTimestampLTZ",
    )
    if hasattr(exp, name)
)
_OPERATOR_NAMES: Final = {
    "JSONExtract": "->",
    "JSONExtractScalar": "->>",
    "JSONBExtract": "#>",
    "JSONBExtractScalar": "#>>",
    "JSONBContains": "?",
    "DPipe": "||",
    "BitwiseAnd": "&",
    "BitwiseOr": "|",
    "BitwiseXor": "#",
    "BitwiseNot": "~",
    "BitwiseLeftShift": "<<",
    "BitwiseRightShift": ">>",
    "RegexpLike": "~",
    "RegexpILike": "~*",
    "SimilarTo": "SIMILAR TO",
    "Pow": "^",
    "Sqrt": "|/",
    "Cbrt": "||/",
    "Distance": "<->",
    "Overlaps": "OVERLAPS",
    "Glob": "GLOB",
    "Xor": "XOR",
    "Dot": ".",
}
_ANY_ALL_NAMES: Final = frozenset({"ALL", "SOME"})
_QUERY_NODES: Final = tuple(
    getattr(exp, name)
    for name in ("Subquery", "Select", "Exists", "Union", "Query")
    if hasattr(exp, name)
)


@dataclass(frozen=True, slots=True)
class ParsedPredicate:
    """A predicate whose form is valid; not yet typed against a table."""

    text: str
    tree: exp.Expression = field(repr=False)
    columns_read: frozenset[str]


def _unsupported(node: exp.Expression) -> ShapeError:
    sql = node.sql(dialect="postgres")
    name = type(node).__name__
    if isinstance(node, _QUERY_NODES):
        return ShapeError(f"sub-queries are not supported in a shape predicate: {sql}")
    if isinstance(node, _NON_DETERMINISTIC_NODES):
        return ShapeError(
            f"function {sql} is not allowed in a shape predicate: it is not deterministic, "
            "so whether a row belongs to the shape would depend on when it was read"
        )
    if isinstance(node, exp.AggFunc):
        return ShapeError(f"aggregate function {sql} is not allowed in a shape predicate")
    if isinstance(node, exp.Window):
        return ShapeError(f"window function {sql} is not allowed in a shape predicate")
    if isinstance(node, exp.Placeholder | exp.Parameter):
        return ShapeError(
            f"parameter {sql} is not supported in a shape predicate: write the value as a literal"
        )
    if isinstance(node, exp.Alias):
        return ShapeError(
            f"a shape predicate must be a single boolean expression, not an alias ({sql})"
        )
    if isinstance(node, exp.Bracket):
        return ShapeError(f"array subscripts are not supported in a shape predicate: {sql}")
    if isinstance(node, exp.Interval):
        return ShapeError(f"interval values are not supported in a shape predicate: {sql}")
    if isinstance(node, exp.Case | exp.If):
        return ShapeError(f"CASE expressions are not supported in a shape predicate: {sql}")
    if isinstance(node, exp.ByteString):
        return ShapeError(
            f"escape string constants (E'...') are not supported in a shape predicate: {sql}; "
            "write the characters in a standard '...' string"
        )
    if isinstance(node, exp.HexString | exp.BitString | exp.UnicodeString):
        return ShapeError(f"constant {sql} is not supported in a shape predicate")
    if isinstance(node, exp.Star):
        return ShapeError("'*' is not allowed in a shape predicate")
    if name in _OPERATOR_NAMES:
        return ShapeError(f"operator '{_OPERATOR_NAMES[name]}' is not supported: {sql}")
    if isinstance(node, exp.Func):
        fname = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        if fname.lower() in _NON_DETERMINISTIC:
            return ShapeError(
                f"function {fname.lower()}() is not allowed in a shape predicate: it is not "
                "deterministic"
            )
        return ShapeError(
            f"function {fname.lower()}() is not supported in a shape predicate "
            f"(supported: {_FUNCTIONS})"
        )
    return ShapeError(f"{sql} ({name}) is not supported in a shape predicate")


def parse_predicate(text: str, table: tuple[str, str] | None = None) -> ParsedPredicate:
    """Parse and validate the form of ``text``; ``table`` = (schema, name) it filters.

    Column references may be qualified with the table's own name (``orders.id`` or
    ``public.orders.id``); the qualifier is dropped. Raises ShapeError.
    """
    if not text.strip():
        raise ShapeError("the shape predicate is empty: omit 'where' to take every row")
    try:
        parsed = sqlglot.parse(text, read="postgres")
    except (ParseError, TokenError) as e:
        raise ShapeError(f"the shape predicate {text!r} is not valid SQL: {e}") from e
    statements = [s for s in parsed if s is not None]
    if len(statements) != 1:
        raise ShapeError(
            f"a shape predicate must be a single boolean expression; {text!r} holds "
            f"{len(statements)} statements"
        )
    tree = statements[0]
    assert isinstance(tree, exp.Expression)
    columns: set[str] = set()
    for node in list(tree.walk()):
        assert isinstance(node, exp.Expression)
        kind = type(node)
        if kind is exp.RawString:  # $$...$$: the same string; regenerated as '...'
            node.replace(exp.Literal.string(node.this))
            continue
        if kind not in _ALLOWED:
            raise _unsupported(node)
        if kind is exp.Anonymous:
            _check_any_all(node)
        elif kind is exp.In and any(node.args.get(k) for k in ("query", "unnest", "field")):
            raise ShapeError(f"sub-queries are not supported in a shape predicate: {node.sql()}")
        elif kind is exp.Cast and node.args.get("format") is not None:
            raise ShapeError(f"CAST ... FORMAT is not supported: {node.sql()}")
        elif kind is exp.Length and (node.args.get("encoding") or node.args.get("binary")):
            raise ShapeError(f"length() with an encoding is not supported: {node.sql()}")
        elif kind is exp.Collate:
            _check_collation(node)
        elif isinstance(node, exp.Column) and kind is exp.Column:
            columns.add(_normalise_column(node, table))
        elif kind is exp.Identifier and isinstance(node.parent, exp.Column):
            continue
        node.comments = None
    tree.comments = None
    return ParsedPredicate(text=text, tree=tree, columns_read=frozenset(columns))


def _check_any_all(node: exp.Expression) -> None:
    name = node.name.upper()
    parent = node.parent
    if (
        name not in _ANY_ALL_NAMES
        or type(parent) not in _COMPARISONS
        or parent is None
        or parent.expression is not node
        or len(node.expressions) != 1
    ):
        raise _unsupported(node)


def _check_collation(node: exp.Expression) -> None:
    collation = node.expression
    name = collation.name if isinstance(collation, exp.Identifier | exp.Column) else ""
    if name not in ("C", "POSIX"):
        raise ShapeError(
            f"collation {collation.sql()} is not supported in a shape predicate; only "
            '"C" (byte order) can be evaluated outside the database'
        )


def _normalise_column(node: exp.Column, table: tuple[str, str] | None) -> str:
    parts = [p for p in (node.args.get(k) for k in ("catalog", "db", "table")) if p is not None]
    if parts:
        given = [fold_identifier(p.name, bool(p.args.get("quoted"))) for p in parts]
        if table is None or given not in ([table[1]], [table[0], table[1]]):
            raise ShapeError(
                f"column reference {node.sql(dialect='postgres')} names another table; a "
                "shape predicate can only read columns of its own table"
            )
        for key in ("catalog", "db", "table"):
            node.set(key, None)
    ident = node.this
    if not isinstance(ident, exp.Identifier):
        raise _unsupported(node)
    name = fold_identifier(ident.name, bool(ident.args.get("quoted")))
    node.set("this", exp.Identifier(this=name, quoted=True))
    return name


# --------------------------------------------------------------------------------------
# typed expression tree and code generation


class _Gen:
    """Collects constants, temporaries and column accesses while emitting code."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = dict(_RUNTIME)
        self.raw_used: set[int] = set()
        self.parsers: dict[str, tuple[int, Callable[[bytes], Any]]] = {}
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name

    def temp(self) -> str:
        self._n += 1
        return f"_t{self._n}"

    def raw(self, position: int) -> str:
        self.raw_used.add(position)
        return f"v{position}"

    def parsed(self, position: int, parser: Callable[[bytes], Any], variant: str = "c") -> str:
        """Name of the column's value parsed by ``parser`` (one local per variant)."""
        self.raw_used.add(position)
        name = f"{variant}{position}"
        self.parsers[name] = (position, parser)
        return name

    def prologue(self) -> list[str]:
        lines = [f"v{p} = row[{p}]" for p in sorted(self.raw_used)]
        for name, (p, parser) in sorted(self.parsers.items()):
            self.ns[f"_p{name}"] = parser
            lines.append(f"{name} = None if v{p} is None else _p{name}(v{p})")
        return lines

    def _bind(self, node: _Node) -> tuple[str, str | None, str | None]:
        """(name usable in a body, "is NULL" test, "is not NULL" test) for a strict argument."""
        code = node.emit(self)
        simple = code.isidentifier()
        if not node.nullable:
            return (code if simple else f"({code})"), None, None
        if simple:
            return code, f"{code} is None", f"{code} is not None"
        t = self.temp()
        return t, f"({t} := {code}) is None", f"({t} := {code}) is not None"

    def strict(self, args: Sequence[_Node], body: Callable[..., str]) -> str:
        """Value-mode code: NULL if any argument is NULL, else ``body``.

        Every argument is evaluated before the NULL test (``|`` does not short-circuit),
        as Postgres evaluates all arguments of a strict function.
        """
        names, tests, _ = self._bind_all(args)
        if not tests:
            return body(*names)
        return f"(None if {' | '.join(f'({t})' for t in tests)} else {body(*names)})"

    def strict_bool(self, args: Sequence[_Node], body: Callable[..., str], negate: bool) -> str:
        """Python-bool code: True when no argument is NULL and ``body`` (or its negation)."""
        names, tests, not_null = self._bind_all(args)
        code = body(*names)
        if negate:
            code = f"(not {code})"
        if not tests:
            return code
        if len(tests) == 1:
            return f"({not_null[0]} and {code})"
        return f"(not ({' | '.join(f'({t})' for t in tests)}) and {code})"

    def _bind_all(self, args: Sequence[_Node]) -> tuple[list[str], list[str], list[str]]:
        names: list[str] = []
        tests: list[str] = []
        not_null: list[str] = []
        for arg in args:
            name, test, positive = self._bind(arg)
            names.append(name)
            if test is not None and positive is not None:
                tests.append(test)
                not_null.append(positive)
        return names, tests, not_null


class _Node:
    """A typed expression. ``emit`` gives Python code for its SQL value (None = NULL)."""

    type: SqlType
    nullable: bool = True
    collate_c: bool = False

    def emit(self, g: _Gen) -> str:
        raise NotImplementedError

    def truth(self, g: _Gen) -> str:
        """Python code that is True exactly when the (boolean) value is TRUE."""
        code = self.emit(g)
        return code if not self.nullable else f"({code} is True)"

    def falsity(self, g: _Gen) -> str:
        """Python code that is True exactly when the (boolean) value is FALSE."""
        code = self.emit(g)
        return f"(not {code})" if not self.nullable else f"({code} is False)"

    def children(self) -> Sequence[_Node]:
        return ()

    def columns(self) -> Iterator[_Column]:
        for child in self.children():
            yield from child.columns()


class _Const(_Node):
    def __init__(self, value: Any, type_: SqlType, collate_c: bool = False) -> None:
        self.value = value
        self.type = type_
        self.nullable = value is None
        self.collate_c = collate_c

    def emit(self, g: _Gen) -> str:
        if self.value is None or self.value is True or self.value is False:
            return repr(self.value)
        return g.const(self.value)


# Postgres's text output of these types is exactly what Python's constructors read,
# so the builtins replace values.python_parser on the hot path (same results).
_FAST_PARSERS: Final[dict[SqlType, Callable[[bytes], Any]]] = {
    INT2: int,
    INT4: int,
    INT8: int,
    FLOAT8: float,
    TEXT: bytes.decode,
    VARCHAR: bytes.decode,
}


class _Column(_Node):
    """A column's value. char(n) values lose their trailing spaces (Postgres ignores
    them in comparisons and casts to text) unless ``padded`` (LIKE sees them)."""

    def __init__(
        self, column: RelationColumn, position: int, type_: SqlType, padded: bool = False
    ) -> None:
        self.column = column
        self.position = position
        self.type = type_
        self.padded = padded
        base = _FAST_PARSERS.get(type_) or values.python_parser(
            column.type_oid, column.type_modifier
        )
        self.parser: Callable[[bytes], Any]
        if type_ is BPCHAR and not padded:
            self.parser = lambda b: base(b).rstrip(" ")
        elif type_ is FLOAT4:
            self.parser = lambda b: _f4(base(b))
        else:
            self.parser = base

    def emit(self, g: _Gen) -> str:
        return g.parsed(self.position, self.parser, "p" if self.padded else "c")

    def columns(self) -> Iterator[_Column]:
        yield self


class _Apply(_Node):
    """A strict function of its arguments, given as a code template over their names."""

    def __init__(
        self,
        type_: SqlType,
        args: Sequence[_Node],
        template: Callable[..., str],
        nullable: bool | None = None,
        collate_c: bool = False,
    ) -> None:
        self.type = type_
        self.args = tuple(args)
        self.template = template
        self.nullable = any(a.nullable for a in args) if nullable is None else nullable
        self.collate_c = collate_c

    def emit(self, g: _Gen) -> str:
        return g.strict(self.args, self.template)

    def children(self) -> Sequence[_Node]:
        return self.args


class _Call(_Node):
    """A strict call of a Python function placed in the namespace."""

    def __init__(
        self, type_: SqlType, args: Sequence[_Node], fn: Callable[..., Any], collate_c: bool = False
    ) -> None:
        self.type = type_
        self.args = tuple(args)
        self.fn = fn
        self.nullable = any(a.nullable for a in self.args)
        self.collate_c = collate_c

    def emit(self, g: _Gen) -> str:
        name = g.const(self.fn)
        return g.strict(self.args, lambda *xs: f"{name}({', '.join(xs)})")

    def children(self) -> Sequence[_Node]:
        return self.args


class _Predicate(_Node):
    """A strict boolean test: NULL if an argument is NULL, else a Python bool.

    The test is ``body`` (a code template over the argument names) or, with ``fn``,
    a call of that Python function (placed in the namespace), negated if asked.
    """

    type = BOOL

    def __init__(
        self,
        args: Sequence[_Node],
        body: Callable[..., str] | None = None,
        fn: Callable[..., bool] | None = None,
        negate: bool = False,
    ) -> None:
        self.args = tuple(args)
        self.body = body
        self.fn = fn
        self.negate = negate
        self.nullable = any(a.nullable for a in self.args)

    def _template(self, g: _Gen) -> Callable[..., str]:
        if self.fn is None:
            assert self.body is not None
            return self.body
        name = g.const(self.fn)
        prefix = "not " if self.negate else ""
        return lambda *xs: f"({prefix}{name}({', '.join(xs)}))"

    def emit(self, g: _Gen) -> str:
        return g.strict(self.args, self._template(g))

    def truth(self, g: _Gen) -> str:
        return g.strict_bool(self.args, self._template(g), negate=False)

    def falsity(self, g: _Gen) -> str:
        return g.strict_bool(self.args, self._template(g), negate=True)

    def children(self) -> Sequence[_Node]:
        return self.args


_PY_OPS: Final = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_NAN_OPS: Final = {
    "=": "_nan_eq",
    "<>": "_nan_ne",
    "<": "_nan_lt",
    "<=": "_nan_le",
    ">": "_nan_gt",
    ">=": "_nan_ge",
}
_NAN_FUNCS: Final = {
    "=": _nan_eq,
    "<>": _nan_ne,
    "<": _nan_lt,
    "<=": _nan_le,
    ">": _nan_gt,
    ">=": _nan_ge,
}
_OP_FUNCS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_REVERSED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _converter(source: SqlType, target: SqlType) -> Callable[[str], str] | None:
    """Code template converting a value of ``source`` to the comparison type ``target``."""
    if source == target or (source.family == target.family and source.family != "float"):
        return None
    if target.family == "float":
        if source.family == "float":
            return None
        return lambda x: f"float({x})"
    if target.family == "timestamp" and source.family == "date":
        return lambda x: f"_date_ts({x})"
    return None  # int -> numeric: Python compares int and Decimal exactly


def _compare_body(
    op: str,
    cmp: SqlType,
    lconv: Callable[[str], str] | None,
    rconv: Callable[[str], str] | None,
    right_const: Any = None,
) -> Callable[..., str]:
    def body(a: str, b: str) -> str:
        a2 = lconv(a) if lconv else a
        b2 = rconv(b) if rconv else b
        if cmp.family == "numeric" or (cmp.family == "float" and right_const is None):
            return f"{_NAN_OPS[op]}({a2}, {b2})"
        if cmp.family == "float" and op in (">", ">="):
            # the constant is a number: only a NaN on the left changes the answer
            return f"({a2} {_PY_OPS[op]} {b2} or {a2} != {a2})"
        return f"({a2} {_PY_OPS[op]} {b2})"

    return body


class _Compare(_Predicate):
    def __init__(self, op: str, left: _Node, right: _Node, cmp: SqlType) -> None:
        self.op, self.left, self.right, self.cmp = op, left, right, cmp
        right_const = right.value if isinstance(right, _Const) else None
        if cmp.family == "float" and right_const is not None and right_const != right_const:
            right_const = None  # NaN constant: use the NaN-aware helper
        body = _compare_body(
            op, cmp, _converter(left.type, cmp), _converter(right.type, cmp), right_const
        )
        super().__init__((left, right), body)

    def raw_key(self) -> tuple[_Column, bytes] | None:
        """(column, bytes) when this is ``column = constant`` decidable on raw text."""
        if self.op not in ("=", "<>"):
            return None
        col, const = self.left, self.right
        if not isinstance(col, _Column) or not isinstance(const, _Const) or const.value is None:
            return None
        key = _raw_key(col.type, self.cmp, const.value)
        return None if key is None else (col, key)

    def _raw_code(self, g: _Gen) -> tuple[str, str] | None:
        found = self.raw_key()
        if found is None:
            return None
        col, key = found
        return g.raw(col.position), g.const(key)

    def emit(self, g: _Gen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().emit(g)
        v, k = raw
        return f"(None if {v} is None else {v} {_PY_OPS[self.op]} {k})"

    def truth(self, g: _Gen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().truth(g)
        v, k = raw
        if self.op == "=":
            return f"({v} == {k})"
        return f"({v} is not None and {v} != {k})"

    def falsity(self, g: _Gen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().falsity(g)
        v, k = raw
        if self.op == "<>":
            return f"({v} == {k})"
        return f"({v} is not None and {v} != {k})"


def _raw_key(column_type: SqlType, cmp: SqlType, value: Any) -> bytes | None:
    """The text Postgres sends for a column equal to ``value``, if it is unique."""
    if column_type not in _RAW_EQUALITY or _text_key(column_type).family != cmp.family:
        return None
    if cmp.family == "int":
        return str(value).encode()
    if cmp.family == "text":
        return str(value).encode()
    if cmp.family == "uuid":
        return str(value).encode()
    if cmp.family == "bool":
        return b"t" if value else b"f"
    return None


class _InSet(_Node):
    """``x IN (constants)`` / ``x = ANY(constant array)`` with SQL NULL rules."""

    type = BOOL

    def __init__(
        self, item: _Node, keys: frozenset[Any], has_null: bool, empty: bool, cmp: SqlType
    ) -> None:
        self.item, self.keys, self.has_null, self.empty, self.cmp = item, keys, has_null, empty, cmp
        self.nullable = not empty and (item.nullable or has_null)
        self.conv = _converter(item.type, cmp)
        self.nan = cmp.family in ("float", "numeric")

    def children(self) -> Sequence[_Node]:
        return (self.item,)

    def raw_keys(self) -> tuple[_Column, frozenset[bytes]] | None:
        col = self.item
        if not isinstance(col, _Column):
            return None
        keys = [_raw_key(col.type, self.cmp, k) for k in self.keys]
        if any(k is None for k in keys):
            return None
        return col, frozenset(k for k in keys if k is not None)

    def _member(self, g: _Gen) -> tuple[str, Callable[[str], str]]:
        raw = self.raw_keys()
        if raw is not None:
            col, keys = raw
            return g.raw(col.position), lambda x: f"({x} in {g.const(keys)})"
        ks = frozenset(_nkey(k) for k in self.keys) if self.nan else self.keys
        k = g.const(ks)
        conv = self.conv or (lambda x: x)
        if self.nan:
            return self.item.emit(g), lambda x: f"(_nkey({conv(x)}) in {k})"
        return self.item.emit(g), lambda x: f"({conv(x)} in {k})"

    def _bound(self, g: _Gen) -> tuple[str, str | None, Callable[[str], str]]:
        code, member = self._member(g)
        if code.isidentifier():
            return code, f"{code} is None", member
        t = g.temp()
        return t, f"({t} := {code}) is None", member

    def emit(self, g: _Gen) -> str:
        if self.empty:
            return "False"
        name, test, member = self._bound(g)
        miss = "None" if self.has_null else "False"
        return f"(None if {test} else (True if {member(name)} else {miss}))"

    def truth(self, g: _Gen) -> str:
        if self.empty:
            return "False"
        name, test, member = self._bound(g)
        return f"(not ({test}) and {member(name)})"

    def falsity(self, g: _Gen) -> str:
        if self.empty:
            return "True"
        if self.has_null:
            return "False"
        name, test, member = self._bound(g)
        return f"(not ({test}) and not {member(name)})"


class _Not(_Node):
    type = BOOL

    def __init__(self, item: _Node) -> None:
        self.item = item
        self.nullable = item.nullable

    def children(self) -> Sequence[_Node]:
        return (self.item,)

    def emit(self, g: _Gen) -> str:
        if not self.item.nullable:
            return f"(not {self.item.emit(g)})"
        t = g.temp()
        return f"(None if ({t} := {self.item.emit(g)}) is None else not {t})"

    def truth(self, g: _Gen) -> str:
        return self.item.falsity(g)

    def falsity(self, g: _Gen) -> str:
        return self.item.truth(g)


class _Logic(_Node):
    """n-ary AND (``conjunction``) or OR with Kleene logic, short-circuit left to right."""

    type = BOOL

    def __init__(self, items: Sequence[_Node], conjunction: bool) -> None:
        self.items = tuple(items)
        self.conjunction = conjunction
        self.nullable = any(i.nullable for i in self.items)

    def children(self) -> Sequence[_Node]:
        return self.items

    def emit(self, g: _Gen) -> str:
        decisive = "False" if self.conjunction else "True"
        other = "True" if self.conjunction else "False"
        names: list[str] = []
        opens: list[str] = []
        for item in self.items:
            t = g.temp()
            names.append(t)
            opens.append(f"({decisive} if ({t} := {item.emit(g)}) is {decisive} else ")
        nulls = [n for n, i in zip(names, self.items, strict=True) if i.nullable]
        tail = (
            other
            if not nulls
            else (f"(None if {' or '.join(f'{n} is None' for n in nulls)} else {other})")
        )
        return "".join(opens) + tail + ")" * len(opens)

    def truth(self, g: _Gen) -> str:
        joiner = " and " if self.conjunction else " or "
        return "(" + joiner.join(i.truth(g) for i in self.items) + ")"

    def falsity(self, g: _Gen) -> str:
        joiner = " or " if self.conjunction else " and "
        return "(" + joiner.join(i.falsity(g) for i in self.items) + ")"


class _IsNull(_Node):
    type = BOOL
    nullable = False

    def __init__(self, item: _Node, negate: bool) -> None:
        self.item, self.negate = item, negate

    def children(self) -> Sequence[_Node]:
        return (self.item,)

    def emit(self, g: _Gen) -> str:
        return f"({self.item.emit(g)} is {'not ' if self.negate else ''}None)"


class _IsBool(_Node):
    """``x IS [NOT] TRUE/FALSE``: never NULL."""

    type = BOOL
    nullable = False

    def __init__(self, item: _Node, value: bool, negate: bool) -> None:
        self.item, self.value, self.negate = item, value, negate

    def children(self) -> Sequence[_Node]:
        return (self.item,)

    def emit(self, g: _Gen) -> str:
        return f"({self.item.emit(g)} is {'not ' if self.negate else ''}{self.value!r})"


class _Distinct(_Node):
    """``a IS [NOT] DISTINCT FROM b``: NULL-safe equality, never NULL."""

    type = BOOL
    nullable = False

    def __init__(self, left: _Node, right: _Node, cmp: SqlType, negate: bool) -> None:
        self.left, self.right, self.negate = left, right, negate
        self.equal = _compare_body(
            "=", cmp, _converter(left.type, cmp), _converter(right.type, cmp)
        )

    def children(self) -> Sequence[_Node]:
        return (self.left, self.right)

    def emit(self, g: _Gen) -> str:
        a, b = g.temp(), g.temp()
        both = f"((({a} := {self.left.emit(g)}) is None) | (({b} := {self.right.emit(g)}) is None))"
        distinct = f"(({a} is not None or {b} is not None) if {both} else not {self.equal(a, b)})"
        return f"(not {distinct})" if self.negate else distinct


class _Coalesce(_Node):
    def __init__(self, items: Sequence[_Node], type_: SqlType) -> None:
        self.items, self.type = tuple(items), type_
        self.nullable = all(i.nullable for i in self.items)
        self.collate_c = any(i.collate_c for i in self.items)

    def children(self) -> Sequence[_Node]:
        return self.items

    def emit(self, g: _Gen) -> str:
        code = self.items[-1].emit(g)
        for item in reversed(self.items[:-1]):
            t = g.temp()
            code = f"({t} if ({t} := {item.emit(g)}) is not None else {code})"
        return code


class _Nullif(_Node):
    def __init__(self, left: _Node, right: _Node, cmp: SqlType) -> None:
        self.left, self.right, self.type = left, right, left.type
        self.collate_c = left.collate_c
        self.equal = _compare_body(
            "=", cmp, _converter(left.type, cmp), _converter(right.type, cmp)
        )

    def children(self) -> Sequence[_Node]:
        return (self.left, self.right)

    def emit(self, g: _Gen) -> str:
        a, b = g.temp(), g.temp()
        return (
            f"(None if ({a} := {self.left.emit(g)}) is None else ({a} if ({b} := "
            f"{self.right.emit(g)}) is None else (None if {self.equal(a, b)} else {a})))"
        )


class _ArrayBuild(_Node):
    nullable = False

    def __init__(self, items: Sequence[_Node], type_: SqlType) -> None:
        self.items, self.type = tuple(items), type_

    def children(self) -> Sequence[_Node]:
        return self.items

    def emit(self, g: _Gen) -> str:
        return "[" + ", ".join(i.emit(g) for i in self.items) + "]"


class _AnyAll(_Node):
    """``x op ANY/ALL (array)`` for a non-constant array or operator."""

    type = BOOL

    def __init__(
        self, item: _Node, arr: _Node, test: Callable[[Any, Any], bool], every: bool
    ) -> None:
        self.item, self.arr, self.test, self.every = item, arr, test, every

    def children(self) -> Sequence[_Node]:
        return (self.item, self.arr)

    def emit(self, g: _Gen) -> str:
        fn = g.const(self.test)
        a = g.temp()
        # a NULL array gives NULL; otherwise _any applies the SQL rules (item may be NULL)
        return (
            f"(None if ({a} := {self.arr.emit(g)}) is None else "
            f"_any({fn}, {self.item.emit(g)}, {a}, {self.every!r}))"
        )


# --------------------------------------------------------------------------------------
# typing: sqlglot tree -> typed nodes


@dataclass(frozen=True, slots=True)
class _Target:
    type: SqlType
    params: tuple[int, ...] = ()


_DTYPES: Final = {
    exp.DataType.Type.BOOLEAN: BOOL,
    exp.DataType.Type.SMALLINT: INT2,
    exp.DataType.Type.INT: INT4,
    exp.DataType.Type.BIGINT: INT8,
    exp.DataType.Type.DECIMAL: NUMERIC,
    exp.DataType.Type.FLOAT: FLOAT4,
    exp.DataType.Type.DOUBLE: FLOAT8,
    exp.DataType.Type.TEXT: TEXT,
    exp.DataType.Type.VARCHAR: VARCHAR,
    exp.DataType.Type.CHAR: BPCHAR,
    exp.DataType.Type.BPCHAR: BPCHAR,
    exp.DataType.Type.VARBINARY: BYTEA,
    exp.DataType.Type.UUID: UUID,
    exp.DataType.Type.DATE: DATE,
    exp.DataType.Type.TIME: TIME,
    exp.DataType.Type.TIMESTAMP: TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: TIMESTAMPTZ,
}


def _target(dt: exp.DataType) -> _Target:
    if dt.this == exp.DataType.Type.ARRAY:
        inner = dt.expressions[0] if dt.expressions else None
        while isinstance(inner, exp.DataType) and inner.this == exp.DataType.Type.ARRAY:
            inner = inner.expressions[0] if inner.expressions else None  # int[][] is int[]
        if not isinstance(inner, exp.DataType):
            raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported")
        element = _target(inner)
        return _Target(_array_of(element.type, dt.sql(dialect="postgres")), element.params)
    found = _DTYPES.get(dt.this)
    if found is None:
        raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported in a shape predicate")
    params: list[int] = []
    for p in dt.expressions:
        inner = p.this if isinstance(p, exp.DataTypeParam) else p
        if not (isinstance(inner, exp.Literal) and not inner.is_string):
            raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported")
        params.append(int(inner.this))
    if params and found.family not in ("text", "numeric"):
        raise ShapeError(
            f"type modifier in {dt.sql(dialect='postgres')} is not supported in a shape "
            "predicate (Postgres would round the value)"
        )
    return _Target(found, tuple(params))


def _common(a: SqlType, b: SqlType, what: str) -> SqlType:
    """Postgres's common type for two known types (comparison or arithmetic)."""
    if a == b:
        return a
    fa, fb = a.family, b.family
    if fa == fb:
        if fa == "int":
            return a if a.bits >= b.bits else b
        if fa == "float":
            return FLOAT8
        if fa == "text":
            return TEXT
        if (
            fa == "array"
            and a.element
            and b.element
            and _text_key(a.element) == _text_key(b.element)
        ):
            return a
    elif {fa, fb} <= {"int", "numeric"}:
        return NUMERIC
    elif {fa, fb} <= {"int", "numeric", "float"}:
        return FLOAT8
    elif {fa, fb} == {"date", "timestamp"}:
        return TIMESTAMP
    if "timestamptz" in (fa, fb) and {fa, fb} <= {"date", "timestamp", "timestamptz"}:
        raise ShapeError(
            f"cannot {what} {a.name} and {b.name} in a shape predicate: Postgres would convert "
            "using the session time zone; compare timestamptz with a timestamptz literal that "
            "has a UTC offset"
        )
    raise ShapeError(
        f"cannot {what} {a.name} and {b.name} in a shape predicate: cast one side explicitly"
    )


class _Typer:
    def __init__(self, columns: Mapping[str, tuple[int, RelationColumn]]) -> None:
        self.columns = columns

    # -- helpers

    def fail_sql(self, node: exp.Expression) -> str:
        return node.sql(dialect="postgres")

    def coerce(
        self, node: _Node, target: SqlType, sql: exp.Expression, params: tuple[int, ...] = ()
    ) -> _Node:
        """Resolve an unknown-typed literal to ``target`` (Postgres's literal typing)."""
        if node.type is not UNKNOWN:
            return node
        assert isinstance(node, _Const)
        if node.value is None:
            return _Const(None, target)
        try:
            value = _input_function(target, params)(node.value)
        except (*_EVAL_ERRORS, ShapeError) as e:
            raise ShapeError(
                f"{node.value!r} in {self.fail_sql(sql)} is not a valid {target.name}: {e}"
            ) from e
        return _Const(value, target, node.collate_c)

    def fold(self, node: _Node, sql: exp.Expression) -> _Node:
        """Evaluate a sub-expression without columns once, at definition time."""
        if isinstance(node, _Const) or any(True for _ in node.columns()):
            return node
        g = _Gen()
        code = node.emit(g)
        scope = dict(g.ns)
        exec(compile(f"def _value():\n    return {code}\n", "<shape predicate>", "exec"), scope)
        try:
            value = scope["_value"]()
        except _EVAL_ERRORS as e:
            raise ShapeError(
                f"the constant expression {self.fail_sql(sql)} cannot be evaluated: {e}"
            ) from e
        return _Const(value, node.type, node.collate_c)

    # -- entry points

    def boolean(self, e: exp.Expression) -> _Node:
        node = self.expr(e)
        if node.type is UNKNOWN:
            node = self.coerce(node, BOOL, e)
        if node.type is not BOOL:
            raise ShapeError(
                f"{self.fail_sql(e)} is of type {node.type.name}, but a shape predicate needs "
                "a boolean here"
            )
        return node

    def expr(self, e: exp.Expression) -> _Node:
        method = getattr(self, "t_" + type(e).__name__, None)
        if method is None:
            raise _unsupported(e)
        node: _Node = method(e)
        return node

    # -- leaves

    def t_Paren(self, e: exp.Paren) -> _Node:
        return self.expr(e.this)

    def t_Column(self, e: exp.Column) -> _Node:
        name = e.name
        found = self.columns.get(name)
        if found is None:
            available = ", ".join(sorted(self.columns)) or "(none)"
            raise ShapeError(
                f"the shape predicate reads column {quote_identifier(name)}, which the table "
                f"does not have; available columns: {available}"
            )
        position, column = found
        t = sql_type(column.type_oid)
        if t is None:
            raise ShapeError(
                f"column {quote_identifier(name)} has type {type_name(column.type_oid)}, "
                "which shape predicates cannot evaluate exactly; supported: "
                + ", ".join(t.name for t in _SCALARS)
                + " and arrays of most of them"
            )
        return _Column(column, position, t)

    def t_Literal(self, e: exp.Literal) -> _Node:
        text = e.this
        if e.is_string:
            return _Const(text, UNKNOWN)
        return _number(text)

    def t_Null(self, e: exp.Null) -> _Node:
        return _Const(None, UNKNOWN)

    def t_Boolean(self, e: exp.Boolean) -> _Node:
        return _Const(bool(e.this), BOOL)

    def t_Collate(self, e: exp.Collate) -> _Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family != "text":
            raise ShapeError(
                f"COLLATE applies to text, not to {node.type.name}: {self.fail_sql(e)}"
            )
        if isinstance(node, _Const):
            return _Const(node.value, node.type, collate_c=True)
        return _Apply(node.type, [node], lambda x: x, collate_c=True)

    # -- logic

    def _flatten(self, e: exp.Expression, kind: type[exp.Expression]) -> list[exp.Expression]:
        while isinstance(e, exp.Paren):
            e = e.this
        if type(e) is kind:
            return self._flatten(e.this, kind) + self._flatten(e.expression, kind)
        return [e]

    def t_And(self, e: exp.And) -> _Node:
        items = [self.boolean(x) for x in self._flatten(e, exp.And)]
        return self.fold(_Logic(items, conjunction=True), e)

    def t_Or(self, e: exp.Or) -> _Node:
        items = [self.boolean(x) for x in self._flatten(e, exp.Or)]
        return self.fold(_Logic(items, conjunction=False), e)

    def t_Not(self, e: exp.Not) -> _Node:
        return self.fold(_Not(self.boolean(e.this)), e)

    def t_Is(self, e: exp.Is) -> _Node:
        negate = bool(e.args.get("negate"))
        target = e.expression
        if isinstance(target, exp.Null):
            return self.fold(_IsNull(self.expr(e.this), negate), e)
        if isinstance(target, exp.Boolean):
            return self.fold(_IsBool(self.boolean(e.this), bool(target.this), negate), e)
        raise _unsupported(e)

    # -- comparisons

    def _pair(
        self,
        left: _Node,
        right: _Node,
        e: exp.Expression,
        what: str,
    ) -> tuple[_Node, _Node, SqlType]:
        if left.type is UNKNOWN and right.type is UNKNOWN:
            left, right = self.coerce(left, TEXT, e), self.coerce(right, TEXT, e)
        elif left.type is UNKNOWN:
            left = self.coerce(left, right.type, e)
        elif right.type is UNKNOWN:
            right = self.coerce(right, left.type, e)
        try:
            cmp = _common(left.type, right.type, what)
        except ShapeError as err:
            raise ShapeError(f"{err} ({self.fail_sql(e)})") from None
        return left, right, cmp

    def compare(self, op: str, left: _Node, right: _Node, e: exp.Expression) -> _Node:
        left, right, cmp = self._pair(left, right, e, "compare")
        null_constant = any(isinstance(n, _Const) and n.value is None for n in (left, right))
        if op not in ("=", "<>") and not null_constant:
            if cmp.family == "text" and not (left.collate_c or right.collate_c):
                raise ShapeError(
                    f"ordering comparison {self.fail_sql(e)} on text depends on the database "
                    'collation, which tidemark cannot reproduce; add COLLATE "C" to compare '
                    "in byte order (e.g. name < 'm' COLLATE \"C\"), or use =, IN or LIKE"
                )
            if cmp.family == "array":
                raise ShapeError(
                    f"ordering comparison of arrays is not supported: {self.fail_sql(e)}"
                )
        if isinstance(left, _Const) and not isinstance(right, _Const):
            # column-on-the-left form helps the raw-bytes fast path and routing
            left, right, op = right, left, _REVERSED[op]
        right = self._const_as(right, cmp)
        return self.fold(_Compare(op, left, right, cmp), e)

    def _const_as(self, node: _Node, cmp: SqlType) -> _Node:
        """A constant converted to the comparison type once, not on every row."""
        if not isinstance(node, _Const) or node.value is None:
            return node
        conv = _converter(node.type, cmp)
        if conv is None:
            return node
        return _Const(self._convert_const(node.value, conv), cmp, node.collate_c)

    def _comparison(self, e: exp.Expression) -> _Node:
        op = _COMPARISONS[type(e)]
        rhs = e.expression
        if isinstance(rhs, exp.Any) or (
            isinstance(rhs, exp.Anonymous) and rhs.name.upper() in _ANY_ALL_NAMES
        ):
            return self.any_all(op, e)
        return self.compare(op, self.expr(e.this), self.expr(rhs), e)

    t_EQ = t_NEQ = t_LT = t_LTE = t_GT = t_GTE = _comparison

    def _distinct(self, e: exp.Expression) -> _Node:
        left, right, cmp = self._pair(self.expr(e.this), self.expr(e.expression), e, "compare")
        return self.fold(_Distinct(left, right, cmp, negate=isinstance(e, exp.NullSafeEQ)), e)

    t_NullSafeEQ = t_NullSafeNEQ = _distinct

    def t_Between(self, e: exp.Between) -> _Node:
        item = self.expr(e.this)
        low, high = self.expr(e.args["low"]), self.expr(e.args["high"])

        def between(lo: _Node, hi: _Node) -> _Node:
            return _Logic(
                [self.compare(">=", item, lo, e), self.compare("<=", item, hi, e)], conjunction=True
            )

        node = between(low, high)
        if e.args.get("symmetric"):
            node = _Logic([node, between(high, low)], conjunction=False)
        return self.fold(node, e)

    def t_In(self, e: exp.In) -> _Node:
        items = e.expressions
        if not items:
            raise ShapeError(f"IN needs at least one value: {self.fail_sql(e)}")
        lhs = self.expr(e.this)
        nodes = [self.expr(i) for i in items]
        if all(isinstance(n, _Const) for n in nodes):
            return self._in_constants(lhs, nodes, e, empty=False)
        return self.fold(
            _Logic([self.compare("=", lhs, n, e) for n in nodes], conjunction=False), e
        )

    def _in_constants(
        self, lhs: _Node, consts: Sequence[_Node], e: exp.Expression, empty: bool
    ) -> _Node:
        known = [c.type for c in consts if c.type is not UNKNOWN]
        if lhs.type is UNKNOWN:
            lhs = self.coerce(lhs, known[0] if known else TEXT, e)
        cmp = lhs.type
        for t in known:
            cmp = self._pair(_Const(None, cmp), _Const(None, t), e, "compare")[2]
        if cmp.family == "array":
            raise ShapeError(f"IN on arrays is not supported; use = or @>: {self.fail_sql(e)}")
        keys: set[Any] = set()
        has_null = False
        for c in consts:
            c = self.coerce(c, cmp, e)
            assert isinstance(c, _Const)
            if c.value is None:
                has_null = True
                continue
            conv = _converter(c.type, cmp)
            keys.add(self._convert_const(c.value, conv))
        return self.fold(_InSet(lhs, frozenset(keys), has_null, empty, cmp), e)

    @staticmethod
    def _convert_const(value: Any, conv: Callable[[str], str] | None) -> Any:
        if conv is None:
            return value
        scope: dict[str, Any] = dict(_RUNTIME)
        scope["_x"] = value
        return eval(conv("_x"), scope)  # a fixed template over a bound name

    def any_all(self, op: str, e: exp.Expression) -> _Node:
        rhs = e.expression
        every = isinstance(rhs, exp.Anonymous) and rhs.name.upper() == "ALL"
        inner = rhs.this if isinstance(rhs, exp.Any) else rhs.expressions[0]
        while isinstance(inner, exp.Paren):
            inner = inner.this
        item = self.expr(e.this)
        arr = self.expr(inner)
        if arr.type is UNKNOWN:
            if item.type is UNKNOWN:
                item = self.coerce(item, TEXT, e)
            arr = self.coerce(arr, _array_of(item.type, self.fail_sql(e)), e)
        if arr.type.family != "array" or arr.type.element is None:
            raise ShapeError(f"ANY/ALL needs an array on the right: {self.fail_sql(e)}")
        element = arr.type.element
        item, _, cmp = self._pair(item, _Const(None, element), e, "compare")
        if cmp.family == "text" and op not in ("=", "<>") and not item.collate_c:
            raise ShapeError(
                f"ordering comparison {self.fail_sql(e)} on text depends on the database "
                'collation; add COLLATE "C" to compare in byte order'
            )
        if isinstance(arr, _Const) and arr.value is None:
            return _Const(None, BOOL)
        if isinstance(arr, _Const) and op in ("=", "<>") and (op == "=") != every:
            elements = _flat(arr.value)
            consts = [_Const(v, element) for v in elements]
            node = self._in_constants(item, consts, e, empty=not elements)
            return node if op == "=" else self.fold(_Not(node), e)
        lconv, rconv = _converter(item.type, cmp), _converter(element, cmp)
        return self.fold(_AnyAll(item, arr, _element_test(op, cmp, lconv, rconv), every), e)

    # -- LIKE

    def _like(
        self, e: exp.Expression, escape: exp.Expression | None, outer: exp.Expression
    ) -> _Node:
        item = self.expr(e.this)
        if item.type is UNKNOWN:
            item = self.coerce(item, TEXT, outer)
        if item.type.family != "text":
            raise ShapeError(
                f"LIKE applies to text, not to {item.type.name}: {self.fail_sql(outer)}; cast "
                "the value to text first"
            )
        if item.type is BPCHAR:
            # trailing spaces of char(n) count in LIKE (Postgres docs, "Character Types")
            if not isinstance(item, _Column):
                raise ShapeError(
                    f"LIKE on a computed character(n) value is not supported: "
                    f"{self.fail_sql(outer)}; cast it to text first"
                )
            item = _Column(item.column, item.position, BPCHAR, padded=True)
        pattern_node = self.coerce(self.expr(e.expression), TEXT, outer)
        if not isinstance(pattern_node, _Const) or pattern_node.type.family != "text":
            raise ShapeError(f"the LIKE pattern must be a text constant: {self.fail_sql(outer)}")
        esc: str | None = "\\"
        if escape is not None:
            esc_node = self.coerce(self.expr(escape), TEXT, outer)
            if not isinstance(esc_node, _Const) or esc_node.value is None:
                raise ShapeError(f"ESCAPE needs a constant: {self.fail_sql(outer)}")
            if len(esc_node.value) > 1:
                raise ShapeError(
                    f"ESCAPE must be a single character or empty: {self.fail_sql(outer)}"
                )
            esc = esc_node.value or None
        negate = bool(e.args.get("negate"))
        if pattern_node.value is None:
            return _Const(None, BOOL)
        ci = isinstance(e, exp.ILike)
        matcher = _like_matcher(
            pattern_node.value,
            esc,
            ci,
            ascii_only=item.collate_c or pattern_node.collate_c,
            sql=self.fail_sql(outer),
        )
        return self.fold(_Predicate([item], fn=matcher, negate=negate), outer)

    def t_Like(self, e: exp.Like) -> _Node:
        return self._like(e, None, e)

    t_ILike = t_Like

    def t_Escape(self, e: exp.Escape) -> _Node:
        inner = e.this
        if not isinstance(inner, exp.Like | exp.ILike):
            raise _unsupported(e)
        return self._like(inner, e.expression, e)

    # -- arithmetic

    def _arith(self, e: exp.Expression) -> _Node:
        op = _ARITHMETIC[type(e)]
        left, right, t = self._pair(
            self.expr(e.this), self.expr(e.expression), e, f"apply '{op}' to"
        )
        if t.family not in ("int", "numeric", "float"):
            raise ShapeError(
                f"operator '{op}' is not supported for {left.type.name} and {right.type.name} "
                f"in a shape predicate: {self.fail_sql(e)}"
            )
        if left.type == FLOAT4 and right.type == FLOAT4:
            t = FLOAT4
        lconv, rconv = _converter(left.type, t), _converter(right.type, t)
        fn = _arith_function(op, t, self.fail_sql(e))
        node = _Apply(
            t,
            [left, right],
            lambda a, b: f"{fn}({lconv(a) if lconv else a}, {rconv(b) if rconv else b})",
        )
        return self.fold(node, e)

    t_Add = t_Sub = t_Mul = t_Div = t_Mod = _arith

    def t_Neg(self, e: exp.Neg) -> _Node:
        inner = e.this
        if isinstance(inner, exp.Literal) and not inner.is_string:
            return _number("-" + inner.this)
        node = self.expr(inner)
        if node.type is UNKNOWN:
            node = self.coerce(node, NUMERIC, e)  # Postgres: unary minus of unknown -> numeric
        f = node.type.family
        if f == "int":
            check = f"_ck{node.type.bits // 8}"
            return self.fold(_Apply(node.type, [node], lambda x: f"{check}(-{x})"), e)
        if f == "numeric":
            return self.fold(_Apply(node.type, [node], lambda x: f"_nneg({x})"), e)
        if f == "float":
            return self.fold(_Apply(node.type, [node], lambda x: f"(-{x})"), e)
        raise ShapeError(f"unary minus is not supported for {node.type.name}: {self.fail_sql(e)}")

    # -- casts and functions

    def t_Cast(self, e: exp.Cast) -> _Node:
        target = _target(e.args["to"])
        if isinstance(e.this, exp.Array) and not e.this.expressions:
            if target.type.family != "array":
                raise ShapeError(f"cannot cast an array to {target.type.name}: {self.fail_sql(e)}")
            return _Const([], target.type)  # ARRAY[]::integer[]
        node = self.expr(e.this)
        if isinstance(node, _Const) and node.type is UNKNOWN:
            return self.coerce(node, target.type, e, target.params)
        if isinstance(node, _ArrayBuild) and target.type.family == "array":
            assert target.type.element is not None
            items = [
                self._cast_node(i, _Target(target.type.element, target.params), e)
                for i in node.items
            ]
            return self.fold(_ArrayBuild(items, target.type), e)
        return self._cast_node(node, target, e)

    def _cast_node(self, node: _Node, target: _Target, e: exp.Expression) -> _Node:
        if isinstance(node, _Const) and node.type is UNKNOWN:
            return self.coerce(node, target.type, e, target.params)
        if isinstance(node, _Const) and node.value is None:
            return _Const(None, target.type)
        fn = _cast_function(node.type, target, self.fail_sql(e))
        if fn is None:
            if node.type == target.type:
                return node
            return _Apply(target.type, [node], lambda x: x, collate_c=node.collate_c)
        return self.fold(_Call(target.type, [node], fn, collate_c=node.collate_c), e)

    def _text_arg(self, e: exp.Expression, fname: str) -> _Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family != "text":
            raise ShapeError(f"{fname}() needs text, not {node.type.name}: {self.fail_sql(e)}")
        return node

    def t_Lower(self, e: exp.Lower) -> _Node:
        node = self._text_arg(e, "lower")
        fn = _lower_c if node.collate_c else _lower
        return self.fold(_Call(TEXT, [node], fn, collate_c=node.collate_c), e)

    def t_Upper(self, e: exp.Upper) -> _Node:
        node = self._text_arg(e, "upper")
        fn = _upper_c if node.collate_c else _upper
        return self.fold(_Call(TEXT, [node], fn, collate_c=node.collate_c), e)

    def t_Length(self, e: exp.Length) -> _Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family not in ("text", "bytea"):
            raise ShapeError(
                f"length() needs text or bytea, not {node.type.name}: {self.fail_sql(e)}"
            )
        return self.fold(_Apply(INT4, [node], lambda x: f"len({x})"), e)

    def t_Abs(self, e: exp.Abs) -> _Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, FLOAT8, e)  # Postgres picks abs(double precision)
        f = node.type.family
        if f == "int":
            check = f"_ck{node.type.bits // 8}"
            return self.fold(_Apply(node.type, [node], lambda x: f"{check}(abs({x}))"), e)
        if f == "numeric":
            return self.fold(_Apply(node.type, [node], lambda x: f"_nabs({x})"), e)
        if f == "float":
            return self.fold(_Apply(node.type, [node], lambda x: f"abs({x})"), e)
        raise ShapeError(f"abs() needs a number, not {node.type.name}: {self.fail_sql(e)}")

    def _unify(
        self, nodes: list[_Node], e: exp.Expression, what: str
    ) -> tuple[list[_Node], SqlType]:
        known = [n.type for n in nodes if n.type is not UNKNOWN]
        t = known[0] if known else TEXT
        for k in known[1:]:
            t = _common(t, k, what)
        out: list[_Node] = []
        for n in nodes:
            n = self.coerce(n, t, e)
            conv = _converter(n.type, t)
            if conv is not None:
                n = _Apply(t, [n], conv)
            out.append(n)
        return out, t

    def t_Coalesce(self, e: exp.Coalesce) -> _Node:
        nodes, t = self._unify([self.expr(x) for x in [e.this, *e.expressions]], e, "combine")
        return self.fold(_Coalesce(nodes, t), e)

    def t_Nullif(self, e: exp.Nullif) -> _Node:
        left, right, cmp = self._pair(self.expr(e.this), self.expr(e.expression), e, "compare")
        return self.fold(_Nullif(left, right, cmp), e)

    # -- arrays

    def t_Array(self, e: exp.Array) -> _Node:
        items = [self.expr(x) for x in e.expressions]
        if not items:
            raise ShapeError(
                f"an empty ARRAY[] needs a type: write ARRAY[]::integer[] ({self.fail_sql(e)})"
            )
        nodes, t = self._unify(items, e, "combine")
        node = _ArrayBuild(nodes, _array_of(t, self.fail_sql(e)))
        return self.fold(node, e)

    def _array_op(self, e: exp.Expression) -> _Node:
        left, right = self.expr(e.this), self.expr(e.expression)
        if left.type is UNKNOWN and right.type is UNKNOWN:
            raise ShapeError(f"cannot tell the array type of {self.fail_sql(e)}: add a cast")
        left, right = self.coerce(left, right.type, e), self.coerce(right, left.type, e)
        if left.type.family != "array" or right.type.family != "array":
            raise ShapeError(
                f"operator {self.fail_sql(e)} needs arrays on both sides (jsonb and other "
                "types are not supported)"
            )
        assert left.type.element is not None and right.type.element is not None
        if _text_key(left.type.element) != _text_key(right.type.element):
            raise ShapeError(
                f"operator {self.fail_sql(e)} needs arrays of the same type, not "
                f"{left.type.name} and {right.type.name}: cast one side"
            )
        if isinstance(e, exp.ArrayContainsAll):
            body = "_acontains({0}, {1})"
        elif isinstance(e, exp.ArrayContainedBy):
            body = "_acontains({1}, {0})"
        else:
            body = "_aoverlap({0}, {1})"
        return self.fold(_Predicate([left, right], lambda a, b: body.format(a, b)), e)

    t_ArrayContainsAll = t_ArrayContainedBy = t_ArrayOverlaps = _array_op


def _number(text: str) -> _Const:
    if re.fullmatch(r"-?\d+", text):
        value = int(text)
        for t in (INT4, INT8):
            low, high = _INT_RANGE[t.bits]
            if low <= value <= high:
                return _Const(value, t)
    return _Const(Decimal(text), NUMERIC)


def _element_test(
    op: str, cmp: SqlType, lconv: Callable[[str], str] | None, rconv: Callable[[str], str] | None
) -> Callable[[Any, Any], bool]:
    base = _NAN_FUNCS[op] if cmp.family in ("numeric", "float") else _OP_FUNCS[op]
    to_float = cmp.family == "float"
    if to_float and (lconv or rconv):
        return lambda a, b: base(float(a), float(b))
    if lconv is not None or rconv is not None:  # date vs timestamp

        def fix(v: Any) -> Any:
            return _date_ts(v) if type(v) is date else v

        return lambda a, b: base(fix(a), fix(b))
    return base


def _arith_function(op: str, t: SqlType, sql: str) -> str:
    f = t.family
    if f == "int":
        check = f"_ck{t.bits // 8}"
        if op == "/":
            return f"(lambda a, b: {check}(_idiv(a, b)))"
        if op == "%":
            return "_imod"
        return {
            "+": f"(lambda a, b: {check}(a + b))",
            "-": f"(lambda a, b: {check}(a - b))",
            "*": f"(lambda a, b: {check}(a * b))",
        }[op]
    if f == "numeric":
        if op == "/":
            raise ShapeError(
                f"division of numeric values is not supported in a shape predicate ({sql}): "
                "its result scale follows Postgres internals; multiply instead, or cast to "
                "double precision"
            )
        return {"+": "_nadd", "-": "_nsub", "*": "_nmul", "%": "_nmod"}[op]
    if op == "%":
        raise ShapeError(f"operator '%' does not exist for {t.name}: {sql}")
    name = {"+": "_fadd", "-": "_fsub", "*": "_fmul", "/": "_fdiv"}[op]
    return f"_f4op({name})" if t is FLOAT4 else name


def _cast_function(src: SqlType, target: _Target, sql: str) -> Callable[[Any], Any] | None:
    """Python function for an explicit cast of a value of ``src`` (None: no change)."""
    dst, params = target.type, target.params
    sf, df = src.family, dst.family

    def refuse() -> ShapeError:
        return ShapeError(f"cannot cast {src.name} to {dst.name} in a shape predicate: {sql}")

    if df == "text":
        limit = _length_limited(params[0] if params else None, dst is BPCHAR)
        to_text: Callable[[Any], str] | None = {
            "text": None,
            "int": str,
            "numeric": _numeric_text,
            "uuid": str,
            "bool": _bool_text,
            "date": date.isoformat,
        }.get(sf, refuse)  # type: ignore[arg-type]
        if to_text is refuse:
            raise refuse()
        if dst is BPCHAR or params:
            if to_text is None:
                return limit
            first = to_text
            return lambda v: limit(first(v))
        return to_text
    if sf == "text":
        if df == "timestamptz":
            raise ShapeError(
                f"casting text to timestamptz is not supported in a shape predicate ({sql}): "
                "values without a UTC offset would be read in the session time zone"
            )
        if df == "array":
            raise refuse()
        return _input_function(dst, params)
    if sf == "int" and df == "int":
        return None if dst.bits >= src.bits else _INT_CHECK[dst.bits]
    if df == "numeric" and sf in ("int", "numeric"):
        if params:
            return _numeric_typmod(params[0], params[1] if len(params) > 1 else 0)
        return Decimal if sf == "int" else None
    if df == "float" and sf in ("int", "numeric", "float"):
        if dst is FLOAT4:
            return lambda v: _f4(float(v))
        return None if sf == "float" else float
    if df == "int" and sf == "numeric":
        check = _INT_CHECK[dst.bits]
        return lambda v: check(_numeric_to_int(v))
    if df == "int" and sf == "float":
        check = _INT_CHECK[dst.bits]
        return lambda v: check(_float_to_int(v))
    if src is INT4 and dst is BOOL:
        return lambda v: v != 0
    if src is BOOL and dst is INT4:
        return int
    if sf == "date" and df == "timestamp":
        return _date_ts
    if sf == "timestamp" and df == "date":
        return _timestamp_date
    if src == dst or (
        sf == "array"
        and df == "array"
        and src.element
        and dst.element
        and _text_key(src.element) == _text_key(dst.element)
    ):
        return None
    raise refuse()


def _like_matcher(
    pattern: str, escape: str | None, ci: bool, ascii_only: bool, sql: str
) -> Callable[[str], bool]:
    """Compile a LIKE pattern once into a test of a string."""
    tokens: list[str | None] = []  # str: literal text, None: '%', '' : '_'
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            i += 1
            if i == len(pattern):
                raise ShapeError(f"LIKE pattern must not end with escape character: {sql}")
            literal.append(pattern[i])
        elif c in "%_":
            if literal:
                tokens.append("".join(literal))
                literal = []
            tokens.append(None if c == "%" else "")
        else:
            literal.append(c)
        i += 1
    if literal:
        tokens.append("".join(literal))
    if not ci:
        texts = [t for t in tokens if t]
        shape = tuple("lit" if t else ("any" if t is None else "one") for t in tokens)
        if shape == ("lit",) or not tokens:
            exact = texts[0] if texts else ""
            return lambda s: s == exact
        if shape == ("lit", "any"):
            prefix = texts[0]
            return lambda s: s.startswith(prefix)
        if shape == ("any", "lit"):
            suffix = texts[0]
            return lambda s: s.endswith(suffix)
        if shape == ("any", "lit", "any"):
            middle = texts[0]
            return lambda s: middle in s
    regex = "".join(".*" if t is None else "." if t == "" else re.escape(t) for t in tokens)
    flags = re.DOTALL | (re.IGNORECASE if ci else 0) | (re.ASCII if ascii_only else 0)
    compiled = re.compile(regex, flags)
    fullmatch = compiled.fullmatch
    return lambda s: fullmatch(s) is not None


# --------------------------------------------------------------------------------------
# compiled predicates


@dataclass(frozen=True, slots=True)
class EqualityTerm:
    """A conjunct ``column = constant`` (or ``IN``) usable as a hash-index key.

    ``keys`` are in the column's *key form*: the raw text bytes when ``raw`` (types
    whose text output is canonical), else values parsed with ``parse``. A row
    satisfies the conjunct exactly when its key form is in ``keys``.
    ``residual`` tests the remaining conjuncts (None: there are none).
    """

    column: str
    position: int
    raw: bool
    parse: Callable[[bytes], Any] | None
    keys: frozenset[Any]
    residual: Callable[[Row], bool] | None


@dataclass(frozen=True, slots=True, eq=False)
class CompiledPredicate:
    """A predicate typed against one column layout and compiled to Python."""

    parsed: ParsedPredicate
    columns_read: frozenset[str]
    positions_read: frozenset[int]
    matches: Callable[[Row], bool] = field(repr=False)
    evaluate: Callable[[Row], bool | None] = field(repr=False)
    equality_terms: tuple[EqualityTerm, ...] = field(repr=False)
    constant: bool | None = None  # set when the predicate does not read any column
    source: str = field(default="", repr=False)

    @property
    def tree(self) -> exp.Expression:
        return self.parsed.tree


def _build(nodes: Sequence[_Node], with_evaluate: bool) -> tuple[dict[str, Any], str]:
    g = _Gen()
    if len(nodes) == 1:
        truth = nodes[0].truth(g)
        value = nodes[0].emit(g) if with_evaluate else "None"
    else:
        logic = _Logic(nodes, conjunction=True)
        truth = logic.truth(g)
        value = logic.emit(g) if with_evaluate else "None"
    prologue = "".join(f"        {line}\n" for line in g.prologue())
    source = (
        "def _matches(row):\n"
        "    try:\n"
        f"{prologue}"
        f"        return {truth}\n"
        "    except _EVAL_ERRORS:\n"
        "        return False\n"
        "def _evaluate(row):\n"
        "    try:\n"
        f"{prologue}"
        f"        return {value}\n"
        "    except _EVAL_ERRORS as e:\n"
        "        raise _PredicateEvaluationError(f'the shape predicate raised: {e}') from e\n"
    )
    g.ns["_PredicateEvaluationError"] = PredicateEvaluationError
    exec(compile(source, "<shape predicate>", "exec"), g.ns)
    return g.ns, source


def compile_predicate(
    parsed: ParsedPredicate, columns: Sequence[RelationColumn]
) -> CompiledPredicate:
    """Type ``parsed`` against ``columns`` (tuple positions = list order) and compile it."""
    by_name = {c.name: (i, c) for i, c in enumerate(columns)}
    typer = _Typer(by_name)
    root = typer.boolean(parsed.tree)
    conjuncts = list(root.items) if isinstance(root, _Logic) and root.conjunction else [root]
    ns, source = _build([root], with_evaluate=True)
    positions = frozenset(c.position for c in root.columns())
    constant = None
    if isinstance(root, _Const):
        constant = root.value is True
    terms: list[EqualityTerm] = []
    for i, conjunct in enumerate(conjuncts):
        term = _equality_term(conjunct)
        if term is None:
            continue
        column, raw, keys = term
        rest = conjuncts[:i] + conjuncts[i + 1 :]
        residual = _build(rest, with_evaluate=False)[0]["_matches"] if rest else None
        terms.append(
            EqualityTerm(
                column.column.name,
                column.position,
                raw,
                None if raw else column.parser,
                keys,
                residual,
            )
        )
    return CompiledPredicate(
        parsed=parsed,
        columns_read=frozenset(columns[p].name for p in positions),
        positions_read=positions,
        matches=ns["_matches"],
        evaluate=ns["_evaluate"],
        equality_terms=tuple(terms),
        constant=constant,
        source=source,
    )


def _equality_term(node: _Node) -> tuple[_Column, bool, frozenset[Any]] | None:
    """(column, raw?, keys in key form) when ``node`` is column = constant(s)."""
    if isinstance(node, _Compare) and node.op == "=":
        col, const = node.left, node.right
        if not isinstance(col, _Column) or not isinstance(const, _Const) or const.value is None:
            return None
        values_ = [const.value]
        cmp = node.cmp
    elif isinstance(node, _InSet) and isinstance(node.item, _Column) and not node.empty:
        col = node.item
        values_ = list(node.keys)
        cmp = node.cmp
    else:
        return None
    assert isinstance(col, _Column)
    raw = col.type in _RAW_EQUALITY
    keys: set[Any] = set()
    for v in values_:
        key = _key_form(col.type, cmp, v)
        if key is _NOT_INDEXABLE:
            return None
        if key is not _NEVER:
            keys.add(_raw_key(col.type, _text_key(col.type), key) if raw else key)
    if raw and None in keys:
        return None
    return col, raw, frozenset(keys)


_NOT_INDEXABLE: Final = object()
_NEVER: Final = object()  # the constant cannot equal any value of the column


def _key_form(column_type: SqlType, cmp: SqlType, value: Any) -> Any:
    """``value`` (of type ``cmp``) as the column's parsed value, if equality is exact."""
    cf, kf = column_type.family, cmp.family
    if cf == "float" or kf == "float":
        if cf != "float" or value != value:
            return _NOT_INDEXABLE  # int/numeric -> double is lossy; NaN needs the helper
        return value
    if cf == "numeric" and kf == "numeric":
        return _NOT_INDEXABLE if value != value else value
    if cf == "int":
        if kf == "numeric":
            if value != value or not value.is_finite() or value != value.to_integral_value():
                return _NEVER
            value = int(value)
        low, high = _INT_RANGE[column_type.bits]
        return value if low <= value <= high else _NEVER
    if _text_key(column_type).family == kf and kf in (
        "text",
        "bool",
        "uuid",
        "bytea",
        "date",
        "time",
        "timestamp",
        "timestamptz",
    ):
        return value
    return _NOT_INDEXABLE


def predicate_sql(compiled: CompiledPredicate | ParsedPredicate) -> str:
    """Postgres SQL for the validated predicate, every identifier quoted."""
    tree = compiled.tree
    return tree.sql(dialect="postgres", identify=True, comments=False)
