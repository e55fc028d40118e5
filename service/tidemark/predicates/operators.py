"""Postgres operators and functions, evaluated in Python exactly as Postgres would.

These are the run-time pieces of a compiled shape predicate: the generated code calls
them by name through ``RUNTIME`` (its only global namespace), and the compiler calls
some of them directly to fold constants and build column parsers.

Promises, each mirroring Postgres (each is tested against it):

* integer arithmetic is checked against the int2/int4/int8 range of its result type
  (``ck2 ck4 ck8``); ``idiv`` truncates toward zero and ``imod`` takes the dividend's
  sign; division or modulo by zero raises;
* numeric ``+ - * %`` are exact (``NUMERIC_CONTEXT`` never rounds, and has no traps, so
  Infinity - Infinity is NaN);
* float arithmetic raises on overflow and underflow as Postgres's float8 does; ``f4``
  rounds to single precision, raising when the value leaves its range;
* ``nan_*`` compare float and numeric values with NaN equal to itself and above every
  other value; ``nkey`` gives the matching hashable key;
* ``lower``/``upper`` map one character to one character (libc-like), ``lower_c`` /
  ``upper_c`` map ASCII only (``COLLATE "C"``);
* arrays: ``acontains`` (``@>``), ``aoverlap`` (``&&``) and ``array_any`` (``op ANY/ALL``)
  follow SQL's NULL rules over every element of a (possibly nested) array;
* ``like_matcher`` compiles a constant LIKE/ILIKE pattern once into a string test.

Every error Postgres would raise surfaces as one of ``EVAL_ERRORS`` (``ArithmeticError``
or ``ValueError``); anything else escaping is a bug. Pure functions, no state.
"""

from __future__ import annotations

import math
import string
import struct
from collections.abc import Callable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_UP, Context, Decimal
from typing import Any, Final

from tidemark.predicates.temporal import date_ts

_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ASCII_UPPER: Final = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)


class OutOfRange(ArithmeticError):
    pass


# What Postgres would report as an error while evaluating: arithmetic problems and
# invalid input in casts. Anything else (TypeError ...) is a bug and propagates.
EVAL_ERRORS: Final = (ArithmeticError, ValueError)

INT_RANGE: Final = {
    16: (-(1 << 15), (1 << 15) - 1),
    32: (-(1 << 31), (1 << 31) - 1),
    64: (-(1 << 63), (1 << 63) - 1),
}


def _int_checker(bits: int) -> Callable[[int], int]:
    low, high = INT_RANGE[bits]

    def check(value: int) -> int:
        if low <= value <= high:
            return value
        raise OutOfRange(f"{value} is out of range for a {bits}-bit integer")

    return check


ck2, ck4, ck8 = _int_checker(16), _int_checker(32), _int_checker(64)
INT_CHECK: Final = {16: ck2, 32: ck4, 64: ck8}


def idiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def imod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


# Exact numeric arithmetic: Postgres's + - * % on numeric never round. Traps are off
# so that Infinity - Infinity gives NaN as in Postgres.
NUMERIC_CONTEXT: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
nadd, nsub, nmul, nneg, nabs = (
    NUMERIC_CONTEXT.add,
    NUMERIC_CONTEXT.subtract,
    NUMERIC_CONTEXT.multiply,
    NUMERIC_CONTEXT.minus,
    NUMERIC_CONTEXT.abs,
)


def nmod(a: Any, b: Any) -> Decimal:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return NUMERIC_CONTEXT.remainder(a, b)


_F32: Final = struct.Struct("f")


def f4(x: float) -> float:
    """``x`` rounded to single precision; out of its range is an error, as in Postgres."""
    value: float = _F32.unpack(_F32.pack(x))[0]
    if math.isinf(value) and not math.isinf(x):
        raise OutOfRange("value out of range: overflow")
    if value == 0.0 and x != 0.0:
        raise OutOfRange("value out of range: underflow")
    return value


def _fcheck(r: float, a: float, b: float, zero_ok: bool) -> float:
    if math.isinf(r) and not (math.isinf(a) or math.isinf(b)):
        raise OutOfRange("value out of range: overflow")
    if r == 0.0 and not zero_ok and a != 0.0 and b != 0.0:
        raise OutOfRange("value out of range: underflow")
    return r


def fadd(a: float, b: float) -> float:
    return _fcheck(a + b, a, b, True)


def fsub(a: float, b: float) -> float:
    return _fcheck(a - b, a, b, True)


def fmul(a: float, b: float) -> float:
    return _fcheck(a * b, a, b, False)


def fdiv(a: float, b: float) -> float:
    if b == 0.0:
        raise ZeroDivisionError("division by zero")
    return _fcheck(a / b, a, 1.0 if math.isinf(b) else b, a == 0.0 or math.isinf(b))


def f4op(op: Callable[[float, float], float]) -> Callable[[float, float], float]:
    def single(a: float, b: float) -> float:
        return f4(op(a, b))

    return single


# NaN-aware comparisons for float and numeric (Postgres: NaN = NaN, NaN > all).
def nan_eq(a: Any, b: Any) -> bool:
    return a == b or (a != a and b != b)


def nan_ne(a: Any, b: Any) -> bool:
    return not (a == b or (a != a and b != b))


def nan_lt(a: Any, b: Any) -> bool:
    if a == a and b == b:
        return bool(a < b)
    return a == a  # a is a number and b is NaN


