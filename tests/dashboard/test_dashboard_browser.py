"""The dashboard in a real headless browser (the system's Chromium driven by Playwright): the page
loads with nothing fetched from elsewhere, shows the run in progress, and shows a verdict written
into the store while it is open, without a reload. A screenshot is saved and its path printed."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from dashboard_support import kernel_run, serving, store_url


def _chromium() -> str | None:
    named = os.environ.get("SWARMFACTORY_CHROMIUM")
    if named:
        return named
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p),
                None)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e '.[test]')")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium, or set SWARMFACTORY_CHROMIUM)")
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []  # root: no user namespace
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=args, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_page_shows_the_run_in_progress_and_a_new_verdict_without_reload(browser, kind, tmp_path, capsys, request):
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict
    from swarmfactory.problems import load_problem

    with store_url(kind, tmp_path, request) as url:
        ids = kernel_run(url)
        with serving(url) as server:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            foreign, errors = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def only_this_server(route):
                if route.request.url.startswith(server.url):
                    route.continue_()
                else:
                    foreign.append(route.request.url)
                    route.abort()

            page.route("**/*", only_this_server)
            page.goto(server.url, wait_until="load")
            run_row = page.locator(f"#runs tr[data-run='{ids['run']}']")
            assert "running" in run_row.inner_text() and "6/20 evaluations" in run_row.inner_text()
            assert page.locator("#run svg").count() >= 1 and page.locator("#champions svg").count() == 1
            assert page.locator("#evaluations tr[data-evaluation]").count() == 6
            page.wait_for_function("document.getElementById('status').textContent.startsWith('live')",
                                   timeout=15_000)

            # A new verdict lands while the page is open: written by another store object (another process
            # in real use), it must appear without a reload.
            writer = Store(url)
            p = load_problem("rmsnorm")
            cand = candidate_record(p, p.render() + "\n/* times itself */\n", "llm:replay", "rewrite",
                                    parents=[ids["child"]], generation=2, run_id=ids["run"])
            eid = writer.record_verdict(p, cand, Verdict(Outcome.CHEATED, "reads the clock: clock_gettime", "static"),
                         ids["run"], "v1")
            writer.close()
            row = page.locator(f"#evaluations tr[data-evaluation='{eid}']")
            row.wait_for(timeout=15_000)
            assert "cheated" in row.inner_text() and cand["id"] in row.inner_text()
            assert "7/20 evaluations" in run_row.inner_text()
            assert "llm:replay" in page.locator("#run").inner_text()  # the scoreboard gained the agent

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            stable = Path(tempfile.gettempdir()) / f"swarmfactory-dashboard-{kind}.png"
            shutil.copyfile(shot, stable)
            with capsys.disabled():
                print(f"\ndashboard screenshot: {shot}\ndashboard screenshot (stable path): {stable}")
            assert shot.stat().st_size > 10_000

            # The new candidate's page: its lineage back to the seed and its diff against its parent.
            row.locator("a").first.click()
            page.wait_for_selector("#lineage")
            lineage = page.locator("#lineage").inner_text()
            assert all(ids[k] in lineage for k in ("child", "seed"))
            assert "+/* times itself */" in page.locator("#diff").inner_text()
            page.close()
            assert foreign == [], f"the page fetched from elsewhere: {foreign}"
            assert errors == [], errors
