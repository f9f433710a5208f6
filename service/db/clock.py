"""The database's clock, for leases: every worker sets and checks a lease against the same
clock, whatever its own says.

A worker whose clock ran ahead of the others by more than the lease found every running job's
lease expired and took it over (a second run, a second attempt counted, the first worker's
outcome discarded as "lease lost"); one whose clock ran behind set leases that expired early.
In the statements themselves, so no round trip is added: PostgreSQL's
``statement_timestamp()`` in UTC (not ``now()``, the transaction's start, which stands still in
a long transaction and in tests' outer ones), SQLite's ``'now'`` (the host's clock: an embedded
database has one host, so its processes share a clock anyway). Both give the column's stored
form, naive UTC (:class:`service.db.types.UTCDateTime`); SQLite's as text to the millisecond,
which compares correctly with the microsecond text SQLAlchemy stores.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from service.db.types import UTCDateTime

#: SQLite's current UTC time in the text form of a stored datetime (millisecond precision).
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now'"


class db_now(FunctionElement[datetime]):  # noqa: N801 - used as a SQL function
    """The database's current UTC time."""

    type = UTCDateTime()
    inherit_cache = True
    name = "dpss_db_now"


class lease_end(FunctionElement[datetime]):  # noqa: N801 - used as a SQL function
    """The database's current UTC time plus ``seconds`` (a bound parameter)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "dpss_lease_end"

    def __init__(self, seconds: float) -> None:
        super().__init__(literal(float(seconds)))


@compiles(db_now, "postgresql")
def _now_postgresql(_element: db_now, _compiler: Any, **_kw: Any) -> str:
    return "timezone('UTC', statement_timestamp())"


@compiles(db_now, "sqlite")
def _now_sqlite(_element: db_now, _compiler: Any, **_kw: Any) -> str:
    return _SQLITE_NOW + ")"


@compiles(lease_end, "postgresql")
def _end_postgresql(element: lease_end, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"(timezone('UTC', statement_timestamp()) + make_interval(secs => {seconds}))"


@compiles(lease_end, "sqlite")
def _end_sqlite(element: lease_end, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"{_SQLITE_NOW}, ({seconds}) || ' seconds')"
