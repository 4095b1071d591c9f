"""The one TOML-value formatter and the one GiB formatter."""

import pytest
import tomllib

from gpuplan.toml_value import toml_value
from gpuplan.units import GIB, gib


@pytest.mark.parametrize(
    "value", [True, 0, -3, 3e-4, 1e-05, "adamw_torch", 'a "quoted" \\ path\n', "é\x7f", ["a.txt", "b.txt"], {"stage": 3, "offload": False}]
)
def test_toml_value_is_what_toml_reads_back(value):
    assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


def test_none_is_what_the_caller_says_or_an_error():
    assert toml_value(None, none="(unset)") == "(unset)"
    with pytest.raises(ValueError, match="no null"):
        toml_value(None)


def test_gib():
    assert GIB == 2**30
    assert gib(12 * GIB + GIB // 4) == "12.2 GiB"
    assert gib(None) == "?" and gib(None, 2, "unknown") == "unknown" and gib(GIB, 2) == "1.00 GiB"
