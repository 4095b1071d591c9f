"""gpuplan/clusters/yaml_text.py: what it writes, PyYAML reads back as the same data."""

import pytest
import yaml

from gpuplan.clusters.yaml_text import dump, dump_all

CASES = [
    {"apiVersion": "batch/v1", "kind": "Job", "spec": {"completions": 2, "suspend": False, "x": None, "f": 0.25}},
    {"on": "yes", "no": "off", "y": "8", "n": "null", "~": "~", "true": "true"},  # YAML 1.1 booleans and nulls stay strings
    {"limits": {"nvidia.com/gpu": "8", "kueue.x-k8s.io/queue-name": "team a", "a key: with colon": "#not a comment"}},
    {"empty": {}, "none": [], "nested": [[1, 2], [], {}, [{"a": 1}]], "list": [{"name": "x", "value": "1"}, {"z": {}}]},
    {"script": 'set -e\n\n  indented line\necho "$X" | head -n1\n', "no_newline": "a\nb", "unicode": "é – ✓"},
    {"trailing": "line \nnext\n", "tab": "a\tb\nc\n", "blank_end": "a\n\n", "lead": " space first\nx\n", "cr": "a\r\nb"},
]


@pytest.mark.parametrize("data", CASES)
def test_dump_reads_back_equal(data):
    assert yaml.safe_load(dump(data)) == data


def test_scripts_are_literal_blocks_and_strings_are_quoted():
    text = dump({"run": "set -e\necho hi\n", "num": 2, "s": "2"})
    assert text == 'run: |\n  set -e\n  echo hi\nnum: 2\ns: "2"\n'


def test_dump_all_is_one_stream_of_documents():
    docs = [{"kind": "Service"}, {"kind": "Job", "spec": {"parallelism": 2}}]
    assert list(yaml.safe_load_all(dump_all(docs))) == docs


def test_unknown_types_are_refused():
    with pytest.raises(TypeError, match="cannot write set"):
        dump({"a": {1, 2}})
