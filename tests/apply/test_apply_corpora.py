"""The shipped corpora are exactly what tests/helpers/apply_corpora.py generates."""

from __future__ import annotations

import os

from tests.helpers.apply_corpora import DATA_DIR, expected_files


def test_shipped_corpora_match_their_generator():
    for name, text in expected_files().items():
        with open(os.path.join(DATA_DIR, name), encoding="utf-8", newline="") as f:
            assert f.read() == text, f"specs/data/{name} differs: run python tests/helpers/apply_corpora.py"


def test_sentiment_has_two_balanced_labels():
    import csv

    with open(os.path.join(DATA_DIR, "sentiment.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 400
    assert sum(r["label"] == "positive" for r in rows) == 200
