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
* Evaluation order follows Postgres's, so errors surface where its do: the planner's
  constant simplification first (a strict operator or function with a NULL constant
  argument is NULL, an ``AND`` with a FALSE constant is FALSE, an ``OR`` with a TRUE
  constant is TRUE, without evaluating the rest; ``-(-9223372036854775808)`` is a
  numeric literal), then every argument of ``NULLIF``, ``op ANY (array)`` and strict
  functions, and ``IN`` lists as the parser rewrites them (two or more items without
  columns become one ``= ANY`` tested before the items that read columns).
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
  ``lower``/``upper`` map ASCII exactly; other characters use Unicode's simple
  (one code point to one) case mapping, as glibc does for a UTF-8 ``LC_CTYPE``;
  ``ILIKE`` compares both sides lowered, as Postgres does; under ``COLLATE "C"``
  only ASCII letters change. The database's ctype decides which one Postgres uses:
  ``shapes.catalog`` refuses the Unicode mapping where the ctype is ``C``
  (``CompiledPredicate.case_mapping`` says whether a predicate uses it). An ICU
  database applies the full mapping (``upper('ß')`` is ``'SS'`` there): not
  reproduced. ``char(n)`` values compare without trailing spaces, but ``LIKE`` sees
  them, both as in Postgres.
* Times: ``timestamptz`` literals must carry a UTC offset, and mixing ``timestamp``
  or ``date`` with ``timestamptz`` is rejected: Postgres would use the session's
  ``TimeZone``, which differs between the walsender and any snapshot query.
  ``'infinity'``, ``'-infinity'`` and the time ``'24:00:00'`` are values of their
  own, above or below every other and equal only to themselves (not Python's
  ``date.max``); clock words (``'now'``, ``'today'`` ...) are refused. Dates cast to
  text use the ISO style. Text is assumed to be UTF-8.

Where each part lives (this module is the public face and re-exports the names
callers use): ``parse`` (form), ``sqltypes`` (types, literal input),
``typer`` and ``typer_values`` (typing), ``comparison``, ``casts``, ``like`` and
``temporal`` (Postgres's rules for those), ``codegen`` and ``logic`` (typed nodes to
Python source), ``operators`` (what the generated code calls), ``identifiers``.
This module types, compiles and exposes the result: ``CompiledPredicate`` with
``matches``/``evaluate`` and the ``equality_terms`` the routing index files shapes
under.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sqlglot import exp

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import RelationColumn
from tidemark.predicates.codegen import CodeGen, ColumnValue, Const, Node, first_error
from tidemark.predicates.comparison import Compare, InSet, canonical_text
from tidemark.predicates.identifiers import fold_identifier, quote_identifier
from tidemark.predicates.logic import Logic
from tidemark.predicates.operators import INT_RANGE
from tidemark.predicates.parse import (
    MAX_PREDICATE_DEPTH,
    MAX_PREDICATE_TOKENS,
    ParsedPredicate,
    parse_predicate,
)
from tidemark.predicates.sqltypes import (
    BOOL,
    BPCHAR,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    RAW_EQUALITY,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UNKNOWN,
    UUID,
    VARCHAR,
    SqlType,
    sql_type,
    text_key,
    type_name,
)
from tidemark.predicates.typer_values import Typer

__all__ = [
    "BOOL",
    "BPCHAR",
    "BYTEA",
    "DATE",
    "FLOAT4",
    "FLOAT8",
    "INT2",
    "INT4",
    "INT8",
    "MAX_PREDICATE_DEPTH",
    "MAX_PREDICATE_TOKENS",
    "NUMERIC",
    "TEXT",
    "TIME",
    "TIMESTAMP",
    "TIMESTAMPTZ",
    "UNKNOWN",
    "UUID",
    "VARCHAR",
    "CompiledPredicate",
    "EqualityTerm",
    "ParsedPredicate",
    "PredicateEvaluationError",
    "Row",
    "SqlType",
    "compile_predicate",
    "fold_identifier",
    "parse_predicate",
    "predicate_sql",
    "quote_identifier",
    "sql_type",
    "type_name",
]

Row = Sequence[Any]


class PredicateEvaluationError(ShapeError):
    """The predicate raised for this row where Postgres would raise an error."""


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
    # lower/upper/ILIKE map more than ASCII letters (no COLLATE "C"): exact only in a
    # database whose ctype maps case per Unicode character (checked by shapes.catalog)
    case_mapping: bool = False

    @property
    def tree(self) -> exp.Expression:
        return self.parsed.tree


def _build(nodes: Sequence[Node], with_evaluate: bool) -> tuple[dict[str, Any], str]:
    g = CodeGen()
    if len(nodes) == 1:
        truth = nodes[0].truth(g)
        value = nodes[0].emit(g) if with_evaluate else "None"
    else:
        logic = Logic(nodes, conjunction=True)
        truth = logic.truth(g)
        value = logic.emit(g) if with_evaluate else "None"
    prologue = "".join(f"        {line}\n" for line in g.prologue())
    source = (
        "def _matches(row):\n"
        "    try:\n"
        f"{prologue}"
        f"        return {truth}\n"
        "    except EVAL_ERRORS:\n"
        "        return False\n"
        "def _evaluate(row):\n"
        "    try:\n"
        f"{prologue}"
        f"        return {value}\n"
        "    except EVAL_ERRORS as e:\n"
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
    typer = Typer(by_name)
    root = typer.boolean(parsed.tree)
    error = first_error(root)
    if error is not None:  # Postgres would raise it while planning any query
        raise ShapeError(error.message)
    conjuncts = list(root.items) if isinstance(root, Logic) and root.conjunction else [root]
    ns, source = _build([root], with_evaluate=True)
    positions = frozenset(c.position for c in root.columns())
    constant = None
    if isinstance(root, Const):
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
        case_mapping=typer.case_mapping,
    )


def _equality_term(node: Node) -> tuple[ColumnValue, bool, frozenset[Any]] | None:
    """(column, raw?, keys in key form) when ``node`` is column = constant(s)."""
    if isinstance(node, Compare) and node.op == "=":
        col, const = node.left, node.right
        if not isinstance(col, ColumnValue) or not isinstance(const, Const) or const.value is None:
            return None
        values_ = [const.value]
        cmp = node.cmp
    elif isinstance(node, InSet) and isinstance(node.item, ColumnValue) and not node.empty:
        col = node.item
        values_ = list(node.keys)
        cmp = node.cmp
    else:
        return None
    assert isinstance(col, ColumnValue)
    raw = col.type in RAW_EQUALITY
    keys: set[Any] = set()
    for v in values_:
        key = _key_form(col.type, cmp, v)
        if key is _NOT_INDEXABLE:
            return None
        if key is not _NEVER:
            keys.add(canonical_text(col.type, text_key(col.type), key) if raw else key)
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
        if kf == "numeric" and not isinstance(value, int):  # int constants stay int
            if value != value or not value.is_finite() or value != value.to_integral_value():
                return _NEVER
            value = int(value)
        low, high = INT_RANGE[column_type.bits]
        return value if low <= value <= high else _NEVER
    if text_key(column_type).family == kf and kf in (
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
