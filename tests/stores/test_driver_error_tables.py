"""Each server store maps its driver's errors by one table keyed on the driver's error
classes (and, for PostgreSQL, on SQLSTATE codes), never on message text; a server that
refuses the store's settings (a login, a role, a database) is a StoreRefusedError: a
ConfigurationError and a StorageError."""

from __future__ import annotations

import pytest

from nestegg.errors import (
    ConfigurationError,
    StorageError,
    StorageUnavailableError,
    StoreRefusedError,
)

psycopg = pytest.importorskip("psycopg")
redis = pytest.importorskip("redis")

from nestegg.checkpoint.stores.postgres import errors as pg_errors  # noqa: E402
from nestegg.checkpoint.stores.redis import errors as redis_errors  # noqa: E402

UNAVAILABLE_SQLSTATE_CLASSES = {"08", "40", "53", "57", "58"}


def _psycopg_sqlstate_classes() -> dict[str, type[Exception]]:
    return {
        cls.sqlstate: cls
        for cls in vars(psycopg.errors).values()
        if isinstance(cls, type)
        and issubclass(cls, psycopg.Error)
        and getattr(cls, "sqlstate", None)
    }


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        ("08006", StorageUnavailableError),  # connection failure
        ("57P01", StorageUnavailableError),  # admin shutdown
        ("57P03", StorageUnavailableError),  # cannot connect now
        ("53300", StorageUnavailableError),  # too many connections
        ("40P01", StorageUnavailableError),  # deadlock detected: the transaction may go again
        ("42P01", StorageError),  # undefined table: dropped behind the store's back
        ("23505", StorageError),  # unique violation
        ("54000", StorageError),  # program limit exceeded: no retry helps
        ("22P02", StorageError),  # invalid text representation
    ],
)
def test_postgres_errors_with_a_sqlstate_map_by_its_class(
    sqlstate: str, expected: type[StorageError]
) -> None:
    exc = psycopg.errors.lookup(sqlstate)("reported by the server")
    assert pg_errors.error_class(exc) is expected
    error = pg_errors.nestegg_error(exc, "db:5432/test")
    assert type(error) is expected and "reported by the server" in str(error)


def test_every_sqlstate_psycopg_knows_maps_by_the_table() -> None:
    codes = _psycopg_sqlstate_classes()
    assert len(codes) > 200
    for code, cls in codes.items():
        # a code decided apart from its class (a statement the server gives up on)
        unavailable = code[:2] in UNAVAILABLE_SQLSTATE_CLASSES and code not in pg_errors.BY_CODE
        expected = StorageUnavailableError if unavailable else StorageError
        assert pg_errors.error_class(cls("x")) is expected, code


def test_postgres_errors_without_a_sqlstate_map_by_their_psycopg_class() -> None:
    from psycopg_pool import PoolTimeout

    lost = psycopg.OperationalError("consuming input failed: server closed the connection")
    assert pg_errors.error_class(lost) is StorageUnavailableError
    assert pg_errors.error_class(PoolTimeout("no connection in 2 s")) is StorageUnavailableError
    assert pg_errors.error_class(psycopg.InterfaceError("the cursor is closed")) is StorageError
    assert pg_errors.error_class(psycopg.Error("anything else")) is StorageError


def test_the_message_never_decides_a_postgres_error() -> None:
    # Words of an outage in an error whose code says otherwise change nothing, and back.
    misleading = psycopg.errors.lookup("42P01")("connection refused: server unavailable")
    assert pg_errors.error_class(misleading) is StorageError
    plain = psycopg.errors.lookup("08006")("relation does not exist")
    assert pg_errors.error_class(plain) is StorageUnavailableError


FAILED = 'connection failed: connection to server at "db", port 5432 failed: '


@pytest.mark.parametrize(
    "reason",
    [
        'FATAL:  role "x" does not exist',
        'FATAL:  database "x" does not exist',
        'FATAL:  password authentication failed for user "x"',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "x", database "x", no encryption',
        'FATAL:  role "x" is not permitted to log in',
        "fe_sendauth: no password supplied",
        "FATAL:  no such database: x",  # PgBouncer
        'FATAL:  permission denied for database "x"',  # CONNECT not granted
        'FATAL:  pg_hba.conf rejects connection for host "10.0.0.7", user "x", database "x"',
        # PgBouncer's own refusals
        "FATAL:  password authentication failed",
        "FATAL:  SASL authentication failed",
        "FATAL:  no such user",
        "FATAL:  login rejected",
    ],
)
def test_a_connection_postgres_refuses_for_good_is_a_store_refusal(reason: str) -> None:
    # libpq's text is all a refused connection has (psycopg gives it no SQLSTATE)
    exc = psycopg.OperationalError(FAILED + reason)
    assert pg_errors.is_final(exc)
    error = pg_errors.nestegg_error(exc, "pg://u@db/x", connecting=True)
    assert type(error) is StoreRefusedError  # a ConfigurationError and a StorageError
    assert str(error).startswith("PostgreSQL at pg://u@db/x refused the store's settings")


