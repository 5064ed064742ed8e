"""URLs in messages: passwords left out, whatever the URL holds."""

from __future__ import annotations

import pytest

from nestegg.urls import UNREADABLE_USER, host_problem, redis_database_problem, without_password


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app@db:5432/app"),
        ("amqp://guest@mq/", "amqp://guest@mq/"),
        ("redis://:s3cret@cache:6379/0", "redis://cache:6379/0"),
        ("amqp://user:pa/ss@host/", "amqp://user@host/"),  # '/' not %-escaped
        ("redis://:abc#def@host:6379/0", "redis://host:6379/0"),  # '#' not %-escaped
        ("amqp://u:p@ss@host/v", "amqp://u@host/v"),  # '@' not %-escaped
        ("redis://cache:6379/0?password=s3cret&ssl=1", "redis://cache:6379/0?password=***&ssl=1"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("no scheme", "no scheme"),
        ("host=db dbname=app password=s3cret", "host=db dbname=app password=***"),
        ("host=db PassWord = 's3cret pa/ss' port=5", "host=db PassWord = *** port=5"),
        ("host=db password='s3cret unclosed", "host=db password=***"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert without_password(url) == shown
    assert "s3cret" not in without_password(url) and "pa/ss" not in without_password(url)


@pytest.mark.parametrize(
    "url",
    ["redis://h:6379", "redis://h:6379/", "redis://h/15", "redis://h?db=3", "redis://h/?db=3"],
)
def test_a_redis_database_that_is_a_number_or_none_is_fine(url: str) -> None:
    assert redis_database_problem(url) is None


@pytest.mark.parametrize(
    ("url", "places"),
    [
        ("redis://127.0.0.1:6379/0?db=3", "twice (/0 and ?db=3)"),
        ("redis://h?db=1&ssl=1&db=2", "twice (?db=1 and ?db=2)"),
        ("redis://h/1?db=1&db=2", "3 times (/1 and ?db=1 and ?db=2)"),
    ],
)
def test_a_redis_database_given_more_than_once_is_named(url: str, places: str) -> None:
    # redis-py would take one of them and say nothing
    assert redis_database_problem(url) == (
        f"the database is given {places}: give it once, in the path (redis://host:6379/3) "
        "or as ?db=3"
    )


@pytest.mark.parametrize("database", ["abc", "-1", "1.5", "٣", str(2**31)])
def test_a_redis_database_that_is_no_number_is_named(database: str) -> None:
    assert redis_database_problem(f"redis://h:6379/{database}") == (
        f"the database is a number from 0 (redis://host:6379/0), got {database!r}"
    )


@pytest.mark.parametrize(
    ("url", "left", "prefix"),
    [
        (
            "postgresql://app@db/app?options=-c%20search_path%3Dmy&table_prefix=x_",
            "postgresql://app@db/app?options=-c%20search_path%3Dmy",
            "x_",
        ),
        (
            "postgresql://app@db/app?application_name=a+b&table_prefix=x_&sslmode=disable",
            "postgresql://app@db/app?application_name=a+b&sslmode=disable",  # '+' kept
            "x_",
        ),
        ("postgresql://app@db/app", "postgresql://app@db/app", None),
    ],
)
def test_a_store_url_gives_its_prefix_and_keeps_its_other_options_as_written(
    url: str, left: str, prefix: str | None
) -> None:
    from nestegg.checkpoint.stores import open_store

    store = open_store(url)
    assert store._url == left  # type: ignore[attr-defined]
    assert store.table_prefix == (prefix or "nestegg_")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:123/x@host:6379/0",  # read as host 'u', port 123, database 'x@host:6379/0'
        "postgresql://app:123/x@db:5432/app",
        "amqp://guest:5672/x@mq/",
        "redis://:12?x@host:6379/0",  # '?' not %-escaped: the rest read as the query
        "redis://:12#x@host:6379/0",
        "redis://u:12?x=y@host:6379/0",  # '?' then '=': read as port 12 and an option 'x'
        "redis://u:12/3?x=y@host:6379/0",
        "postgresql://app:12?sslmode=x@db:5432/app",
        "postgresql://db/app?user=me@corp",  # cannot be told from the ones above: %40
        "postgresql://db/app?sslmode=require&user=me@corp",
    ],
)
def test_a_password_of_digits_then_slash_is_refused_without_quoting_it(url: str) -> None:
    assert host_problem(url) == UNREADABLE_USER
    assert "x@" not in without_password(url) and "12" not in without_password(url)
    assert "x" not in without_password(url).partition("://")[2]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db/app?user=me%40corp",  # an option's value holds the '@'
        "sqlite:///runs@2024.db",  # no host: a path
        "redis://u:p@ss@host:6379/0",  # the user part ends at the last '@'
        "redis://host:6379/0",
    ],
)
def test_an_at_that_is_no_password_s_is_fine(url: str) -> None:
    assert host_problem(url) is None
