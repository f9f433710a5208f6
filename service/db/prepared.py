"""Core statements of the release's hot path, compiled once per dialect and run on the
transaction's DBAPI cursor.

Why: each statement of a release's path (the API's creating transaction, the worker's claim
and store) cost 0.1-0.45 ms of Python in ``Connection.execute`` before and after the
database's own work (cold, per release: docs/benchmarks.md, "Release fixed cost, tenth
pass" and "eleventh pass"), about half of the CPU a release spends outside its mechanism at
50,000 x 100. SQLAlchemy caches the compiled form already; what is left per execution is its
execution context: the cache key's generation and lookup, the context's construction, the
result's metadata and row objects. :class:`Prepared` compiles its statement once per dialect
and set of parameter names and, per execution, only builds the driver's parameters (with the
column types' bind processors, as SQLAlchemy would), runs them through
``Connection._cursor_execute`` and converts the rows with the types' result processors.

What stays as it was: the statement's text (the compiler's, for the connection's dialect),
the transaction (the caller's connection, begun as the session begins it: ``BEGIN
IMMEDIATE`` on SQLite), the engine's ``before/after_cursor_execute`` events (tests count
statements by them), and errors (``_cursor_execute`` wraps a driver's error as SQLAlchemy
does, ``IntegrityError``, ``OperationalError``, and invalidates a connection it lost).

Only statements the plain path handles alike: no Python-side defaults left to fill
(``insert_prefetch``/``update_prefetch``), no schema translation. Anything else is refused
when its plan is made (a programming error).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import MultipleResultsFound, NoResultFound
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler


class Row(tuple[Any, ...]):
    """A result row: a tuple whose values are also read by the statement's column names
    (``row.attempts``), as a SQLAlchemy ``Row`` is."""

    __slots__ = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._index[name]]
        except KeyError:
            raise AttributeError(name) from None


class _Plan:
    """One statement compiled for one dialect and set of parameter names."""

    __slots__ = (
        "compiled",
        "escaped",
        "expands",
        "order",
        "positional",
        "processors",
        "result_processors",
        "result_types",
        "row_type",
        "sequence",
        "sql",
    )

    def __init__(self, statement: Executable, dialect: Dialect, keys: Sequence[str]) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(keys))  # type: ignore[attr-defined]
        assert isinstance(compiled, SQLCompiler)
        if compiled.insert_prefetch or compiled.update_prefetch or compiled.schema_translate_map:
            raise ValueError("statement not preparable (Python-side defaults, schema translation)")
        self.compiled = compiled
        self.sql = compiled.string
        #: Expanding (``IN``) or literal-rendered parameters: expanded per execution, as
        #: SQLAlchemy's execution context does (the statement's text then depends on them).
        self.expands = bool(compiled.literal_execute_params or compiled.post_compile_params)
        self.positional = bool(compiled.positional)
        self.order = tuple(compiled.positiontup or ()) if self.positional else ()
        # Single processors only: a tuple's would be a sequence (no such bind here).
        self.processors = typing.cast(
            "Mapping[str, Callable[[Any], Any]]", compiled._bind_processors
        )
        self.escaped = compiled.escaped_bind_names
        self.sequence = dialect.execute_sequence_format
        columns = compiled._result_columns
        self.result_types = tuple(column[3] for column in columns)
        self.row_type: type[Row] | None = None
        if columns:
            self.row_type = type(
                "Row", (Row,), {"__slots__": (), "_index": {c[0]: i for i, c in enumerate(columns)}}
            )
        #: The types' result processors, read from the first cursor's description (a
        #: processor may depend on the driver's column type, as SQLAlchemy's does).
        self.result_processors: tuple[Callable[[Any], Any] | None, ...] | None = None

    def parameters(self, params: Mapping[str, Any]) -> tuple[str, Any]:
        """The statement's text and the driver's parameters for ``params``, as SQLAlchemy's
        execution context builds them (the compiled values of literal binds, expanding
        parameters expanded, each type's bind processor)."""
        compiled = self.compiled
        values = compiled.construct_params(params, escape_names=False)
        sql, processors, order = self.sql, self.processors, self.order
        if self.expands:
            expanded = compiled._process_parameters_for_postcompile(values)
            sql, processors = expanded.statement, {**processors, **expanded.processors}
            order = tuple(expanded.positiontup or ())
        if self.positional:
            return sql, self.sequence(
                [
                    processors[key](values[key]) if key in processors else values[key]
                    for key in order
                ]
            )
        escaped: Mapping[str, str] = self.escaped or {}
        return sql, {
            escaped.get(key, key): (processors[key](value) if key in processors else value)
            for key, value in values.items()
        }

    def rows(self, cursor: Any, dialect: Dialect) -> list[Row]:
        """The cursor's rows, each value through its type's result processor."""
        fetched = cursor.fetchall()
        assert self.row_type is not None
        processors = self.result_processors
        if processors is None:
            description = cursor.description or ()
            processors = self.result_processors = tuple(
                kind._cached_result_processor(dialect, entry[1])
                for kind, entry in zip(self.result_types, description, strict=True)
            )
        row_type = self.row_type
        if not any(processors):
            return [row_type(row) for row in fetched]
        return [
            row_type(
                [
                    processor(value) if processor is not None else value
                    for processor, value in zip(processors, row, strict=True)
                ]
            )
            for row in fetched
        ]


class Prepared:
    """A Core statement run through :func:`execute`'s short path (see the module docstring).
    The plans are built on first use, one per dialect and tuple of parameter names (an
    ``INSERT`` or ``UPDATE`` without ``values()`` writes the columns its parameters name)."""

    __slots__ = ("_plans", "statement")

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._plans: dict[tuple[str, tuple[str, ...]], _Plan] = {}

    def _plan(self, dialect: Dialect, keys: tuple[str, ...]) -> _Plan:
        plan = self._plans.get((dialect.name, keys))
        if plan is None:
            plan = self._plans[(dialect.name, keys)] = _Plan(self.statement, dialect, keys)
        return plan

    def _run(self, connection: Connection, params: Mapping[str, Any]) -> tuple[Any, _Plan]:
        if not connection.in_transaction():
            connection.begin()
        dialect = connection.dialect
        plan = self._plan(dialect, tuple(params))
        sql, parameters = plan.parameters(params)
        cursor = connection.connection.cursor()
        try:
            connection._cursor_execute(cursor, sql, parameters)
        except BaseException:
            cursor.close()
            raise
        return cursor, plan

    def all(self, connection: Connection, params: Mapping[str, Any]) -> list[Row]:
        """Every row of the statement's result."""
        cursor, plan = self._run(connection, params)
        try:
            return plan.rows(cursor, connection.dialect)
        finally:
            cursor.close()

    def first(self, connection: Connection, params: Mapping[str, Any]) -> Row | None:
        """The first row, or ``None``."""
        rows = self.all(connection, params)
        return rows[0] if rows else None

    def one(self, connection: Connection, params: Mapping[str, Any]) -> Row:
        """The one row (an error if there is not exactly one)."""
        rows = self.all(connection, params)
        if not rows:
            raise NoResultFound("No row was found when one was required")
        if len(rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when exactly one was required")
        return rows[0]

    def run(self, connection: Connection, params: Mapping[str, Any]) -> int:
        """A statement without result rows; returns the driver's row count."""
        cursor, _ = self._run(connection, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()