def nan_le(a: Any, b: Any) -> bool:
    return nan_eq(a, b) or nan_lt(a, b)


def nan_gt(a: Any, b: Any) -> bool:
    return nan_lt(b, a)


def nan_ge(a: Any, b: Any) -> bool:
    return nan_eq(a, b) or nan_lt(b, a)


_NAN_KEY: Final = ("NaN",)


def nkey(v: Any) -> Any:
    """Hashable key with NaN equal to NaN (for sets of float / numeric values)."""
    return _NAN_KEY if v != v else v


def numeric_to_int(v: Decimal) -> int:
    # Postgres rounds numeric half away from zero when casting to an integer.
    return int(v.to_integral_value(rounding=ROUND_HALF_UP))


def float_to_int(v: float) -> int:
    return round(v)  # rint(): half to even, as Postgres; NaN/inf raise


def numeric_typmod(precision: int, scale: int) -> Callable[[Decimal], Decimal]:
    quantum = Decimal(1).scaleb(-scale)
    limit = Decimal(10) ** (precision - scale)

    def apply(v: Decimal | int) -> Decimal:
        v = Decimal(v)
        if v.is_nan():
            return v
        if v.is_infinite():
            raise OutOfRange("numeric field overflow")
        rounded = Decimal(v).quantize(quantum, rounding=ROUND_HALF_UP, context=NUMERIC_CONTEXT)
        if abs(rounded) >= limit:
            raise OutOfRange("numeric field overflow")
        return rounded

    return apply


def numeric_text(v: Decimal) -> str:
    if v.is_nan():
        return "NaN"
    if v.is_infinite():
        return "Infinity" if v > 0 else "-Infinity"
    # Decimal keeps the sign of zero (0 * -1 is -0); Postgres's numeric has no -0
    return format(v.copy_abs() if v.is_zero() else v, "f")


def bool_text(v: bool) -> str:
    return "true" if v else "false"


# Postgres with a libc locale maps case one code point at a time (towlower/towupper:
# Unicode's *simple* mapping). Python's str.lower/upper apply the full mapping, which
# sometimes gives several code points; there the simple mapping is one of these
# exceptions, or the character itself (e.g. 'ß' stays 'ß' in upper()).
_SIMPLE_LOWER: Final = {"\u0130": "i"}
_SIMPLE_UPPER: Final = {
    **{chr(c): chr(c + 8) for base in (0x1F80, 0x1F90, 0x1FA0) for c in range(base, base + 8)},
    "\u1fb3": "\u1fbc",
    "\u1fc3": "\u1fcc",
    "\u1ff3": "\u1ffc",
}


def lower(s: str) -> str:
    if s.isascii():
        return s.lower()
    return "".join(low if len(low := c.lower()) == 1 else _SIMPLE_LOWER.get(c, c) for c in s)


def upper(s: str) -> str:
    if s.isascii():
        return s.upper()
    return "".join(up if len(up := c.upper()) == 1 else _SIMPLE_UPPER.get(c, c) for c in s)


def lower_c(s: str) -> str:
    return s.translate(_ASCII_LOWER)


def upper_c(s: str) -> str:
    return s.translate(_ASCII_UPPER)


def flat(a: list[Any]) -> list[Any]:
    """Elements of a (possibly multi-dimensional) array in storage order."""
    if not any(type(e) is list for e in a):
        return a
    out: list[Any] = []
    for e in a:
        out.extend(flat(e) if type(e) is list else (e,))
    return out


def acontains(a: list[Any], b: list[Any]) -> bool:
    """``a @> b``: every element of b is in a; NULL elements never match."""
    have = {nkey(e) for e in flat(a) if e is not None}
    return all(e is not None and nkey(e) in have for e in flat(b))


def aoverlap(a: list[Any], b: list[Any]) -> bool:
    have = {nkey(e) for e in flat(a) if e is not None}
    return any(e is not None and nkey(e) in have for e in flat(b))


def array_any(test: Callable[[Any, Any], bool], x: Any, arr: list[Any], every: bool) -> bool | None:
    """``x op ANY(arr)`` (``every`` False) or ``x op ALL(arr)`` with SQL NULL rules."""
    elements = flat(arr)
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


# Everything generated code may call by name (besides the constants and parsers a
# CodeGen binds): the helpers below and a few builtins, nothing else.
RUNTIME: Final[dict[str, Any]] = {
    "ck2": ck2,
    "ck4": ck4,
    "ck8": ck8,
    "idiv": idiv,
    "imod": imod,
    "nadd": nadd,
    "nsub": nsub,
    "nmul": nmul,
    "nneg": nneg,
    "nabs": nabs,
    "nmod": nmod,
    "fadd": fadd,
    "fsub": fsub,
    "fmul": fmul,
    "fdiv": fdiv,
    "f4op": f4op,
    "nan_eq": nan_eq,
    "nan_ne": nan_ne,
    "nan_lt": nan_lt,
    "nan_le": nan_le,
    "nan_gt": nan_gt,
    "nan_ge": nan_ge,
    "nkey": nkey,
    "date_ts": date_ts,
    "acontains": acontains,
    "aoverlap": aoverlap,
    "array_any": array_any,
    "EVAL_ERRORS": EVAL_ERRORS,
    "__builtins__": {
        "float": float,
        "int": int,
        "str": str,
        "len": len,
        "abs": abs,
        "bool": bool,
    },
}
