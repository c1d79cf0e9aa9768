"""The dashboard over a real store (SQLite; PostgreSQL on the tests' server) and a real
HTTP server on 127.0.0.1: what each endpoint shows is what was recorded, bad input gets 400/404/405
with a message, the server cannot write, and no password reaches a page."""

import json
import re
import signal
import subprocess
import time

import pytest
from dashboard_support import clean_env, engine_run, entry_point, get, get_json, kernel_run, serving, sf, store_url
from sqlalchemy import text


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def filled(request, tmp_path_factory):
    with store_url(request.param, tmp_path_factory.mktemp("dash"), request) as url:
        ids = kernel_run(url)
        ids["engine"] = engine_run(url)
        with serving(url) as server:
            yield server, ids, url


def test_runs_show_progress_and_the_run_its_verdicts_and_scoreboard(filled):
    server, ids, _ = filled
    runs = get_json(server.url, "/api/runs")
    assert runs["total"] == 2
    kernel = next(r for r in runs["runs"] if r["id"] == ids["run"])
    assert kernel["status"] == "running" and kernel["evaluations"] == ids["search_evaluations"]
    assert kernel["progress"]["done"] == 6 and kernel["progress"]["budget"] == 20
    assert kernel["progress"]["fraction"] == pytest.approx(6 / 20)
    run = get_json(server.url, f"/api/runs/{ids['run']}")
    assert run["verdicts"] == [{"problem": "rmsnorm", "total": 6, "outcomes": {
        "faster": 3, "not_faster": 1, "wrong": 1, "build_failed": 1}}]
    board = {a["agent"]: a for a in run["scoreboard"]}
    assert board["knob-unrolling"]["champions"] == 1 and board["crossover"]["champions"] == 1
    assert board["seed"]["faster"] == 1 and board["knob-threading"]["correct"] == 1
    assert board["model-guided"]["outcomes"] == {"wrong": 1} and board["model-guided"]["correct"] == 0
    page = get(server.url, f"/runs/{ids['run']}")[2].decode()
    assert "6/20 evaluations" in page and 'data-running="1"' in page and "<svg" in page
    for cid in (ids["seed"], ids["child"], ids["grand"], ids["bad"]):
        assert cid in page


def test_evaluations_page_newest_first_with_a_keyset(filled):
    server, ids, _ = filled
    first = get_json(server.url, f"/api/evaluations?run={ids['run']}&limit=4")
    evs = first["evaluations"]
    assert len(evs) == 4 and [e["id"] for e in evs] == sorted((e["id"] for e in evs), reverse=True)
    rest = get_json(server.url, f"/api/evaluations?run={ids['run']}&limit=4&before={first['next_before']}")
    assert rest["next_before"] is None and len(evs) + len(rest["evaluations"]) == 6
    wrong = get_json(server.url, "/api/evaluations?outcome=wrong")["evaluations"]
    assert [e["id"] for e in wrong] == [ids["wrong_eval"]] and "7x1023" in wrong[0]["detail"]


def test_champion_speedup_over_time(filled):
    server, ids, _ = filled
    rows = get_json(server.url, "/api/champions?problem=rmsnorm")["champions"]
    assert [(r["candidate_id"], r["speedup"]) for r in rows] == [(ids["seed"], 1.2), (ids["child"], 1.9),
                                                                 (ids["grand"], 2.4)]
    page = get(server.url, "/")[2].decode()
    champions = page.split("id='champions'")[1].split("</section>")[0]
    assert "<svg" in champions and "rmsnorm (2.40x)" in champions


def test_candidate_shows_lineage_diff_and_evidence(filled):
    server, ids, _ = filled
    info = get_json(server.url, f"/api/candidates/{ids['grand']}")
    assert [a["id"] for a in info["ancestors"]] == [ids["grand"], ids["child"], ids["seed"]]
    assert "+/* grandchild */" in info["diff"] and info["best_speedup"] == pytest.approx(2.4)
    ev = info["evaluations"][0]
    assert ev["outcome"] == "faster" and len(ev["shapes"]) >= 1 and ev["ci_low"] == pytest.approx(2.4 * 0.95)
    child = get_json(server.url, f"/api/candidates/{ids['child']}")
    assert [k["id"] for k in child["children"]] == [ids["grand"]]
    assert "+    /* unrolled by the test */" in child["diff"]
    page = get(server.url, f"/candidates/{ids['bad']}")[2].decode()
    assert "7x1023" in page and "wrong" in page  # the failing case
    assert "sk-do-not-show" not in page and "[hidden]" in page  # secret-looking evidence is hidden
    page = get(server.url, f"/candidates/{ids['grand']}")[2].decode()
    assert "class='add'>+/* grandchild */" in page and "speedup [95% CI]" in page


