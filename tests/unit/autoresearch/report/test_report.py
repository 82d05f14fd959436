"""The report: a study (run by the agent on fake trials) as markdown, CSV and JSON tables, the cost ledger, PNG
plots and an HTML page."""

from __future__ import annotations

import io
import json
import math
import re
from html.parser import HTMLParser

import optuna
import pandas as pd
import pytest

from autoresearch.records import TrialRow
from autoresearch.report import plots
from autoresearch.report.__main__ import main as report_main
from autoresearch.report.table import brief, param_names, study_table
from autoresearch.study import ledger, storage
from tests.agent_support import ESTIMATOR, MBS, REC, run_agent, space_file

COLUMNS = [
    "number",
    "status",
    "exit_code",
    MBS,
    REC,
    "optim.lr",
    "objective",
    "vs_baseline",
    "mem_vs_baseline",
    "peak_mem_mib",
    "wall_time_sec",
    "ranks",
    "device_sec",
    "startup_sec",
    "compile_sec",
    "steps_sec",
    "llm_tokens",
    "llm_usd",
    "proposer",
    "reason",
]
PNGS = [
    "objective_by_trial.png",
    f"objective_vs_{MBS}.png",
    f"objective_vs_{REC}.png",
    "objective_vs_optim.lr.png",
    "best_vs_device_time.png",
    "objective_predicted_vs_measured.png",
    "memory_predicted_vs_measured.png",
    "objective_vs_memory.png",
    "parallel_coordinates.png",
]


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """Two finished grid studies over the same fake space: one maximizing throughput (with the fake's memory
    estimator, so that trials carry predicted peaks), one minimizing loss."""
    tmp = tmp_path_factory.mktemp("report")
    run_agent(tmp, space_file(tmp, name="fast"), "--proposer", "grid", estimator=ESTIMATOR)
    run_agent(tmp, space_file(tmp, name="low", direction="minimize", metric="final_loss"), "--proposer", "grid")
    return tmp / "trials"


def read_csv(text: str) -> pd.DataFrame:
    # Only empty cells are missing: by default pandas would read the status "nan" as a missing value.
    return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])


def report_text(capsys, *argv) -> str:
    capsys.readouterr()
    assert report_main(list(argv)) == 0
    return capsys.readouterr().out


def objectives_sorted(values, maximize):
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    missing_at_end = all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values[len(present) :])
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
    table, _, rest = text.strip().partition("\n\n")  # the table, then the study's ledger
    assert rest.startswith("ledger: 16 trials, ")
    lines = table.splitlines()
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
        report_main([str(studies / "nowhere")])


