"""A query by primary key that Django compiles once per process and database.

Django builds and compiles a queryset anew for every call: for the trial
claim's ``select_related(...).only(...).get(pk=...)`` over five tables,
that is most of the query's CPU (1.1 ms of 2.8 ms measured on a slow
2-core machine, against 0.14 ms to execute the same SQL), paid by every
trial a worker runs. ``PreparedGet`` compiles the queryset once per
database alias with a sentinel primary key, then executes the same SQL with
the wanted key bound in its place and builds the instances, related objects
and deferred fields included, with Django's own row-to-object machinery
(the steps of ``ModelIterable``). What a call returns equals what the
queryset's ``get`` returns (a test compares them field by field).

Only querysets whose compiled SQL takes the primary key as one bound
parameter and nothing else that changes between calls (no ``now()``, no
per-call values) belong here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)

# A key no table here holds (primary keys are positive): its place among the
# compiled parameters is where each call binds its own key.
_SENTINEL = -7_340_033_017


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    key_at: int
    model: type[Any]  # a Model subclass: its DoesNotExist is declared per class
    init_list: list[str]
    model_slice: slice
    populators: list[Any]
    converters: list[tuple[int, tuple[list[Callable[..., Any]], Any]]]


class PreparedGet(Generic[M]):
    """``build().get(pk=key)`` with the SQL compiled once per database alias.

    ``build`` returns the queryset without its primary-key filter (for
    example ``Trial.objects.select_related("task").only(...)``). Safe to
    share between threads: each call runs on the calling thread's
    connection; what is compiled is immutable.
    """

    def __init__(self, build: Callable[[], QuerySet[M]]) -> None:
        self._build = build
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def get(self, key: int, *, using: str = DEFAULT_DB_ALIAS) -> M:
        """The instance with primary key ``key``; raises the model's
        DoesNotExist when there is none. Reads only; safe to repeat."""
        compiled = self._compiled.get(using) or self._compile(using)
        params = list(compiled.params)
        params[compiled.key_at] = key
        connection = connections[using]
        with statement_cursor(connection) as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchmany(2)
        if not rows:
            raise compiled.model.DoesNotExist(f"{compiled.model.__name__} matching query does not exist.")
        if len(rows) > 1:  # a primary key names one row; only a wrong queryset gets here
            raise compiled.model.MultipleObjectsReturned(f"more than one {compiled.model.__name__} with pk {key}")
        row = list(rows[0])
        for position, (converters, expression) in compiled.converters:
            value = row[position]
            for converter in converters:
                value = converter(value, expression, connection)
            row[position] = value
        instance = compiled.model.from_db(using, compiled.init_list, row[compiled.model_slice])
        for populator in compiled.populators:
            populator.populate(row, instance)
        return instance  # type: ignore[no-any-return]  # from_db builds the queryset's model, M

    def _compile(self, using: str) -> _Compiled:
        with self._lock:
            if using in self._compiled:
                return self._compiled[using]
            queryset = self._build().filter(pk=_SENTINEL)
            compiler = queryset.query.get_compiler(using=using)
            sql, params = compiler.as_sql()
            places = [index for index, param in enumerate(params) if param == _SENTINEL]
            if len(places) != 1:
                raise ValueError(f"the compiled query takes its key {len(places)} times, not once: {sql}")
            # as_sql filled select and klass_info, as execute_sql does for ModelIterable.
            select, klass_info = compiler.select, compiler.klass_info
            if compiler.annotation_col_map or queryset._known_related_objects:  # type: ignore[attr-defined]
                raise ValueError("annotations and known related objects are not supported")
            select_fields = klass_info["select_fields"]
            start, end = select_fields[0], select_fields[-1] + 1
            columns = [column[0] for column in select[: compiler.col_count]]
            compiled = _Compiled(
                sql=sql,
                params=tuple(params),
                key_at=places[0],
                model=klass_info["model"],
                init_list=[column[0].target.attname for column in select[start:end]],
                model_slice=slice(start, end),
                populators=get_related_populators(klass_info, select, using),  # type: ignore[call-arg]  # 5.2's signature
                converters=list(compiler.get_converters(columns).items()),
            )
            self._compiled[using] = compiled
            return compiled


class PreparedUpdate:
    """An ``UPDATE`` of one model's table written once per database vendor.

    For a statement a worker runs every trial (the claim, the finish): a
    ``QuerySet.filter(...).update(...)`` builds its filter and compiles its
    SQL anew each call, three quarters of the client's CPU for the statement.
    ``SET`` assigns ``fields`` (values prepared by each field, as
    ``update()`` prepares them: JSON dumped, datetimes adapted for the
    database) and then the literal ``also`` (``"attempt = attempt + 1"``);
    ``where`` is SQL over the table's columns with ``%s`` for its
    parameters and ``{name}`` for the quoted table of ``tables[name]``.
    Datetime parameters of ``where`` are adapted as a DateTimeField adapts
    them; other parameters go to the driver as they are. Safe to share
    between threads: each call runs on the calling thread's connection.
    """

    def __init__(
        self,
        model: type[Model],
        *,
        fields: tuple[str, ...],
        where: str,
        also: str = "",
        tables: dict[str, type[Model]] | None = None,
    ) -> None:
        self._fields = [concrete_field(model, name) for name in fields]
        self._model = model
        self._where = where
        self._also = also
        self._tables = tables or {}
        self._sql: dict[str, str] = {}

    def execute(self, values: tuple[Any, ...], where: tuple[Any, ...], *, using: str = DEFAULT_DB_ALIAS) -> int:
        """Run the update with ``values`` for ``fields`` (in order) and the
        parameters of ``where``; returns the number of rows changed."""
        connection = connections[using]
        sql = self._sql.get(connection.vendor) or self._compile(connection)
        params = [field.get_db_prep_save(value, connection) for field, value in zip(self._fields, values, strict=True)]
        params += [
            connection.ops.adapt_datetimefield_value(param) if isinstance(param, datetime) else param for param in where
        ]
        with statement_cursor(connection) as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def _compile(self, connection: Any) -> str:
        quote = connection.ops.quote_name
        assignments = [f"{quote(field.column)} = %s" for field in self._fields]
        if self._also:
            assignments.append(self._also)
        tables = {name: quote(model._meta.db_table) for name, model in self._tables.items()}
        table = quote(self._model._meta.db_table)
        sql = f"UPDATE {table} SET {', '.join(assignments)} WHERE {self._where.format(**tables)}"
        self._sql[connection.vendor] = sql
        return sql


def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    """The concrete field ``name`` of ``model`` (never a reverse relation)."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or field.column is None:
        raise ValueError(f"{model.__name__}.{name} is not a column")
    return field