def test_cases_lessons_and_engine_runs(filled):
    server, ids, _ = filled
    cases = get_json(server.url, "/api/cases")
    assert cases["total"] == 1
    case = cases["cases"][0]
    assert case["found_by"] == "adversary" and case["broke_candidate"] == ids["bad"]
    assert case["shape"] == {"rows": 7, "cols": 1023}
    lessons = get_json(server.url, "/api/lessons")["lessons"]
    assert [(x["status"], x["text"][:16]) for x in lessons] == [("active", "rmsnorm: unroll ")]
    eng = get_json(server.url, "/api/engine")["runs"]
    assert len(eng) == 1 and eng[0]["model"] == "SmolLM2-135M-Instruct-Q4_1.gguf"
    tuned = next(d for d in eng[0]["designs"] if d["candidate_id"] == ids["engine"]["tuned"])
    assert tuned["ratio"] == pytest.approx(1.18)
    assert {(lv["concurrency"], lv["output_tok_s"]) for lv in tuned["serving"]} == {(1, 117.0), (16, 731.75)}
    page = get(server.url, "/")[2].decode()
    for section in ("id='cases'", "id='lessons'", "id='engine'"):
        assert section in page
    assert "731.8" in page and "broke model-guided" in page and "/models/" not in page
    engine = page.split("id='engine'")[1].split("</section>")[0]
    assert "<svg" in engine and ">1.18x</text>" in engine  # the tuned design's ratio, drawn


@pytest.mark.parametrize("path,status,message", [
    ("/runs/nosuchrun", 404, "no run 'nosuchrun'"),
    ("/api/runs/nosuchrun", 404, "no run 'nosuchrun'"),
    ("/candidates/0000", 404, "no candidate '0000'"),
    ("/api/candidates/0000", 404, "no candidate '0000'"),
    ("/api/evaluations?run=nosuchrun", 404, "no run 'nosuchrun'"),
    ("/api/nothing", 404, "no endpoint"),
    ("/api/evaluations?limit=abc", 400, "not an integer"),
    ("/api/evaluations?limit=0", 400, "out of range"),
    ("/api/evaluations?limit=100000", 400, "out of range"),
    ("/api/evaluations?before=-3", 400, "out of range"),
    ("/api/evaluations?outcome=great", 400, "not a verdict"),
    ("/api/evaluations?sort=id", 400, "unknown query parameter 'sort'"),
    ("/api/runs?limit=1&limit=2", 400, "given 2 times"),
    ("/?runs_offset=x", 400, "not an integer"),
    ("/?fragment=yes", 400, "must be 0 or 1"),
])
def test_bad_input_is_answered_with_a_status_and_a_message(filled, path, status, message):
    server, _, _ = filled
    got, ctype, body = get(server.url, path)
    assert got == status
    if path.startswith("/api/"):
        assert ctype == "application/json" and message in json.loads(body)["error"]
    else:
        assert ctype.startswith("text/html") and message.replace("'", "&#x27;") in body.decode()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_only_get_and_head_are_allowed(filled, method):
    server, ids, _ = filled
    status, _, body = get(server.url, f"/api/runs/{ids['run']}", method=method)
    assert status == 405 and "read-only" in json.loads(body)["error"]
    status, ctype, body = get(server.url, "/", method="HEAD")
    assert status == 200 and ctype.startswith("text/html") and body == b""


def test_the_server_cannot_write_to_the_store(filled):
    server, ids, url = filled
    with server.dashboard.engine.connect() as c, pytest.raises(Exception, match="(?i)read.?only|query_only|readonly"):
        c.execute(text("UPDATE runs SET status = 'finished'"))
        c.commit()
    assert get_json(server.url, f"/api/runs/{ids['run']}")["status"] == "running"


