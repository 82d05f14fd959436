"""The connection to a study's storage: opened so that a wrong URL fails in seconds with the URL and the reason, and
kept so that a storage that drops mid-study (a PostgreSQL restarted, a failover, a network blip) costs a wait, not
the study.

    open_storage(url)    an Optuna storage for a SQLAlchemy URL; StorageUnavailable when it cannot be opened
    RetryingStorage      every storage call retried with exponential backoff while the connection is down

Opening: a PostgreSQL connection gives up after ``CONNECT_TIMEOUT`` seconds (libpq's ``connect_timeout``; its
default is to wait for the operating system, minutes on a filtered port), and whatever SQLAlchemy or the driver
raised becomes one line naming the URL (its password hidden). The agent prints it and exits 2.

Keeping: SQLAlchemy checks a pooled connection before handing it out (``pool_pre_ping``), so a connection the
server closed is replaced instead of failing the next call; a call that still fails because the server is gone
(``OperationalError``, ``InterfaceError``: connection refused, terminated, reset) is retried with exponential backoff
(tenacity: 0.5 s doubling to 8 s) for up to ``RETRY_SECONDS``, each wait said on the agent's log. A call is one
transaction, rolled back when the connection drops, so running it again does not apply it twice; a commit whose
acknowledgement alone was lost would be (a trial asked for twice, say), which PostgreSQL's restart has not shown.
Optuna's own retry of a failed trial (``RetryFailedTrialCallback``) is another matter: it re-runs a trial, not a
storage call.
"""

from __future__ import annotations

import logging

import optuna
import sqlalchemy.exc as sa
from sqlalchemy.engine import make_url
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

log = logging.getLogger("autoresearch")

CONNECT_TIMEOUT = 5  # seconds a PostgreSQL connection attempt may take
RETRY_SECONDS = 300.0  # how long a dropped storage is waited for before the agent gives up (a restart takes seconds)
_DROPPED = (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError)


class StorageUnavailable(Exception):
    """The storage at ``url`` (password hidden) cannot be opened; ``reason`` is the first line of why."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"--storage {url}: cannot open the study's storage: {reason}")


def storage_url(url: str) -> str:
    """The SQLAlchemy URL to open. A PostgreSQL URL without a driver (``postgresql://``) means psycopg2 to
    SQLAlchemy; the project ships psycopg 3, so such a URL is opened with ``postgresql+psycopg://``."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgresql", "postgres") else url


def shown(url: str) -> str:
    """The URL as it may be printed: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa.ArgumentError:
        return url


def open_storage(url: str, attempts: int = 5) -> RetryingStorage:
    """The storage at ``url``, every call retried while its connection is down; StorageUnavailable when it cannot
    be opened. Optuna creates its tables when it first opens a database; agents started together on a fresh
    PostgreSQL database race on that ("duplicate key ... CREATE TYPE studydirection"), so the loser tries again
    and then finds the tables made."""
    given, url = url, storage_url(url)
    engine = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        engine["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT}
    for attempt in range(1, attempts + 1):
        try:
            return RetryingStorage(optuna.storages.RDBStorage(url, engine_kwargs=engine), shown(given))
        except (sa.IntegrityError, sa.ProgrammingError):
            if attempt == attempts:
                raise
        except (sa.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError, ValueError) as exc:
            raise StorageUnavailable(shown(given), _first_line(exc)) from None
    raise AssertionError("unreachable")


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc.__cause__ or exc
    text = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return f"{type(cause).__name__}: {text}"


def dropped(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the connection to the database is down."""
    while exc is not None:
        if isinstance(exc, _DROPPED):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class RetryingStorage(optuna.storages.BaseStorage):
    """An Optuna storage whose every call is retried while the connection to the database is down (the module
    docstring says how long and why it is safe). Every public method of ``BaseStorage`` forwards to the wrapped
    storage (the loop below the class defines them)."""

    def __init__(self, inner: optuna.storages.BaseStorage, url: str = ""):
        self.inner, self.url = inner, url

    def _call(self, name: str, *args, **kwargs):
        retrying = Retrying(
            retry=retry_if_exception(dropped),
            wait=wait_exponential(multiplier=0.5, max=8.0),
            stop=stop_after_delay(RETRY_SECONDS),
            before_sleep=self._waiting,
            reraise=True,
        )
        return retrying(getattr(self.inner, name), *args, **kwargs)

    def _waiting(self, state) -> None:
        log.warning(
            "storage %s unreachable (%s); retrying in %.1f s",
            self.url or "?",
            _first_line(state.outcome.exception()),
            state.next_action.sleep,
        )

    def __getattr__(self, name: str):  # the wrapped storage's other attributes (e.g. RDBStorage.engine)
        return getattr(self.inner, name)


def _forward(name: str):
    def method(self, *args, **kwargs):
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(optuna.storages.BaseStorage, name).__doc__
    return method


for _name in [n for n in dir(optuna.storages.BaseStorage) if not n.startswith("_")]:
    setattr(RetryingStorage, _name, _forward(_name))
RetryingStorage.__abstractmethods__ = frozenset()
