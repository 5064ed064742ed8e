"""URLs in messages: one owner of leaving their secrets out."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Collection
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

_PASSWORD_OPTION = re.compile(r"(?i)([?&]password=)[^&#]*")
# libpq's key=value form: a value is a run of non-blanks or '…' with \-escapes (one not
# closed runs to the end: all of it is hidden).
_PASSWORD_KEYWORD = re.compile(r"(?i)(?<!\w)(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S*)")


def without_password(url: str) -> str:
    """``url`` for messages and logs: the password of its user part left out
    (``amqp://guest@host/``), and the value of a ``password=`` query option; in a string
    with no scheme (PostgreSQL's ``host=db password=…``), the value of ``password=``.

    The user part ends at the last ``@``: a password holding ``/``, ``?``, ``#`` or ``@``
    that was not %-escaped is left out whole all the same (and with it anything before an
    ``@`` further on, which only hides more).
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return _PASSWORD_KEYWORD.sub(r"\1***", url)
    userinfo, at, host = rest.rpartition("@")
    if at:
        user = userinfo.partition(":")[0]
        rest = f"{user}@{host}" if user else host
    return _PASSWORD_OPTION.sub(r"\1***", f"{scheme}://{rest}")


UNREADABLE_HOST = (
    "its host or port cannot be read (an unclosed '[', a port that is not a number from 0 to "
    "65535, or a password holding '/', '?', '#' or '@' not %-escaped)"
)


UNREADABLE_USER = (
    "its user part cannot be read: an '@' comes after the host, as when a password holds "
    "'/', '?' or '#' not %-escaped; percent-encode the password "
    "(urllib.parse.quote(password, safe='')), and an '@' in the path or in an option "
    "(?user=me%40corp) as %40"
)


def host_problem(url: str) -> str | None:
    """What is wrong with ``url``'s host or port (None: nothing): an unclosed ``[``, a port
    that is not a number from 0 to 65535 (what a password holding an unescaped ``/`` looks
    like), or an ``@`` after the host (a password holding an unescaped ``/`` after digits
    only: ``u:123/x@host`` reads as host ``u``, port 123; or ``?`` then ``=``:
    ``u:12?a=b@host`` reads as port 12 and an option ``a``). Never quotes the URL: what it
    would quote may be a piece of the password.

    A PostgreSQL URL may name several hosts (libpq's failover,
    ``postgresql://h1:5432,h2:5432/db``): each is checked, a bad one named by its place and
    itself (after the ``@`` rule, so no piece of a password is quoted); libpq's
    ``conninfo_to_dict`` decides the rest."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNREADABLE_HOST
    hosts = parts.netloc.rpartition("@")[2].split(",")
    if len(hosts) > 1 and parts.scheme in _MULTI_HOST_SCHEMES:
        if _at_after_host(url, parts.netloc):
            return UNREADABLE_USER
        for place, host in enumerate(hosts, 1):
            try:
                urlsplit(f"//{host}").port  # noqa: B018 (a port that is not a number raises)
            except ValueError:
                return (
                    f"host {place} of {len(hosts)}, {host!r}, cannot be read (an unclosed "
                    "'[', or a port that is not a number from 0 to 65535)"
                )
        return None
    try:
        parts.port  # noqa: B018 (read on access: a port that is not a number raises)
    except ValueError:
        return UNREADABLE_HOST
    if _at_after_host(url, parts.netloc):
        return UNREADABLE_USER
    return None


_MULTI_HOST_SCHEMES = ("postgresql", "postgres")
"""Schemes whose URLs may list several hosts, comma-separated (libpq's)."""


def _at_after_host(url: str, netloc: str) -> bool:
    """Whether an ``@`` follows a host that has no user part, anywhere: in the path, the
    query (an option's value too) or the fragment. ``?user=me@corp`` cannot be told from a
    password holding ``?`` and ``=`` (``u:12?user=me@corp`` reads as host ``u``, port 12,
    option ``user``), so an ``@`` there is written ``%40``, as the message says."""
    if not netloc or "@" in netloc:
        return False
    return "@" in url.partition("://")[2][len(netloc) :]


def redis_database_problem(url: str) -> str | None:
    """What is wrong with a ``redis://`` URL's database part (None: nothing): none, or a
    number, where redis-py would read ``/abc`` as database 0; given once, in the path
    (``/3``) or the query (``?db=3``), where redis-py would take one of the two."""
    parts = urlsplit(url)
    path = unquote(parts.path).strip("/")
    if path and not (path.isascii() and path.isdigit() and int(path) < 2**31):
        return f"the database is a number from 0 (redis://host:6379/0), got {path!r}"
    places = [f"/{path}"] if path else []
    places += [f"?db={value}" for name, value in parse_qsl(parts.query, True) if name == "db"]
    if len(places) > 1:
        times = "twice" if len(places) == 2 else f"{len(places)} times"
        return (
            f"the database is given {times} ({' and '.join(places)}): give it once, in the "
            "path (redis://host:6379/3) or as ?db=3"
        )
    return None


_REDIS_SECONDS = ("timeout", "socket_timeout", "socket_connect_timeout")
"""redis-py's URL options that are seconds to wait: for a free pool connection, for an
answer, for a connection to be made."""


def redis_option_problem(url: str) -> str | None:
    """What is wrong with a ``redis://`` URL's numbers that redis-py takes as they are
    (None: nothing): a wait (``?timeout=``, ``?socket_timeout=``,
    ``?socket_connect_timeout=``) is a number of seconds above 0, where redis-py takes 0, a
    negative number or NaN and then gives up every wait at once (a worker retrying a
    "timeout" for ever); ``?max_connections=`` is a whole number from 1, where redis-py
    reads 0 as its own default. A value redis-py cannot read at all is its parser's to
    tell."""
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name in _REDIS_SECONDS:
            try:
                seconds = float(value)
            except ValueError:
                continue
            if math.isnan(seconds) or seconds <= 0:
                return f"?{name}= is a number of seconds above 0 (such as {name}=20), got {value!r}"
        elif name == "max_connections" and value.strip().isdigit() and int(value) == 0:
            return f"?max_connections= is a whole number from 1, got {value!r}"
    return None


def query_problem(url: str, *takers: type) -> str | None:
    """What is wrong with ``url``'s query (None: nothing): the options none of ``takers``
    (classes whose ``__init__``, with their bases', takes the URL's options as keyword
    arguments: redis-py's pool and connection) takes, as a typo like ``?prefx=app:`` is,
    which a driver would refuse only at its first connection, with a ``TypeError``. With no
    takers (a store whose URL takes no options: SQLite, file, memory), every option, which
    the store would ignore. An option without a value (``?read_only``) counts too."""
    taken: set[str] = set()
    for taker in takers:
        for klass in inspect.getmro(taker):
            init = klass.__dict__.get("__init__")
            try:
                parameters = inspect.signature(init).parameters.values() if init else ()
            except (TypeError, ValueError):
                continue
            taken.update(p.name for p in parameters if p.kind in _KEYWORD_KINDS)
    return unknown_options(url, taken)


def unknown_options(url: str, known: Collection[str]) -> str | None:
    """What is wrong with ``url``'s query (None: nothing): the options not in ``known``."""
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    unknown = [name for name in query if name not in known]
    if not unknown:
        return None
    names = ", ".join(repr(name) for name in unknown)
    return f"unknown query option{'s' if len(unknown) > 1 else ''} {names}"


_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def value_problem(
    url: str, build: Callable[[str], object], refused: tuple[type[Exception], ...], driver: str
) -> str | None:
    """What is wrong with the values of ``url``'s query options (None: nothing), as
    ``build(url)`` (the ``driver``'s parser, which connects nowhere) refuses them with one
    of ``refused``: the first option whose value it refuses alone, and the driver's words.
    ``build`` raising TypeError is an option it does not take at all, which is
    :func:`query_problem`'s to tell, not a value."""
    try:
        build(url)
    except TypeError:
        return None
    except refused as error:
        parts = urlsplit(url)
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            alone = urlunsplit(parts._replace(query=urlencode({name: value})))
            try:
                build(alone)
            except TypeError:
                continue
            except refused:
                return f"{driver} does not take the value of the query option {name!r}: {error}"
        return f"{driver} does not take the value: {error}"
    return None


def slashes_problem(url: str, relative: str, absolute: str) -> str | None:
    """What is wrong with a path URL (``sqlite:``, ``file:``) whose scheme is not followed
    by ``//`` (None: nothing): ``sqlite:x.db`` reads as the path ``.db``, ``sqlite:/x.db``
    as ``x.db``. The message shows the two forms the path may have been meant as:
    ``relative`` and ``absolute`` are them with ``{}`` for the path without its leading
    ``/`` (``sqlite:///{}``, ``sqlite:////{}``)."""
    scheme, colon, rest = url.partition(":")
    if not colon or rest.startswith("//"):
        return None
    path = unquote(urlsplit(url).path).lstrip("/") or "path"
    return (
        f"{scheme}: is followed by '//' and the path: {relative.format(path)} for {path!r} "
        f"in the current directory, {absolute.format(path)} for '/{path}'"
    )


__all__ = [
    "UNREADABLE_HOST",
    "UNREADABLE_USER",
    "host_problem",
    "query_problem",
    "redis_database_problem",
    "redis_option_problem",
    "slashes_problem",
    "unknown_options",
    "without_password",
]
