"""The longest-first order of the collected tests (tests/helpers/file_costs.py), checked on a real
pytest session over a folder of small test files."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.cli_runs import REPO

CONFTEST = """
from pathlib import Path
from tests.helpers import file_costs

HERE = Path(__file__).parent

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: slow")
    config.pluginmanager.register(file_costs.Recorder(HERE / "recorded.json"), "recorder")

def pytest_collection_modifyitems(items):
    file_costs.order(items, file_costs.load(HERE / "costs.json"))
"""


def _pytest(folder, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(folder)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_longest_files_come_first_and_each_files_tests_stay_together_in_their_order(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text("def test_a2(): pass\ndef test_a1(): pass\n")
    (tmp_path / "test_b.py").write_text("import pytest, time\n@pytest.mark.slow\ndef test_b2(): time.sleep(0.3)\ndef test_b1(): pass\n")
    (tmp_path / "test_c.py").write_text("def test_c2(): pass\ndef test_c1(): pass\n")
    (tmp_path / "test_d.py").write_text("def test_d1(): pass\n")
    # c is known to be long, a short; b is not in the table but has a slow test; d is neither
    (tmp_path / "costs.json").write_text(json.dumps({"seconds": {"test_c.py": 50.0, "test_a.py": 1.0}}))
    r = _pytest(tmp_path, "-v")  # one session: the order they ran in, and what the recorder added up
    assert r.returncode == 0, r.stdout + r.stderr
    ran = [line.split()[0] for line in r.stdout.splitlines() if " PASSED" in line]
    expected = [("c", "c2"), ("c", "c1"), ("b", "b2"), ("b", "b1"), ("a", "a2"), ("a", "a1"), ("d", "d1")]
    assert ran == [f"test_{f}.py::test_{t}" for f, t in expected], r.stdout
    recorded = json.loads((tmp_path / "recorded.json").read_text())["seconds"]
    assert set(recorded) == {"test_a.py", "test_b.py", "test_c.py", "test_d.py"}
    assert recorded["test_b.py"] >= 0.3 and list(recorded)[0] == "test_b.py"  # stored longest first


def test_a_durations_report_gives_the_seconds_per_file():
    from tests.helpers.file_costs import from_durations

    lines = [
        "12.50s call     tests/apply/test_x.py::test_one[a-b]",
        "2.00s setup    tests/apply/test_x.py::test_one[a-b]",
        "1.25s teardown tests/y.py::test_two",
        "(3 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert from_durations(lines) == {"tests/apply/test_x.py": 14.5, "tests/y.py": 1.25}
