"""Predicates: a shape's SQL ``WHERE`` text in, a compiled row test out.

``parse`` checks the text's form (sqlglot, dialect ``postgres``), ``sqltypes``,
``typer`` and ``typer_values`` type it by Postgres's rules (``comparison``,
``casts``, ``like`` and ``temporal`` hold those rules), ``codegen`` and ``logic``
turn the typed tree into one Python function that calls ``operators``, and
``compiler`` is the face callers use (``compile_predicate``, ``predicate_sql``);
``identifiers`` quotes and folds SQL names for everything that builds SQL. Pure: no
IO; differentially tested against Postgres (``tests/integration/
test_predicate_differential.py``).
"""

from tidemark.predicates.compiler import (
    CompiledPredicate,
    ParsedPredicate,
    PredicateEvaluationError,
    compile_predicate,
    parse_predicate,
    predicate_sql,
)

__all__ = [
    "CompiledPredicate",
    "ParsedPredicate",
    "PredicateEvaluationError",
    "compile_predicate",
    "parse_predicate",
    "predicate_sql",
]