def test_plot_writes_pngs(studies, capsys, tmp_path):
    report_text(capsys, str(studies / "fast"), "--plot", "--out", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PNGS)
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def study_of(studies, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{studies / name / 'study.db'}")


def test_ledger_columns_match_the_study(studies, capsys):
    """Each CSV row's ledger is ranks x the wall time the study recorded; skipped proposals cost nothing; the
    printed study ledger sums the rows."""
    df = read_csv(report_text(capsys, str(studies / "fast"), "--format", "csv"))
    trials = {t.number: t for t in study_of(studies, "fast").trials}
    for row in df.itertuples(index=False):
        t = trials[row.number]
        if row.status == "pruned":
            assert (row.device_sec, row.ranks, row.llm_tokens) == (0.0, 0, 0)
        else:  # the fake trial runs on parallel.tp ranks (1 here); wall_time_sec is the runner's, from the study
            assert row.ranks == 1 and row.device_sec == pytest.approx(t.user_attrs["wall_time_sec"], abs=1e-3)
            assert math.isnan(row.startup_sec)  # no fake.sleep: the fake reports no phases, none invented
    text = report_text(capsys, str(studies / "fast"))
    # the CSV rounds each row and the ledger prints one decimal of the unrounded sum: equal to half a last digit
    printed = float(re.search(r"= ([0-9.]+) device-s \(ranks x wall time\)", text).group(1))
    assert printed == pytest.approx(df["device_sec"].sum(), abs=0.05 + 1e-3 * len(df))
    assert f"{(df['status'] == 'pruned').sum()} skipped without running" in text


class Tables(HTMLParser):
    """The cells of an HTML page's table with a given id, row by row (pandas.read_html needs lxml or bs4)."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.inside, self.rows, self.ids, self.images = table_id, False, [], [], 0
        self.cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""
        elif tag == "div" and attrs.get("class") == "trial":
            self.ids.append(attrs["id"])
        elif tag == "img" and attrs.get("src", "").startswith("data:image/png;base64,iVBORw0KGgo"):
            self.images += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th"):
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_html_report_holds_the_studys_trials_the_ledger_and_the_plots(studies, capsys, tmp_path):
    report_text(capsys, str(studies / "fast"), "--html", "--out", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*PNGS, "report.html"])
    page = (tmp_path / "report.html").read_text()
    parsed = Tables("trials")
    parsed.feed(page)
    header, *cells = parsed.rows
    study = study_of(studies, "fast")
    rows = storage.trial_rows(study)
    # the runs a person reads: the params that vary, the measured and the ratios (trials.csv keeps every column)
    assert header == list(brief(study_table(study, rows), param_names(study, rows)).columns)
    assert header[:2] == ["number", "status"] and MBS in header and "exit_code" not in header
    assert parsed.images == len(PNGS)
    by_number = {t.number: t for t in study.trials}
    assert sorted(int(r[0]) for r in cells) == sorted(by_number) and len(cells) == 16
    for r in cells:
        t = by_number[int(r[0])]
        assert r[1] == t.user_attrs["status"]
        objective = t.user_attrs.get("objective")  # None for failures, absent for skipped proposals
        assert (
            (r[header.index("objective")] == "")
            if objective is None
            else float(r[header.index("objective")]) == pytest.approx(objective, rel=1e-3)  # four digits
        )
    assert parsed.ids == [f"trial-{n}" for n in sorted(by_number)]  # every trial explained, in trial order
    totals = ledger.format_totals(ledger.study_totals(storage.trial_rows(study)))
    assert f"<pre>{totals}</pre>" in page
    # A fake trial's config is not the core's: its explanation says so rather than inventing a breakdown.
    assert page.count("no memory breakdown: not a config the core knows (fake.sleep") == 16
    assert "measured peak " in page and "calibrated prediction " in page


def test_best_so_far_per_proposer_against_device_time():
    led = lambda seconds: {"device_sec": seconds}  # noqa: E731
    rows = [
        TrialRow(number=i, state="COMPLETE", status="ok", proposer=who, objective=value, ledger=spent)
        for i, (who, value, spent) in enumerate(
            [
                ("tpe", 5.0, led(2.0)),
                ("claude", None, led(1.0)),
                ("tpe", 3.0, led(0.0)),
                ("claude", 7.0, led(4.0)),
                ("tpe", None, None),
            ]
        )
    ]  # the last still running: not on the curves
    curves = plots.best_so_far_curves(rows, maximize=True)
    assert curves["all"][0] == [2.0, 3.0, 3.0, 7.0] and curves["all"][1] == [5.0, 5.0, 5.0, 7.0]
    assert curves["tpe"] == ([2.0, 2.0], [5.0, 5.0])
    assert curves["claude"][0] == [1.0, 5.0] and math.isnan(curves["claude"][1][0]) and curves["claude"][1][1] == 7.0
    assert plots.best_so_far_curves(rows, maximize=False)["tpe"] == ([2.0, 2.0], [5.0, 3.0])
    # a confirmation run is not the search's best (nor its cost); the machine's measuring comes before every trial
    lucky = TrialRow(number=5, state="COMPLETE", status="ok", proposer="confirm", objective=9.0, ledger=led(3.0))
    lucky.confirmation_of = 3
    curves = plots.best_so_far_curves([*rows, lucky], maximize=True, start=10.0)
    assert curves["all"] == ([12.0, 13.0, 13.0, 17.0], [5.0, 5.0, 5.0, 7.0]) and "confirm" not in curves


def test_a_failed_runs_line_says_what_the_agent_knew_before_it():
    from autoresearch.records import Status
    from autoresearch.report.console import trial_line
    from autoresearch.run.session import TrialEvent

    def line(event):
        text = trial_line(event, "tokens_per_sec")
        assert all(len(part) <= 120 for part in text.splitlines())  # wrapped, not cut
        return " ".join(text.split())

    knew = "predicted peak 812 MiB, failure probability 0.07"
    event = TrialEvent(number=3, status=Status.OOM, params={"mbs": 8}, reason="rank 0 peak 1197 MiB", wall_time=2.0)
    assert line(event).endswith("rank 0 peak 1197 MiB")
    event.knew = knew
    assert line(event).endswith(f"rank 0 peak 1197 MiB [before it ran: {knew}]")
    event.status = Status.OK  # an ok run's line needs no excuse
    assert "before it ran" not in line(event)
