"""The write guard (tests/helpers/write_guard.py) reports what a test file left behind, not a temp
folder that a command of the other xdist worker holds for a moment."""

from __future__ import annotations

import tempfile
import threading

from tests.helpers import write_guard


def test_a_temp_folder_removed_by_its_owner_is_not_reported_and_a_left_one_is(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the guard's temp dir, here this test's own
    before = write_guard.snapshot()
    moment, left = tmp_path / "gpuplan-eval-moment", tmp_path / "gpuplan-left"
    moment.mkdir()
    (moment / "x").write_text("x")
    left.mkdir()
    paths = write_guard.written(before, write_guard.snapshot())
    assert str(moment) in paths and str(left) in paths
    timer = threading.Timer(0.5, lambda: (moment / "x").unlink() or moment.rmdir())  # its owner cleans up
    timer.start()
    kept = write_guard.persisting(paths, wait_s=2.0)
    timer.join()
    assert kept == [str(left)]
