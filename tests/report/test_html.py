"""The report is one self-contained HTML file: champion, lineage, source, curves, no network."""

import re
import subprocess
import sys

from swarmfactory.config import RunConfig
from swarmfactory.evidence.store import Store
from swarmfactory.swarm.coordinator import Coordinator


def test_report_is_self_contained_and_shows_the_champion(tmp_path):
    db = tmp_path / "e.db"
    store = Store(str(db))
    cfg = RunConfig.build(problems="rmsnorm", budget=3, rounds=3, compile_baselines=False,
                          remeasure_champions=False, agents="seed,knob-vectorisation,random-restart")
    run_id = Coordinator(cfg, store).run()
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "report", run_id, "-o", str(out),
                           "--store", str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert not re.search(r"""(src|href)=["']?https?://""", html), "the report must not load anything"
    assert "<svg" in html and "champion" in html and "lineage" in html
    champ = store.champion(__import__("swarmfactory.problems", fromlist=["x"]).load_problem("rmsnorm"))
    assert champ["candidate_id"] in html
    assert "void rmsnorm(" in html  # the champion's source
    show = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "show", "--store", str(db)],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and run_id in show.stdout and "champion" in show.stdout.lower()
