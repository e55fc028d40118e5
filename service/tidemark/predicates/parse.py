"""The form of a shape predicate: parsed with sqlglot and checked construct by construct.

``parse_predicate(text, table)`` promises that the returned ``ParsedPredicate`` holds
one expression built only from the constructs the compiler supports (the node types in ``_ALLOWED``;
the list is in ``tidemark.predicates.compiler``), with every column reference reduced
to one quoted identifier holding its exact catalog name (unquoted names folded to
lower case, a qualifier naming the shape's own table dropped). Anything else raises
``ShapeError`` naming the construct and, where there is one, the alternative:
sub-queries, aggregates, window functions, parameters, non-deterministic or unknown
functions, unsupported operators, other tables' columns, several statements,
collations other than ``"C"``/``"POSIX"``.

Size is bounded before anything recurses over the text or the tree: at most
``MAX_PREDICATE_TOKENS`` tokens, and at most ``MAX_PREDICATE_DEPTH`` levels of nesting
(parentheses and function calls, NOT, unary minus, casts, operators inside operators;
a chain of ANDs or of ORs is one level however long, and so is an ``IN`` list). Deeper
or larger predicates raise ``ShapeError`` giving the limit, so no stage after this one
(sqlglot's parser, the typer, the code generator, Python's compiler) meets a tree
deeper than it can take.

Types are not looked at here; ``tidemark.predicates.typer`` does that against a table's
columns. The tree is mutated only while parsing (``$$...$$`` strings become plain
literals, comments are dropped), never afterwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from tidemark.errors import ShapeError
from tidemark.predicates.identifiers import fold_identifier

MAX_PREDICATE_DEPTH: Final = 32
MAX_PREDICATE_TOKENS: Final = 50_000
_OPENING: Final = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET})
_CLOSING: Final = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET})

COMPARISONS: Final[dict[type[exp.Expression], str]] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
ARITHMETIC: Final[dict[type[exp.Expression], str]] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_FUNCTIONS: Final = "lower, upper, length, char_length, abs, coalesce, nullif"
_ALLOWED: Final[frozenset[type[exp.Expression]]] = frozenset(
    {
        *COMPARISONS,
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
ANY_ALL_NAMES: Final = frozenset({"ALL", "SOME"})
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


def unsupported(node: exp.Expression) -> ShapeError:
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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CLASS = re.compile(r"<class '[^']*'>")
_MISSING = re.compile(r"^Required keyword: '[^']*' missing for .*$")


def syntax_error(text: str, error: ParseError | TokenError) -> str:
    """A predicate's syntax error in the user's terms: where in their text (line,
    column, the word there, a caret under it) and what is wrong, in plain text (no
    terminal escapes, no parser class names)."""
    head = f"the shape predicate {_excerpt(text)!r} is not valid SQL"
    if isinstance(error, TokenError):
        return (
            f"{head}: it has an unterminated quoted string or identifier, or a character "
            "SQL does not allow"
        )
    found = error.errors[0] if error.errors else {}
    what = _ANSI.sub("", str(found.get("description") or error))
    if _MISSING.match(what):
        what = "an operand is missing here"
    elif what == "Invalid expression / Unexpected token":
        what = "unexpected here"
    elif what == "Expecting )":
        what = "a closing parenthesis is missing"
    what = _CLASS.sub("an expression", what)
    line, col = found.get("line"), found.get("col")
    near = _ANSI.sub("", str(found.get("highlight") or "")).strip()
    lines = text.splitlines() or [text]
    if not isinstance(line, int) or not isinstance(col, int) or not 1 <= line <= len(lines):
        return f"{head}: {what}"
    source = lines[line - 1]
    start = max(0, col - len(near)) if near else max(0, col - 1)
    at = f"line {line}, column {start + 1}" + (f" ({near!r})" if near else "")
    return f"{head} at {at}: {what}\n  {source}\n  {' ' * start}{'^' * max(1, len(near))}"


def parse_predicate(text: str, table: tuple[str, str] | None = None) -> ParsedPredicate:
    """Parse and validate the form of ``text``; ``table`` = (schema, name) it filters.

    Column references may be qualified with the table's own name (``orders.id`` or
    ``public.orders.id``); the qualifier is dropped. Raises ShapeError.
    """
    if not text.strip():
        raise ShapeError("the shape predicate is empty: omit 'where' to take every row")
    try:
        _check_size(text)
        parsed = sqlglot.parse(text, read="postgres")
    except (ParseError, TokenError) as e:
        raise ShapeError(syntax_error(text, e)) from e
    except RecursionError:  # nesting without parentheses (NOT NOT ..., - - ...)
        raise too_deep() from None
    statements = [s for s in parsed if s is not None]
    if len(statements) != 1:
        raise ShapeError(
            f"a shape predicate must be a single boolean expression; {text!r} holds "
            f"{len(statements)} statements"
        )
    tree = statements[0]
    assert isinstance(tree, exp.Expression)
    if nesting_depth(tree) > MAX_PREDICATE_DEPTH:
        raise too_deep()
    columns: set[str] = set()
    for node in list(tree.walk()):
        assert isinstance(node, exp.Expression)
        kind = type(node)
        if kind is exp.RawString:  # $$...$$: the same string; regenerated as '...'
            node.replace(exp.Literal.string(node.this))
            continue
        if kind not in _ALLOWED:
            raise unsupported(node)
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


def too_deep() -> ShapeError:
    return ShapeError(
        f"the shape predicate is nested too deeply: at most {MAX_PREDICATE_DEPTH} levels of "
        "parentheses, function calls, NOT, casts and operators inside operators are "
        "supported (a chain of ANDs or ORs, or an IN list, counts as one level). Write it "
        "flatter, e.g. one IN list or one OR chain instead of nested groups"
    )


def _excerpt(text: str, width: int = 200) -> str:
    return text if len(text) <= width else f"{text[:width]}... ({len(text):,} characters)"


def _check_size(text: str) -> None:
    """Refuse too many tokens or too deep parentheses before sqlglot's (recursive)
    parser sees the text; tokenizing is a loop."""
    if len(text) > 20 * MAX_PREDICATE_TOKENS:  # tokens are rarely longer than this
        raise _too_large(f"{len(text):,} characters")
    tokens = sqlglot.tokenize(text, read="postgres")
    if len(tokens) > MAX_PREDICATE_TOKENS:
        raise _too_large(f"{len(tokens):,} tokens")
    depth = 0
    for token in tokens:
        if token.token_type in _OPENING:
            depth += 1
            if depth > MAX_PREDICATE_DEPTH:
                raise too_deep()
        elif token.token_type in _CLOSING:
            depth -= 1


def _too_large(size: str) -> ShapeError:
    return ShapeError(
        f"the shape predicate is too large ({size}): at most {MAX_PREDICATE_TOKENS:,} tokens "
        "(words, values, operators) are supported. A long list of values is best an IN "
        "list; a very long one belongs in a table the shape's table can be joined with "
        "upstream"
    )


def nesting_depth(tree: exp.Expression) -> int:
    """Levels of nesting in ``tree`` (see the module docstring), walked without
    recursion. Parentheses are transparent; a connective nested in the same connective
    (a chain) adds no level."""
    deepest = 0
    # (node, its depth, the kind of the nearest enclosing node that is not a Paren)
    stack: list[tuple[exp.Expression, int, type | None]] = [(tree, 1, None)]
    while stack:
        node, depth, enclosing = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_PREDICATE_DEPTH:
            break
        kind = type(node)
        context = enclosing if kind is exp.Paren else kind
        for child in node.iter_expressions():
            child_kind = type(child)
            if child_kind is exp.Paren or (
                child_kind in (exp.And, exp.Or) and child_kind is context
            ):
                stack.append((child, depth, context))
            elif not isinstance(child, exp.Identifier | exp.Literal | exp.DataType):
                stack.append((child, depth + 1, context))
    return deepest


def _check_any_all(node: exp.Expression) -> None:
    name = node.name.upper()
    parent = node.parent
    if (
        name not in ANY_ALL_NAMES
        or type(parent) not in COMPARISONS
        or parent is None
        or parent.expression is not node
        or len(node.expressions) != 1
    ):
        raise unsupported(node)


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
        raise unsupported(node)
    name = fold_identifier(ident.name, bool(ident.args.get("quoted")))
    node.set("this", exp.Identifier(this=name, quoted=True))
    return name
