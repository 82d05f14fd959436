"""The report: a study (run by the agent on fake trials) as markdown, CSV and JSON tables, and PNG plots."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest

from autoresearch import report
from tests.unit.test_agent import MBS, REC, run_agent, space_file

COLUMNS = ["number", "status", "exit_code", MBS, REC, "optim.lr", "objective", "peak_mem_mib", "wall_time_sec",
           "proposer", "reason"]


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """Two finished grid studies over the same fake space: one maximizing throughput, one minimizing loss."""
    tmp = tmp_path_factory.mktemp("report")
    run_agent(tmp, space_file(tmp, name="fast"), "--proposer", "grid")
    run_agent(tmp, space_file(tmp, name="low", direction="minimize", metric="final_loss"), "--proposer", "grid")
    return tmp / "trials"


def read_csv(text: str) -> pd.DataFrame:
    # Only empty cells are missing: by default pandas would read the status "nan" as a missing value.
    return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])


def report_text(capsys, *argv) -> str:
    capsys.readouterr()
    assert report.main(list(argv)) == 0
    return capsys.readouterr().out


def objectives_sorted(values, maximize):
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    missing_at_end = all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values[len(present):])
    return missing_at_end and present == sorted(present, reverse=maximize)


def test_csv_parses_back_sorted_best_first(studies, capsys):
    df = read_csv(report_text(capsys, str(studies / "fast"), "--format", "csv"))
    assert list(df.columns) == COLUMNS
    assert len(df) == 16 and sorted(df["number"]) == list(range(16))
    assert objectives_sorted(df["objective"].tolist(), maximize=True)
    assert df.loc[0, "status"] == "ok" and df.loc[0, MBS] == 16 and df.loc[0, REC] == "none"
    assert set(df["status"]) >= {"ok", "oom", "nan", "pruned"}
    oom = df[df["status"] == "oom"].iloc[0]
    assert oom["exit_code"] == 10 and oom["peak_mem_mib"] > 1024 and "exceeded" in oom["reason"]
    assert set(df["proposer"]) == {"grid"}


def test_minimize_sorts_ascending(studies, capsys):
    df = read_csv(report_text(capsys, str(studies / "low"), "--format", "csv"))
    assert objectives_sorted(df["objective"].tolist(), maximize=False)
    assert df.loc[0, "optim.lr"] == 0.001


def test_json_parses_back_in_the_same_order(studies, capsys):
    rows = json.loads(report_text(capsys, str(studies / "fast"), "--format", "json"))
    csv = read_csv(report_text(capsys, str(studies / "fast"), "--format", "csv"))
    assert [r["number"] for r in rows] == csv["number"].tolist()
    assert list(rows[0]) == COLUMNS
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed and all(r["objective"] is None for r in failed)


def test_markdown_is_a_table_in_the_same_order(studies, capsys):
    text = report_text(capsys, str(studies / "fast"))
    lines = text.strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == COLUMNS
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) <= {""}
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines[2:]]
    assert all(len(row) == len(COLUMNS) for row in cells)
    csv = read_csv(report_text(capsys, str(studies / "fast"), "--format", "csv"))
    assert [int(row[0]) for row in cells] == csv["number"].tolist()


def test_storage_url_and_study_name(studies, capsys):
    url = f"sqlite:///{studies / 'low' / 'study.db'}"
    text = report_text(capsys, "--storage", url, "--study", "low", "--format", "csv")
    assert len(read_csv(text)) == 16
    with pytest.raises(SystemExit, match="does not exist"):
        report.main([str(studies / "nowhere")])


def test_plot_writes_pngs(studies, capsys, tmp_path):
    report_text(capsys, str(studies / "fast"), "--plot", "--out", str(tmp_path))
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == sorted(["objective_by_trial.png", f"objective_vs_{MBS}.png", f"objective_vs_{REC}.png",
                            "objective_vs_optim.lr.png"])
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
