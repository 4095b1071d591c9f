import pytest

from gpuplan.plan.types import PlanError
from gpuplan.spec.load import load_toml


def test_toml_syntax_error_has_file_line_col(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[model]\nconfig = "x.json"\n[training\n')
    with pytest.raises(PlanError) as e:
        load_toml(p)
    summary = e.value.diagnostics[0].summary
    assert summary.startswith(f"{p}:3:")
    assert "invalid TOML" in summary


def test_missing_file_directory_and_binary(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        load_toml(tmp_path / "nope.toml")
    with pytest.raises(PlanError, match="is a directory"):
        load_toml(tmp_path)
    b = tmp_path / "bin.toml"
    b.write_bytes(b"a = 1\n\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match=r"bin.toml:2:1: not UTF-8"):
        load_toml(b)


def test_hash_is_of_the_file_bytes(tmp_path):
    import hashlib

    p = tmp_path / "s.toml"
    p.write_text("[model]\nconfig = 'c.json'\n")
    loaded = load_toml(p)
    assert loaded.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert loaded.path == p.resolve()
    assert loaded.raw == {"model": {"config": "c.json"}}
