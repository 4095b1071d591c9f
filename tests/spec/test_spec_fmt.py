"""gpuplan fmt: schema order, comments kept, data unchanged, idempotent."""

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan.plan.types import PlanError
from gpuplan.spec.fmt import format_spec_text, read_spec_text
from tests.helpers.planning import SPECS

MESSY = """\
# My run.
# Second header line.

# the training knobs
[training]
seed    =   1
  learning_rate=1e-5   # peak lr
# above the batch
effective_batch_size = 64
my_own_key = "kept"

max_steps = 10
# gradient_checkpointing = true

# [model] comes first in the schema
[model]  # header comment
task = "causal-lm"
# the config
config = "models/gpt2.json"  # relative to this file

[mystery]
b = 2
a = 1
[output]
dir = "runs/x"


[hardware]
count = 2
gpu = "A100-80GB"
"""

GOLDEN = """\
# My run.
# Second header line.

# [model] comes first in the schema
[model]  # header comment
# the config
config = "models/gpt2.json"  # relative to this file
task = "causal-lm"

[hardware]
gpu = "A100-80GB"
count = 2

# the training knobs
[training]
# above the batch
effective_batch_size = 64
learning_rate = 1e-5   # peak lr

max_steps = 10
seed = 1
my_own_key = "kept"
# gradient_checkpointing = true

[output]
dir = "runs/x"

[mystery]
b = 2
a = 1
"""


def test_golden_reorders_sections_and_keys_keeping_comments():
    assert format_spec_text(MESSY) == GOLDEN


def test_data_unchanged_and_idempotent():
    out = format_spec_text(MESSY)
    assert tomllib.loads(out) == tomllib.loads(MESSY)
    assert format_spec_text(out) == out


def test_formatted_text_is_left_alone():
    assert format_spec_text(GOLDEN) == GOLDEN


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_specs_keep_their_data_and_reach_a_fixed_point(path):
    text = read_spec_text(path)
    out = format_spec_text(text)
    assert tomllib.loads(out) == tomllib.loads(text)
    assert format_spec_text(out) == out
    assert [ln for ln in text.splitlines() if ln.lstrip().startswith("#")] == [
        ln for ln in out.splitlines() if ln.lstrip().startswith("#")
    ]  # no key moved past a comment here


def test_unknown_keys_and_sections_stay_at_the_end():
    out = format_spec_text('[zeta]\nz = 1\n[training]\nzz = 1\nseed = 2\n[alpha]\na = 1\n[model]\nconfig = "c"\n')
    assert out == '[model]\nconfig = "c"\n\n[training]\nseed = 2\nzz = 1\n\n[zeta]\nz = 1\n\n[alpha]\na = 1\n'


def test_inline_tables_arrays_and_multiline_values_survive():
    text = (
        '[data]\nseq_len = 128\ntrain_files = [\n  "a.jsonl",  # first\n  "b.jsonl",\n]\n'
        '[model]\nconfig = """\nmulti\n# not a comment\n"""\nx = {a = 1, b = "2"}\n'
    )
    out = format_spec_text(text)
    assert tomllib.loads(out) == tomllib.loads(text)
    assert out.index("[model]") < out.index("[data]")
    assert '  "a.jsonl",  # first\n' in out
    assert out.index("train_files") < out.index("seq_len")


def test_sub_tables_dotted_keys_and_arrays_of_tables_are_kept_verbatim():
    text = (
        'top.level = 1\n[training]\nseed = 1\n[hardware]\ngpu = "T4"\n[hardware.extra]\nx = 1\n'
        '# about runs\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n[model]\na.b = 2\nconfig = "c"\n'
    )
    out = format_spec_text(text)
    assert tomllib.loads(out) == tomllib.loads(text)
    assert format_spec_text(out) == out
    assert out.startswith("top.level = 1\n")
    assert out.index("[model]") < out.index("[hardware]") < out.index("[training]") < out.index("[[runs]]")
    assert "# about runs\n[[runs]]" in out


def test_comment_above_a_header_moves_with_it_but_a_trailing_comment_stays():
    text = '[training]\nseed = 1\n# end of training\n\n# about the model\n[model]\nconfig = "c"\n'
    out = format_spec_text(text)
    assert out == '# about the model\n[model]\nconfig = "c"\n\n[training]\nseed = 1\n# end of training\n'


def test_header_touching_the_first_table_stays_on_it():
    text = '# header\n[model]\nconfig = "c"\n'
    assert format_spec_text(text) == text
    moved = format_spec_text('# header\n[training]\nseed = 1\n[model]\nconfig = "c"\n')
    assert moved == '# header\n\n[model]\nconfig = "c"\n\n[training]\nseed = 1\n'


def test_spacing_blank_lines_and_line_endings_are_normalised():
    text = '\n\n[model]\n\n\n   config   =    "c"\r\n\n\n\ntask="causal-lm"\n\n\n\n[output]\ndir="d"\n\n\n'
    out = format_spec_text(text)
    assert out == '[model]\nconfig = "c"\n\ntask = "causal-lm"\n\n[output]\ndir = "d"\n'


def test_empty_and_comment_only_files():
    assert format_spec_text("") == ""
    assert format_spec_text("# nothing yet\n\n\n") == "# nothing yet\n"


def test_invalid_toml_names_file_line_and_column():
    with pytest.raises(PlanError, match=r"^spec\.toml:3:\d+: invalid TOML"):
        format_spec_text('[model]\nconfig = "c"\nseed = = 1\n', source="spec.toml")
    with pytest.raises(PlanError, match=r"spec\.toml:2:\d+: invalid TOML.*"):
        format_spec_text("[model]\n[model]\n", source="spec.toml")


def test_read_spec_text_refuses_what_plan_refuses(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        read_spec_text(tmp_path / "nope.toml")
    crlf = tmp_path / "crlf.toml"
    crlf.write_bytes(b'[model]\r\nconfig = "c"\r\n')
    assert read_spec_text(crlf) == '[model]\r\nconfig = "c"\r\n'  # exact bytes: --check sees CRLF as a change
    assert format_spec_text(read_spec_text(crlf)) == '[model]\nconfig = "c"\n'


_TRAINING = [
    "effective_batch_size = 32",
    "learning_rate = 0.0001",
    "max_steps = 5",
    "seed = 3",
    'optim = "adamw_torch"',
    "bf16 = true",
    "logging_steps = 2",
]
_SECTIONS = {
    "model": ['config = "c.json"', 'task = "causal-lm"'],
    "data": ["seq_len = 64", 'text_field = "t"'],
    "training": _TRAINING,
    "output": ['dir = "runs/r"'],
}


@settings(max_examples=40, deadline=None)
@given(st.permutations(list(_SECTIONS)), st.data())
def test_any_order_formats_to_the_same_text(order, data):
    """Shuffled sections and keys, each key with its comments, always format to one text."""

    def block(section, keys):
        return "\n".join([f"[{section}]"] + [f"# about {k.split()[0]}\n{k}  # inline {k.split()[0]}" for k in keys])

    shuffled = "\n\n".join(block(s, data.draw(st.permutations(_SECTIONS[s]))) for s in order) + "\n"
    canonical = "\n\n".join(block(s, _SECTIONS[s]) for s in _SECTIONS) + "\n"
    out = format_spec_text(shuffled)
    assert out == format_spec_text(canonical)
    assert tomllib.loads(out) == tomllib.loads(shuffled)
