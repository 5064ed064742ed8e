"""The transport seam without workers: messages, URLs, configuration and the verdicts."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage
from nestegg.checkpoint.records import RunRecord
from nestegg.errors import (
    BrokerRefusedError,
    ConfigurationError,
    MissingDependencyError,
    TransportError,
)
from nestegg.transport import StepMessage, channel_name, transport_from_url
from nestegg.transport.redis_streams import RedisStreamsTransport
from nestegg.transport.verdicts import Verdict, judge
from nestegg.urls import UNREADABLE_USER


def test_a_message_round_trips_as_json() -> None:
    message = StepMessage("run-1", 3, 7, "classify", {"traceparent": "00-ab-cd-01"})
    assert message.encode().startswith(b'{"run_id":"run-1","seq":3,"fence":7')
    assert StepMessage.decode(message.encode()) == message
    assert StepMessage.decode(StepMessage("r", 1, 1).encode()).agent is None


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"run_id": "r"}', b'{"run_id":"r","seq":"x"}'])
def test_a_message_that_is_not_a_step_message_is_a_transport_error(raw: bytes) -> None:
    with pytest.raises(TransportError, match="not a nestegg step message"):
        StepMessage.decode(raw)


def test_channels_carry_the_prefix_and_the_pipeline() -> None:
    assert channel_name("triage", "classify") == "nestegg.triage.classify"
    assert channel_name("triage") == "nestegg.triage"


def test_no_two_pipelines_share_a_channel_whatever_dots_their_names_hold() -> None:
    assert channel_name("a.b") == "nestegg.a%2Eb" != channel_name("a", "b")
    assert channel_name("a", "b.c") == "nestegg.a.b%2Ec" != channel_name("a.b", "c")
    assert channel_name("a%2Eb") == "nestegg.a%252Eb" != channel_name("a.b")
    names = ["a", "b", "a.b", "b.c", "a%2Eb", "%", "."]
    channels = {(p, a): channel_name(p, a) for p in names for a in [None, *names]}
    assert len(set(channels.values())) == len(channels)


def test_urls_pick_the_transport() -> None:
    assert isinstance(transport_from_url("redis://127.0.0.1:6379/0"), RedisStreamsTransport)
    assert isinstance(transport_from_url("rediss://example:6380/0"), RedisStreamsTransport)
    from nestegg.transport.rabbitmq import RabbitMQTransport

    assert isinstance(transport_from_url("amqp://guest:guest@127.0.0.1/"), RabbitMQTransport)
    with pytest.raises(ConfigurationError, match="unknown scheme 'kafka'") as unknown:
        transport_from_url("kafka://broker:9092")
    assert str(unknown.value) == (
        "bad transport URL 'kafka://broker:9092': unknown scheme 'kafka' "
        "(redis://, rediss://, amqp://, amqps://)"
    )


UNREADABLE = (
    "its host or port cannot be read (an unclosed '[', a port that is not a number from 0 to "
    "65535, or a password holding '/', '?', '#' or '@' not %-escaped)"
)


USER = UNREADABLE_USER


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://[bad", f"bad transport URL 'redis://[bad': {UNREADABLE}"),
        (
            "redis://127.0.0.1:notaport/6",
            f"bad transport URL 'redis://127.0.0.1:notaport/6': {UNREADABLE}",
        ),
        (
            "rediss://:secret@127.0.0.1:70000/0",
            f"bad transport URL 'rediss://127.0.0.1:70000/0': {UNREADABLE}",
        ),
        (
            "redis://127.0.0.1:6379?db=first",
            "bad transport URL 'redis://127.0.0.1:6379?db=first': Invalid value for 'db' in "
            "connection URL.",
        ),
        ("amqp://guest:guest@[bad/", f"bad transport URL 'amqp://guest@[bad/': {UNREADABLE}"),
        (
            "redis://127.0.0.1:6379/0?socket_timout=1",  # redis-py: TypeError when it connects
            "bad transport URL 'redis://127.0.0.1:6379/0?socket_timout=1': unknown query option "
            "'socket_timout' (redis-py takes its connection options there)",
        ),
        (
            "rediss://127.0.0.1:6379/0?ssl_cert_reqs=bogus",  # redis-py: at the first command
            "bad transport URL 'rediss://127.0.0.1:6379/0?ssl_cert_reqs=bogus': redis-py does "
            "not take the value of the query option 'ssl_cert_reqs': Invalid SSL Certificate "
            "Requirements Flag: bogus",
        ),
        (
            "redis://127.0.0.1:6379/0?protocol=5",
            "bad transport URL 'redis://127.0.0.1:6379/0?protocol=5': redis-py does not take the "
            "value of the query option 'protocol': protocol must be either 2 or 3",
        ),
        (
            "redis://127.0.0.1:6379/abc",  # redis-py would read database 0
            "bad transport URL 'redis://127.0.0.1:6379/abc': the database is a number from 0 "
            "(redis://host:6379/0), got 'abc'",
        ),
        (
            "redis://127.0.0.1:6379/0?db=3",  # redis-py would take one of the two
            "bad transport URL 'redis://127.0.0.1:6379/0?db=3': the database is given twice "
            "(/0 and ?db=3): give it once, in the path (redis://host:6379/3) or as ?db=3",
        ),
        (
            "amqps://guest:guest@127.0.0.1:tls/",
            f"bad transport URL 'amqps://guest@127.0.0.1:tls/': {UNREADABLE}",
        ),
        # a password holding '/' or '#' unescaped: left out whole, never quoted by the reason
        ("amqp://user:pa/ss@host/", f"bad transport URL 'amqp://user@host/': {UNREADABLE}"),
        ("redis://:abc#def@host:x/0", f"bad transport URL 'redis://host:x/0': {UNREADABLE}"),
        # digits, then '/': read as a port, the rest as the path; refused all the same
        ("redis://u:123/x@host:6379/0", f"bad transport URL 'redis://u@host:6379/0': {USER}"),
        ("amqp://user:123/x@host/", f"bad transport URL 'amqp://user@host/': {USER}"),
    ],
)
def test_a_url_that_cannot_be_parsed_is_a_configuration_error_naming_it(
    url: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as bad:
        transport_from_url(url)
    assert str(bad.value) == message  # the password left out


def _refused(url: str, shown: str, reason: str) -> None:
    """``transport_from_url(url)`` raises the ConfigurationError naming the URL as
    ``shown`` (its password left out) and ``reason``."""
    with pytest.raises(ConfigurationError) as bad:
        transport_from_url(url)
    assert str(bad.value) == f"bad transport URL {shown!r}: {reason}"


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("timeout=0", "?timeout= is a number of seconds above 0 (such as timeout=20), got '0'"),
        ("timeout=-1", "?timeout= is a number of seconds above 0 (such as timeout=20), got '-1'"),
        (
            "timeout=nan",
            "?timeout= is a number of seconds above 0 (such as timeout=20), got 'nan'",
        ),
        (
            "socket_timeout=-1",
            "?socket_timeout= is a number of seconds above 0 (such as socket_timeout=20), got '-1'",
        ),
        (
            "socket_connect_timeout=0",
            "?socket_connect_timeout= is a number of seconds above 0 (such as "
            "socket_connect_timeout=20), got '0'",
        ),
        ("max_connections=0", "?max_connections= is a whole number from 1, got '0'"),
    ],
)
def test_a_redis_wait_or_pool_size_redis_py_would_misuse_is_refused_naming_it(
    query: str, reason: str
) -> None:
    # redis-py takes them: a publish then gives up at once on a busy pool, a worker retries
    # a "timeout" for ever, and a pool of 0 is its default of 100
    _refused(
        f"redis://:s3cret@127.0.0.1:6379/0?{query}", f"redis://127.0.0.1:6379/0?{query}", reason
    )
    transport_from_url("redis://127.0.0.1:6379/0?timeout=0.5&socket_timeout=inf&max_connections=1")


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("bogus=1", "unknown query option 'bogus'"),
        ("heartbeet=30&x=1", "unknown query options 'heartbeet', 'x'"),
        (
            "heartbeat=-1",
            "?heartbeat= is a whole number of seconds from 0 (off) to 65534, got '-1'",
        ),
        (
            "heartbeat=65535",
            "?heartbeat= is a whole number of seconds from 0 (off) to 65534, got '65535'",
        ),
        ("timeout=0", "?timeout= is a whole number of seconds from 1, got '0'"),
        ("timeout=1.5", "?timeout= is a whole number of seconds from 1, got '1.5'"),
        (
            "reconnect_interval=nan",
            "?reconnect_interval= is a number of seconds above 0, got 'nan'",
        ),
    ],
)
def test_an_amqp_option_the_clients_would_ignore_or_misread_is_refused_naming_it(
    query: str, reason: str
) -> None:
    # aiormq ignored an unknown option and read a heartbeat or timeout it could not read as 0
    _refused(
        f"amqp://guest:s3cret@127.0.0.1:5672/?{query}",
        f"amqp://guest@127.0.0.1:5672/?{query}",
        reason,
    )
    transport_from_url("amqp://g@h/?heartbeat=0&timeout=5&name=w1&reconnect_interval=0.5")


def test_a_transport_given_a_url_of_another_broker_says_so() -> None:
    from nestegg.transport.rabbitmq import RabbitMQTransport

    with pytest.raises(ConfigurationError, match="the scheme must be one of amqp://, amqps://"):
        RabbitMQTransport("redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigurationError, match="must be one of redis://, rediss://, unix://"):
        RedisStreamsTransport("amqp://guest:guest@127.0.0.1/")


def test_a_clutch_with_a_bad_transport_url_is_a_configuration_error(tmp_path: Any) -> None:
    from nestegg.checkpoint import SQLiteCheckpointStorage

    config = CheckpointConfig(storage=SQLiteCheckpointStorage(tmp_path / "db"))
    with pytest.raises(ConfigurationError, match=r"bad transport URL 'redis://\[bad'"):
        Clutch("p", transport="redis://[bad", checkpoint=config)


def test_a_missing_aio_pika_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aio_pika", None)
    monkeypatch.delitem(sys.modules, "nestegg.transport.rabbitmq", raising=False)
    with pytest.raises(MissingDependencyError, match=r"nestegg\[rabbitmq\]"):
        transport_from_url("amqp://guest:guest@127.0.0.1/")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "transport= needs checkpoint"),
        (
            {"checkpoint": CheckpointConfig(storage=MemoryCheckpointStorage())},
            "cannot use the memory store",
        ),
    ],
)
def test_a_transport_needs_a_shared_store(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Clutch("p", transport="redis://127.0.0.1:6379/0", **kwargs)


def test_a_transport_must_be_a_url_or_a_transport(tmp_path: Any) -> None:
    from nestegg.checkpoint import SQLiteCheckpointStorage

    config = CheckpointConfig(storage=SQLiteCheckpointStorage(tmp_path / "db"))
    with pytest.raises(ConfigurationError, match="must be a URL"):
        Clutch("p", transport=object(), checkpoint=config)


def _run(step_seq: int, lease_until: float | None, status: str = "running") -> RunRecord:
    return RunRecord(
        "r", "p", status, b"", 0.0, 0.0, fence=4, lease_until=lease_until, step_seq=step_seq
    )


NOW = 1000.0


@pytest.mark.parametrize(
    ("run", "seq", "redelivered", "verdict"),
    [
        (None, 1, False, Verdict.DROP),
        (_run(3, None, "completed"), 4, True, Verdict.DROP),
        (_run(3, None), 4, False, Verdict.TAKE),
        (_run(3, NOW - 1), 4, True, Verdict.TAKE),  # its holder died: take over
        (_run(3, NOW + 5), 4, False, Verdict.DROP),  # a live worker holds it: a duplicate
        (_run(3, NOW + 5), 4, True, Verdict.WAIT),  # taken back too early: wait for the lease
        (_run(3, None), 3, False, Verdict.DROP),  # committed
        (_run(3, NOW - 1), 3, True, Verdict.REPOINT),  # committed, maybe never pointed on
        # committed and held: its holder may be the worker that took this message, went on
        # with the run and died: wait for the lease, then point at the run again
        (_run(3, NOW + 5), 2, True, Verdict.WAIT),
        (_run(3, None), 6, False, Verdict.DROP),  # past the run
        (_run(3, NOW + 5, "waiting"), 4, False, Verdict.TAKE),  # swept: its wait may end
        (_run(3, NOW + 5, "waiting"), 3, True, Verdict.DROP),
    ],
)
def test_the_verdict_on_a_message(
    run: RunRecord | None, seq: int, redelivered: bool, verdict: Verdict
) -> None:
    assert judge(run, StepMessage("r", seq, 3), redelivered, NOW) is verdict


@pytest.mark.parametrize(
    ("fence", "step_seq", "event_seq", "continues"),
    [
        (5, 3, 9, True),  # claimed again by this worker, nothing in between
        (6, 3, 9, False),  # another claim in between
        (5, 4, 9, False),  # a step committed in between
        (5, 3, 10, False),  # an event written in between
    ],
)
def test_a_kept_state_is_used_only_for_the_run_as_left(
    fence: int, step_seq: int, event_seq: int, continues: bool
) -> None:
    from nestegg.transport.warm import Warm

    warm = Warm(4, 3, 9, execution=None, base=None, kept=())  # type: ignore[arg-type]
    claimed = RunRecord(
        "r", "p", "running", b"", 0.0, 0.0, fence=fence, step_seq=step_seq, event_seq=event_seq
    )
    assert warm.continues(claimed) is continues


def test_a_permission_the_broker_refuses_is_a_broker_refused_error() -> None:
    from aiormq.exceptions import ChannelAccessRefused
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoPermissionError

    from nestegg.transport import rabbitmq, redis_streams

    text = "ACCESS_REFUSED - access to queue 'q' in vhost 'prod' refused for user 'app'"
    with pytest.raises(BrokerRefusedError) as amqp:
        with rabbitmq.broker_errors("amqp://app:pw@mq:5672/prod", "declaring queue q"):
            raise ChannelAccessRefused(text)
    assert str(amqp.value) == (
        f"RabbitMQ at amqp://app@mq:5672/prod refused declaring queue q to user 'app': {text}"
    )
    text = "this user has no permissions to run the 'xgroup|create' command"
    with pytest.raises(BrokerRefusedError) as redis:
        with redis_streams.broker_errors("redis://app@cache:6379/0", "creating the group"):
            raise NoPermissionError(text)
    assert (
        str(redis.value) == f"Redis at redis://app@cache:6379/0 refused creating the group: {text}"
    )
    with pytest.raises(TransportError) as lost:  # not a refusal: a worker retries it
        with redis_streams.broker_errors("redis://cache:6379/0", "reading c"):
            raise RedisConnectionError("Connection closed by server.")
    assert not isinstance(lost.value, BrokerRefusedError)
    assert rabbitmq.refusal("amqp://mq/", "publish", ConnectionRefusedError(111, "no")) is None
