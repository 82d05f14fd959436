"""The study's answer: the end block the agent prints, report.html's headline (rendered by a real Chromium), and the
lines and tables a person reads (fake trials)."""

import math
import re
import shlex
import shutil
import statistics
import subprocess
from html.parser import HTMLParser

import pytest
from scipy import stats

from autoresearch.report import headline as hl
from autoresearch.report.html import FIRST_PLOTS, write_report
from autoresearch.report.plots import pareto_front
from autoresearch.study import confirm
from tests.agent_support import FAKE, MBS, REC, load, run_agent, space_file

PARAMS = {
    MBS: {"type": "choice", "values": [8, 16, 24], "memory": "up"},
    REC: {"type": "choice", "values": ["full", "none"], "memory": "up"},
    "optim.lr": {"type": "choice", "values": [0.001, 0.003]},  # the fake's throughput ignores it: ties
}
BASELINE = {MBS: 8, REC: "full", "optim.lr": 0.001}


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    """A study with a baseline and a confirmation, the fake's run-to-run noise 2%: every config of the grid."""
    tmp = tmp_path_factory.mktemp("headline")
    space = space_file(tmp, params=PARAMS, baseline=BASELINE, fixed={"fake.noise": 0.02, "seed": 3})
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_agent(tmp, space, "--proposer", "grid", "--trials", "12", "--repeats", "3", confirm=2)
    assert code == 0
    return tmp, load(tmp), out.getvalue()


def test_every_progress_line_fits_120_columns_and_says_what_changed_from_the_baseline(study_run):
    _, study, out = study_run
    progress = out.split("\nstopped: ")[0].splitlines()
    assert all(len(line) <= 120 for line in progress), max(progress, key=len)
    first = next(line for line in progress if line.startswith("trial    0 "))
    assert first.startswith("trial    0 ok            the baseline: tokens_per_sec=")
    for t in study.trials[1:]:
        if t.user_attrs["status"] == "ok" and "confirmation_of" not in t.user_attrs:
            (line,) = [
                x for x in out.replace("\n" + " " * 11, " ").splitlines() if x.startswith(f"trial {t.number:4d} ")
            ]
            changed = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in t.params.items() if v != BASELINE[k])
            assert f" {changed}: tokens_per_sec=" in line and "x the baseline" in line


def test_the_end_block_names_the_pick_with_its_gain_over_the_baseline_and_its_interval(study_run):
    tmp, study, out = study_run
    h = hl.headline(study, tmp / "trials" / "fake", shlex.split(FAKE))  # the agent's trial command: no export
    v = confirm.recorded_verdict(study)
    pick = v.pick
    assert h.trial == pick.trial and h.kind in ("winner", "tied")
    # by hand: the pick's confirmation runs against every ok run of the baseline's config (search + confirmation)
    base_runs = [t.value for t in study.trials if t.params == BASELINE and t.user_attrs.get("status") == "ok"]
    assert len(base_runs) >= 2 and v.baseline.values == pytest.approx(base_runs)
    assert h.gain == pytest.approx(statistics.fmean(pick.values) / statistics.fmean(base_runs))
    a, b = [math.log(x) for x in pick.values], [math.log(x) for x in base_runs]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    diff = statistics.fmean(a) - statistics.fmean(b)
    assert h.interval == pytest.approx((math.exp(diff - half), math.exp(diff + half)))
    assert h.interval[0] < h.gain < h.interval[1]
    block = hl.text(h)
    assert out.rstrip().endswith(block)  # the agent's last words
    assert f"{h.gain:.2f}x the baseline's" in block and "95% interval" in block and "peak memory" in block
    assert "reproduce:" in block and all(len(line) <= 120 for line in block.splitlines())


def test_of_configs_tied_the_pick_changes_least_from_the_baseline():
    v = confirm.Verdict([], maximize=True, repeats=3)
    a = confirm.Confirmed(3, {MBS: 24, REC: "none"}, 10.0, [10.0, 10.2], peaks=[300.0])
    b = confirm.Confirmed(5, {MBS: 8, REC: "none"}, 10.1, [10.1, 10.0], peaks=[500.0])
    c = confirm.Confirmed(7, {MBS: 8, REC: "full"}, 9.9, [9.8, 10.3], peaks=[400.0])
    v.configs, v.tied = [a, b, c], [3, 5, 7]
    v.changes = {3: {MBS: 24, REC: "none"}, 5: {REC: "none"}, 7: {REC: "none"}}
    assert v.pick is c  # one change each for 5 and 7; 7 holds less memory
    v.winner = a
    assert v.pick is a


def test_the_pareto_front_by_hand():
    # (memory, objective): 1 beats 0 on both; 3 is better than 1 but needs more memory; 2 is beaten by 1
    points = [(100.0, 5.0), (90.0, 6.0), (120.0, 5.5), (150.0, 9.0), (150.0, 8.0)]
    assert pareto_front(points, maximize=True) == [1, 3]
    assert pareto_front(points, maximize=False) == [1, 0]


class _Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.order, self.images, self.text, self.inside = [], [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("section", "table", "h2") or attrs.get("id"):
            self.order.append(attrs.get("id") or tag)
        if tag == "img":
            self.images.append(attrs.get("alt"))

    def handle_data(self, data):
        self.text.append(data)


def test_report_html_opens_with_the_headline_and_the_plots_a_person_asks_for(study_run):
    tmp, study, _ = study_run
    study_dir = tmp / "trials" / "fake"
    write_report(study, study_dir)
    page = (study_dir / "report.html").read_text()
    dom = _Dom()
    dom.feed(page)
    assert dom.order.index("headline") < dom.order.index("trials")  # the answer before any table
    assert "<pre>" not in page.split("id='headline'")[0]
    assert dom.images[: len(FIRST_PLOTS)] == list(FIRST_PLOTS)
    h = hl.headline(study, study_dir)
    assert hl.title(h) in "".join(dom.text)
    header = re.search(r"<table[^>]*id=\"trials\".*?<thead>(.*?)</thead>", page, re.S).group(1)
    assert "optim.lr" in header and MBS in header and "vs_baseline" in header  # they vary
    assert "fake.sleep" not in header and "exit_code" not in header  # fixed, or for the CSV


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_a_real_browser_renders_report_html_with_its_headline(study_run, tmp_path):
    study_tmp, study, _ = study_run
    study_dir = study_tmp / "trials" / "fake"
    write_report(study, study_dir)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]
    done = subprocess.run(
        [CHROMIUM, *flags, (study_dir / "report.html").as_uri()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout  # the DOM after the browser parsed and laid it out
    section = re.search(r'<section id="headline">(.*?)</section>', dom, re.S)
    assert section is not None, dom[:2000]
    h = hl.headline(study, study_dir)
    assert hl.title(h).replace("'", "&#39;") in section.group(1) or hl.title(h) in section.group(1)
    assert dom.count("<img") >= len(FIRST_PLOTS)
