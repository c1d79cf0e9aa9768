"""The report is one self-contained HTML file: champion, lineage, source, curves, no network."""

import re
import subprocess
import sys
from pathlib import Path

from swarmfactory.evidence.store import Store
from swarmfactory.swarm.summary import summarize

PROBLEM = Path(__file__).parents[1] / "swarm" / "data" / "rmsnorm_torch_yardstick.py"


def test_report_is_self_contained_and_shows_the_champion(tmp_path):
    from swarmfactory.config import RunConfig
    from swarmfactory.swarm.coordinator import Coordinator

    db = tmp_path / "e.db"
    store = Store(str(db))
    # rmsnorm timed against torch only: a template may not beat the engine's own C in three tries
    cfg = RunConfig.build(problems=str(PROBLEM), budget=3, rounds=3, compile_baselines=False,
                          remeasure_champions=False, agents="seed,knob-vectorisation,random-restart")
    run_id = Coordinator(cfg, store).run()
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "report", run_id, "-o", str(out),
                           "--store", str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert not re.search(r"""(src|href)=["']?https?://""", html), "the report must not load anything"
    assert "<svg" in html and "champion" in html and "lineage" in html
    champ = store.champion(__import__("swarmfactory.problems", fromlist=["x"]).load_problem(str(PROBLEM)))
    assert champ.candidate_id in html
    assert "void rmsnorm(" in html  # the champion's source
    show = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "show", "--store", str(db)],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and run_id in show.stdout and "champion" in show.stdout.lower()


def _recorded_run(db):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
    from cli_support import recorded_run

    return recorded_run(db)


def test_chart_has_axes_ticks_and_starts_at_evaluation_1():
    from swarmfactory.report.html import curve_svg

    svg = curve_svg([[1, None], [2, None], [3, 1.4], [4, 1.4], [5, 2.6]] + [[i, 2.6] for i in range(6, 31)])
    y_ticks = [float(v) for v in re.findall(r'text-anchor="end">([\d.]+)x</text>', svg)]
    assert y_ticks[0] == 0 and len(y_ticks) >= 4 and max(y_ticks) >= 2.6  # values on the y axis
    x_ticks = [int(v) for v in re.findall(r'text-anchor="middle">(\d+)</text>', svg)]
    assert x_ticks[0] == 1 and x_ticks[-1] == 30 and len(x_ticks) >= 4
    assert min(int(v) for v in re.findall(r'font-size="(\d+)"', svg)) >= 12  # legible labels
    start = re.search(r'<path d="M([\d.]+),([\d.]+)', svg)
    x1 = re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="[\d.]+" y2="[\d.]+" stroke="#444"/><text[^>]*>1</text>',
                   svg)
    assert start and x1 and float(start.group(1)) == float(x1.group(1))  # the line starts at evaluation 1
    assert "evaluation" in svg and "best speedup" in svg


def test_chart_title_and_champion_sentence_state_the_same_figures(tmp_path):
    db = tmp_path / "e.db"
    run_id = _recorded_run(db)
    out = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "report", run_id, "-o", str(out),
                           "--store", str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    s = summarize(Store(str(db), create=False), run_id)
    for p in s["problems"]:
        c = p["champion"]
        section = page.split(f"<h2>{p['problem']}</h2>", 1)[1].split("<h2>", 1)[0]
        title = re.search(r'<p class="chart">(.*?)</p>', section).group(1)
        sentence = re.search(r"<p><b>champion</b>(.*?)</p>", section).group(1)
        figure = f"{c['speedup']:.2f}x [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
        assert figure in title and figure in sentence  # the same re-measured figure in both
        assert "re-measured" in title and "re-measured" in sentence
        peak = max(v for _, v in p["best_curve"] if v is not None)
        assert f"peak {peak:.2f}x as measured during the search" in title  # and which is which
        assert f">{c['speedup']:.2f}x</text>" in section  # the champion's marker on the chart
        assert "{" not in section.split("<h3>lineage</h3>")[0]  # shapes as 128x576, not dicts
