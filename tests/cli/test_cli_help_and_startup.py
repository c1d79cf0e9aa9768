"""--help matches the README (defaults, --debug, help for every --json, no <bool> metavars), and
answering it loads no heavy module (torch, numpy, the engine): start-up stays fast."""

import json
import re
import subprocess
import sys

import pytest
from cli_support import clean_env, sf

HEAVY = ("torch", "numpy", "scipy", "sklearn", "transformers", "sqlalchemy", "swarmfactory.engine",
         "swarmfactory.harness")

PROBE = """
import sys
from swarmfactory.cli import main
sys.argv = ["swarmfactory", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
import json
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "numpy", "scipy", "sklearn",
      "transformers", "sqlalchemy"} or m.startswith(("swarmfactory.engine", "swarmfactory.harness")))),
      file=sys.stderr)
"""


@pytest.mark.parametrize("args", [[], ["--help"], ["run", "--help"], ["show", "--help"], ["nosuchcmd"],
                                  ["run", "--budget", "x"]])
def test_help_and_usage_errors_load_no_heavy_module(args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert loaded == [], loaded


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, swarmfactory.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def _help(*args):
    """The help text with Rich's panel borders and line wrapping taken out."""
    proc = sf(*args, "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", proc.stdout).split())


def test_help_shows_defaults_debug_and_no_type_metavars():
    top = _help()
    assert "--debug" in top and "engine" in top
    run = _help("run")
    for text in ("[default: all]", "[default: default]", "[default: 2]", "[default: 20]", "[default: 0]",
                 "[default: $SWARMFACTORY_STORE, else .swarmfactory/evidence.db]", "--seed", "--debug",
                 "--wide", "Ctrl-C"):
        assert text in run, text
    assert "[default: none: give --budget and/or --time]" in run
    for cmd in (["problems"], ["eval"], ["run"], ["show"], ["report"], ["cases"], ["verify"], ["engine"],
                ["engine", "serve"], ["engine", "generate"], ["engine", "bench"]):
        text = _help(*cmd)
        assert "<bool>" not in text and "list[" not in text, (cmd, text)
        if cmd[0] != "engine":
            assert "--debug" in text, cmd
        if "--json" in text:
            assert "JSON" in text.split("--json", 1)[1].split(" --", 1)[0], (cmd, text)  # it says what it does


def test_help_defaults_are_the_config_defaults():
    from swarmfactory.cli import RUN_DEFAULTS
    from swarmfactory.commandline import DEFAULT_STORE
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import DEFAULT_PATH

    assert DEFAULT_STORE == DEFAULT_PATH
    fields = RunConfig.model_fields
    for key, value in RUN_DEFAULTS.items():
        default = fields[key].get_default(call_default_factory=True)
        assert (",".join(default) if isinstance(default, list) else default) == value, key


def test_problems_listing_counts_valid_configurations():
    from swarmfactory.problems import load_problem

    proc = sf("problems", "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)["problems"]}
    att = load_problem("attention_decode")
    assert rows["attention_decode"]["design_space"] < rows["attention_decode"]["design_space_total"]
    import itertools

    valid = sum(att.valid_knobs(dict(zip(att.knobs, c))) for c in itertools.product(*att.knobs.values()))
    assert rows["attention_decode"]["design_space"] == valid
    table = sf("problems", env={"COLUMNS": "200"}).stdout
    assert f"{valid} valid of {rows['attention_decode']['design_space_total']} configs" in table


@pytest.mark.parametrize("args", [["engine"], ["engine", "--help"], ["engine", "serve", "--help"],
                                  ["engine", "bench", "--help"]])
def test_engine_help_loads_no_torch(args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "numpy")], loaded


def test_engine_help_shows_the_config_defaults_and_debug():
    from swarmfactory.engine.config import EngineConfig

    serve = _help("engine", "serve")
    fields = EngineConfig.model_fields
    for field in ("weights", "max_batch", "max_seq_len"):
        assert f"(default {fields[field].default})" in serve, field
    for cmd in ("serve", "generate", "calibrate", "bench"):
        assert "--debug" in _help("engine", cmd), cmd