@pytest.mark.parametrize(
    "reason",
    [
        "FATAL:  sorry, too many clients already",
        'FATAL:  too many connections for role "x"',
        "FATAL:  the database system is starting up",
        "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
        # PgBouncer, while its server cannot be reached or it is full
        "FATAL:  pgbouncer cannot connect to server",
        "FATAL:  no more connections allowed (max_client_conn)",
        "FATAL:  server login has been failing, try again later (server_login_retry)",
        "FATAL:  server login has been failing, cached error: password authentication failed "
        'for user "app" (server_login_retry)',  # PgBouncer 1.24: its own login, not ours
        "FATAL:  terminating connection due to administrator command",
    ],
)
def test_a_connection_refused_for_a_while_is_unavailable(reason: str) -> None:
    exc = psycopg.OperationalError(FAILED + reason)
    assert not pg_errors.is_final(exc)  # retried until the connect timeout
    error = pg_errors.nestegg_error(exc, "db", connecting=True)
    assert type(error) is StorageUnavailableError


@pytest.mark.parametrize(
    "text",
    [
        "consuming input failed: FATAL:  terminating connection due to administrator "
        "command\nserver closed the connection unexpectedly",
        'consuming input failed: FATAL:  role "x" does not exist',  # dropped while in use
        "consuming input failed: server closed the connection unexpectedly",
    ],
)
def test_an_error_without_a_sqlstate_inside_a_session_goes_by_its_class(text: str) -> None:
    # a session the server ended is lost, not refused: the words are not read there
    error = pg_errors.nestegg_error(psycopg.OperationalError(text), "db")
    assert type(error) is StorageUnavailableError
    with pytest.raises(StorageUnavailableError), pg_errors.driver_errors("db"):
        raise psycopg.OperationalError(text)


@pytest.mark.parametrize(
    ("libpq", "option"),
    [
        ('invalid sslmode value: "bogus"', "sslmode"),
        ('invalid target_session_attrs value: "x"', "target_session_attrs"),
        ('invalid "ssl_min_protocol_version" value: "x"', "ssl_min_protocol_version"),
        ('invalid value "x" for maximum SSL protocol version', "ssl_max_protocol_version"),
        ('invalid port number: "x"', "port"),
        (
            'connection to server at "db", port 5432 failed: invalid integer value "x" for '
            'connection option "keepalives"',
            "keepalives",
        ),
        ('require_auth method "password" is specified more than once', "require_auth"),
    ],
)
def test_an_option_value_libpq_does_not_take_is_a_configuration_error_naming_it(
    libpq: str, option: str
) -> None:
    exc = psycopg.OperationalError(f"connection is bad: {libpq}")
    assert pg_errors.is_final(exc)  # no retrying until the timeout: it will not pass
    error = pg_errors.nestegg_error(exc, "postgresql://u@db/x?o=v")
    assert type(error) is ConfigurationError
    assert str(error) == (
        "PostgreSQL store URL 'postgresql://u@db/x?o=v': libpq does not take the value of the "
        f"connection option {option!r}: connection is bad: {libpq}"
    )


def test_a_postgres_error_becomes_a_nestegg_error_with_the_driver_as_cause() -> None:
    with pytest.raises(StorageUnavailableError) as caught, pg_errors.driver_errors("db"):
        raise psycopg.errors.lookup("57P01")("terminating connection")
    assert "PostgreSQL at db is unavailable" in str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.Error)


@pytest.mark.parametrize(
    ("driver_error", "expected"),
    [
        (redis.exceptions.ConnectionError, StorageUnavailableError),
        (redis.exceptions.BusyLoadingError, StorageUnavailableError),
        (redis.exceptions.TimeoutError, StorageUnavailableError),
        (redis.exceptions.ResponseError, StorageError),
        (redis.exceptions.NoScriptError, StorageError),
        (redis.exceptions.DataError, StorageError),
        (redis.exceptions.ReadOnlyError, StorageError),
        (redis.exceptions.RedisError, StorageError),
    ],
)
def test_redis_errors_map_by_their_class(
    driver_error: type[Exception], expected: type[StorageError]
) -> None:
    exc = driver_error("said by redis-py")
    assert redis_errors.error_class(exc) is expected
    error = redis_errors.nestegg_error(exc)
    assert type(error) is expected and "said by redis-py" in str(error)


@pytest.mark.parametrize(
    "driver_error",
    [
        redis.exceptions.AuthenticationError,
        redis.exceptions.AuthenticationWrongNumberOfArgsError,
        redis.exceptions.AuthorizationError,
        redis.exceptions.NoPermissionError,
    ],
)
def test_redis_refusing_the_settings_is_a_configuration_error(driver_error: type) -> None:
    error = redis_errors.nestegg_error(driver_error("said by redis-py"), "redis://u@db:6379/0")
    assert type(error) is StoreRefusedError  # a ConfigurationError and a StorageError
    assert str(error).startswith("Redis at redis://u@db:6379/0 refused the store's settings")


def test_every_redis_py_error_maps_to_a_nestegg_storage_error() -> None:
    for cls in vars(redis.exceptions).values():
        if isinstance(cls, type) and issubclass(cls, redis.exceptions.RedisError):
            exc = cls.__new__(cls)  # some want arguments; only the class matters here
            assert issubclass(redis_errors.error_class(exc), StorageError), cls


def test_a_redis_error_becomes_a_nestegg_error_with_the_driver_as_cause() -> None:
    with pytest.raises(StorageError) as caught, redis_errors.driver_errors():
        raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
    assert not isinstance(caught.value, StorageUnavailableError)
    assert isinstance(caught.value.__cause__, redis.exceptions.ResponseError)