_preparing_cursor: list[type[Any]] = []
# A count of executions no statement reaches: psycopg prepares only on request.
_NEVER = 1 << 62


def _preparing_cursor_class() -> type[Any]:
    """Django's cursor of psycopg 3 with server-side binding, preparing every statement it runs."""
    if not _preparing_cursor:
        from django.db.backends.postgresql.base import ServerBindingCursor
        from psycopg import errors
        from psycopg.pq import TransactionStatus

        class PreparingCursor(ServerBindingCursor):
            def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any) -> Any:
                prepare = True if prepare is None else prepare
                try:
                    return super().execute(query, params, prepare=prepare, **kwargs)  # type: ignore[misc]  # psycopg.Cursor.execute, unknown to django-stubs
                except errors.FeatureNotSupported as error:
                    # A migration changed a column under a statement this connection prepared
                    # ("cached plan must not change result type"): outside a transaction every later
                    # run failed the same way, since psycopg forgets its statements only on a rollback.
                    # Deallocated (psycopg then forgets them too), it is prepared anew. In a transaction,
                    # which the error aborted, it is raised: the rollback makes psycopg forget them.
                    status = self.connection.info.transaction_status  # type: ignore[attr-defined]  # psycopg.Cursor.connection
                    if not _stale_plan(error) or status != TransactionStatus.IDLE:
                        raise
                    super().execute("DEALLOCATE ALL", prepare=False)  # type: ignore[misc]
                    return super().execute(query, params, prepare=prepare, **kwargs)  # type: ignore[misc]

        _preparing_cursor.append(PreparingCursor)
    return _preparing_cursor[0]


def _stale_plan(error: Exception) -> bool:
    """Whether PostgreSQL refused a prepared statement because a table it reads changed shape."""
    return "cached plan must not change result type" in str(error)


@contextmanager
def statement_cursor(connection: Any) -> Iterator[CursorWrapper]:
    """A cursor of ``connection`` for a statement a worker runs every trial.

    On PostgreSQL (psycopg 3) with ``RSI_DB_PREPARED_STATEMENTS`` on, the
    statement is prepared on the server, once per database connection
    (psycopg keeps the connection's prepared statements, and forgets them
    with a failed transaction): the server then plans it once, where
    Django's client-side binding has it parsed and planned anew every call.
    Planning the claim's five-table join took 0.4 to 0.5 ms of the server's
    CPU against 0.03 ms to run it. Elsewhere, ``connection.cursor()``.
    The cursor is Django's wrapper (errors, query logging, execute wrappers),
    made as ``connection.cursor()`` makes it.
    """
    if connection.vendor != "postgresql" or not settings.RSI_DB_PREPARED_STATEMENTS:
        with connection.cursor() as cursor:
            yield cursor
        return
    # What connection.cursor() does, with another cursor class.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django turns psycopg's preparing off (None), which ignores even an
        # explicit prepare=True; a threshold never reached keeps every other
        # statement unprepared, as Django wants.
        raw.prepare_threshold = _NEVER
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        prepared = _preparing_cursor_class()(raw)
    wrapper = _LoggedStatements if connection.queries_logged else CursorWrapper
    with wrapper(prepared, connection) as cursor:
        yield cursor


class _LoggedStatements(CursorDebugWrapper):
    """Django's debug cursor, logging the statement as written: a prepared
    statement's executions leave psycopg no query text to log."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)
