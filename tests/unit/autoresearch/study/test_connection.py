"""The storage's connection: a storage that cannot open is one line naming it (exit 2); a dropped one is retried.
A real PostgreSQL stopped and started mid-study: tests/integration/test_postgres_storage.py."""

import socket

import optuna
import pytest
import sqlalchemy.exc as sa

from autoresearch import cli
from autoresearch.study import connection
from tests.agent_support import FAKE, space_file


def _refused_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens on it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_storage_exits_2_naming_the_url_without_its_password(tmp_path, capsys):
    url = f"postgresql://agent:s3cret@127.0.0.1:{_refused_port()}/studies"
    argv = ["--space", str(space_file(tmp_path)), "--storage", url, "--command", FAKE, "--trials-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith(f"error: --storage {url.replace('s3cret', '***')}: cannot open the study's storage: ")
    assert "s3cret" not in err[0] and "Connection refused" in err[0]


def test_a_sqlite_file_that_cannot_be_made_is_named_too(tmp_path):
    with pytest.raises(connection.StorageUnavailable) as err:
        connection.open_storage(f"sqlite:///{tmp_path}/no/such/dir/study.db")
    assert err.value.url.endswith("/no/such/dir/study.db") and "unable to open database file" in err.value.reason


class Flaky:
    """A storage whose calls fail as a dropped connection does, ``drops`` times, then answer."""

    def __init__(self, drops: int):
        self.drops, self.calls = drops, 0

    def get_all_studies(self):
        self.calls += 1
        if self.calls <= self.drops:
            raise optuna.exceptions.StorageInternalError("commit failed") from sa.OperationalError(
                "SELECT 1", {}, ConnectionError("server closed the connection unexpectedly")
            )
        return ["study"]

    def get_study_id_from_name(self, name):
        self.calls += 1
        raise KeyError(name)  # not a connection problem: raised at once


def test_a_dropped_connection_is_retried_with_backoff_and_other_errors_are_not(monkeypatch, caplog):
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda seconds: None)
    flaky = Flaky(drops=3)
    storage = connection.RetryingStorage(flaky, "postgresql://db/x")
    with caplog.at_level("WARNING", logger="autoresearch"):
        assert storage.get_all_studies() == ["study"]
    assert flaky.calls == 4
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 3 and all("storage postgresql://db/x unreachable (OperationalError" in w for w in waits)
    assert [w.rsplit("retrying in ", 1)[1] for w in waits] == ["0.5 s", "1.0 s", "2.0 s"]  # doubling
    with pytest.raises(KeyError):
        storage.get_study_id_from_name("other")
    assert flaky.calls == 5  # once


def test_every_storage_call_goes_through_the_retry():
    public = {n for n in dir(optuna.storages.BaseStorage) if not n.startswith("_")}
    assert public <= {n for n, v in vars(connection.RetryingStorage).items() if callable(v)}
    assert not connection.RetryingStorage.__abstractmethods__