def test_no_password_is_shown(filled):
    server, _, url = filled
    from sqlalchemy.engine import make_url

    page = get(server.url, "/")[2].decode()
    password = make_url(server.dashboard.store.url).password
    label = re.search(r"store ([^<]+)</span>", page).group(1)
    if password:
        assert f":{password}@" not in page and ":***@" in label
    for path in ("/api/runs", "/api/engine", "/api/lessons"):
        assert f":{password}@" not in get(server.url, path)[2].decode()
    from swarmfactory.dashboard.server import safe_url

    assert safe_url("postgresql+psycopg://alice:s3cr%40t@db:5432/ev") == "postgresql+psycopg://alice:***@db:5432/ev"


def test_the_page_updates_itself_without_a_network_fetch(filled):
    server, _, _ = filled
    page = get(server.url, "/")[2].decode()
    assert "/api/version" in page and "fragment=1" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "nothing may load from elsewhere"
    version = get_json(server.url, "/api/version")["version"]
    assert version == get_json(server.url, "/api/version")["version"]
    fragment = get(server.url, "/?fragment=1")[2].decode()
    assert fragment.startswith("<section id='runs'>") and "<html" not in fragment


def test_cli_help_names_the_options():
    proc = sf("dashboard", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0
    for needle in ("--store", "--host", "--port", "--debug", "127.0.0.1", "8050", "read-only"):
        assert needle in proc.stdout, needle


def test_cli_reports_a_missing_store_and_a_bad_port(tmp_path):
    proc = sf("dashboard", "--store", tmp_path / "missing.db")
    assert proc.returncode == 2 and "no evidence store at" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "missing.db").exists()
    db = tmp_path / "e.db"
    kernel_run(str(db))
    proc = sf("dashboard", "--store", db, "--port", "70000")
    assert proc.returncode == 2 and "not a TCP port" in proc.stderr


def test_cli_serves_until_interrupted_and_reports_a_busy_port(tmp_path):
    db = tmp_path / "e.db"
    ids = kernel_run(str(db))
    before = db.stat().st_mtime_ns
    # a shell's background job inherits SIGINT ignored; a terminal's Ctrl-C reaches a default one
    proc = subprocess.Popen([entry_point(), "dashboard", "--store", str(db), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/)", line).group(1)
        assert get_json(url, f"/api/runs/{ids['run']}")["id"] == ids["run"]
        port = url.rsplit(":", 1)[1].strip("/")
        busy = sf("dashboard", "--store", db, "--port", port)
        assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        _, errors = proc.communicate(timeout=60)  # drains both pipes: a full one must not hold it up
    assert proc.returncode == 0, errors
    assert db.stat().st_mtime_ns == before  # nothing was written


def test_shared_chart_module_draws_both_pages():
    from swarmfactory.report import charts, html

    assert html.curve_svg is charts.curve_svg
    svg = charts.stacked_bars_svg([("rmsnorm", {"faster": 3, "wrong": 1}), ("softmax", {"cheated": 2})])
    assert svg.count("<rect") == 3 + 3 and ">4</text>" in svg and ">cheated</text>" in svg
    line = charts.timeline_svg({"rmsnorm": [(time.time() - 60, 1.2), (time.time(), 2.5)]})
    assert "rmsnorm (2.50x)" in line and line.count("<circle") == 2
    assert "no verdicts yet" in charts.stacked_bars_svg([])


def test_an_optimize_run_shows_its_model_and_the_stage_it_is_at(tmp_path, request):
    """``swarmfactory optimize`` records one run holding its plan (optimize.py); the runs list
    names its model and stage, and the kernel run it is in."""
    from swarmfactory.evidence.store import Store

    with store_url("sqlite", tmp_path, request) as url:
        st = Store(url)
        st.create_run({"kind": "optimize", "config": {"model": "/models/gemma-3-270m-q4_k_m.gguf", "time_s": 1800.0},
                       "stage": "kernels", "runs": [{"problem": "q8_0_matmul.gemma-3-270m-q4_k_m", "pass": 1,
                                                     "budget_s": 478.0, "run_id": "ab170e78", "status": "running"}]})
        st.close()
        with serving(url) as server:
            run = get_json(server.url, "/api/runs")["runs"][0]
            assert run["progress"]["kind"] == "optimize" and run["progress"]["time_s"] == 1800.0
            assert run["progress"]["problems"] == ["gemma-3-270m-q4_k_m.gguf: stage kernels (pass 1: "
                                                   "q8_0_matmul.gemma-3-270m-q4_k_m, run ab170e78)"]
            page = get(server.url, "/")[2].decode()
            assert "stage kernels (pass 1: q8_0_matmul.gemma-3-270m-q4_k_m, run ab170e78)" in page
