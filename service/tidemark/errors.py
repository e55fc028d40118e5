"""One exception hierarchy for tidemark.

Every error a user can meet says what was wrong, with which value, and what to do.
Code raises the most specific subclass; callers catch ``TidemarkError``.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Base of every error tidemark raises on purpose."""


class ConfigError(TidemarkError):
    """Configuration is missing, malformed or inconsistent."""


class ShapeError(TidemarkError):
    """A shape definition is invalid (predicate, table, columns, identity, types)."""


class ShapeConflict(ShapeError):
    """A shape operation that the shape's current state rules out (removed meanwhile,
    never activated): nothing was changed; the message says what to do instead."""


class ProtocolError(TidemarkError):
    """Bytes from the walsender do not follow the replication / pgoutput protocol."""


class ReplicationError(TidemarkError):
    """The replication connection, slot or publication cannot be used as asked."""


class SlotLostError(ReplicationError):
    """The replication slot was dropped or invalidated: fatal, never retried."""


class StreamGapError(ReplicationError):
    """The stream the shapes' claims were made on was broken (slot dropped, recreated
    or advanced by someone else, another source): resuming would leave a silent gap."""


class SinkError(TidemarkError):
    """A lake table cannot be written or read as the commit protocol requires."""


class WriterFenced(SinkError):
    """Another writer committed transactions a batch of this process also holds: this
    process is no longer the table's writer and must not commit them again."""


class TableDamaged(SinkError):
    """A table's log or files are damaged beyond what tidemark repairs on its own (a
    torn entry in the middle of the log, a data file the log names that is missing):
    the shape must be rebuilt from a snapshot; the message says how."""


class InvariantViolation(TidemarkError):
    """Something we promised Postgres or readers did not hold (e.g. ack beyond durable)."""


class UnfitValue(SinkError):
    """A value its lake column cannot hold exactly: refused, never rounded or nulled.

    Raised while a batch is built; ``within`` adds the column and the shape as the
    callers that know them re-raise it, so the message names all four: shape,
    column, value and lake type.
    """

    def __init__(
        self,
        value: bytes | str,
        lake_type: str,
        reason: str,
        remedy: str = "",
        *,
        column: str | None = None,
        shape: str | None = None,
    ) -> None:
        self.value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        self.lake_type = lake_type
        self.reason = reason
        self.remedy = remedy
        self.column = column
        self.shape = shape
        super().__init__(self._message())

    def _message(self) -> str:
        shown = self.value if len(self.value) <= 80 else self.value[:80] + "..."
        where = []
        if self.shape is not None:
            where.append(f"shape {self.shape!r}")
        if self.column is not None:
            where.append(f"column {self.column}")
        prefix = ", ".join(where) + ": " if where else ""
        column = self.column or "<column>"
        remedy = self.remedy.replace("{column}", column) or (
            f"Change the shape's columns to list '{column}::text' (keeps Postgres's text "
            "output) or a type that holds it; the shape is then rebuilt from a snapshot"
        )
        return f"{prefix}value {shown!r} does not fit {self.lake_type}: {self.reason}. {remedy}"

    def within(self, *, column: str | None = None, shape: str | None = None) -> UnfitValue:
        """The same refusal, naming the column and/or the shape as well."""
        return UnfitValue(
            self.value,
            self.lake_type,
            self.reason,
            self.remedy,
            column=self.column if column is None else column,
            shape=self.shape if shape is None else shape,
        )


JAVA_FRAME = ("\tat ", "\t... ", "\tSuppressed: ", "\t\t")
FAILURE_CHARS = 600  # of each part of a summarised failure


def failure_text(error: BaseException) -> str:
    """What failed, in a line or two: ``Type: message``; for an error from the JVM
    (py4j's, whose text is the whole Java stack) the exception Spark raised and the
    first exception it was caused by, without the stack frames."""
    text = str(error)
    name = type(error).__name__
    if "\n\tat " not in text:
        return f"{name}: {text}"
    heads = [line for line in text.splitlines() if line.strip() and not line.startswith(JAVA_FRAME)]
    raised = next((line[2:] for line in heads if line.startswith(": ")), heads[0])
    causes = [line[len("Caused by: ") :] for line in heads if line.startswith("Caused by: ")]
    out = _short_java(raised)
    if causes:
        out += f" (caused by {_short_java(causes[0])})"
    return out


def _short_java(line: str) -> str:
    """``org.apache.x.SomeException: message`` as ``SomeException: message``, cut."""
    head, sep, message = line.partition(": ")
    if sep and " " not in head and "." in head:
        line = f"{head.rsplit('.', 1)[1]}: {message}"
    return line if len(line) <= FAILURE_CHARS else line[: FAILURE_CHARS - 3] + "..."
