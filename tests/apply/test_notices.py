"""Library notices go to output.dir/gpuplan-debug.log (and to stderr with GPUPLAN_DEBUG=1); the ones that
matter become gpuplan's own line with its fix (gpuplan/render/notices.py)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

from gpuplan.render.notices import DEBUG_LOG, captured, known_notice, log_to
from tests.cli.test_init_sources import foreign_lines
from tests.helpers.apply_plans import MICRO_LLAMA
from tests.helpers.cli_runs import command, env, run
from tests.helpers.hub_cache import tiny_model_files

BNB_NOTICE = (
    "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make "
    "sure you already `pip install kernels` and the kernels >= 0.11.1"
)

KERNELS_OFFLINE_NOTICE = (
    "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in offline mode."
)

LORA_SPEC = """\
[model]
name_or_path = "{model}"
method = "lora"
[hardware]
gpu = "cpu"
[data]
seq_len = 64
[training]
effective_batch_size = 2
gradient_checkpointing = true
max_steps = 2
[output]
dir = "{out}"
"""


def test_plan_trace_output_has_only_gpuplan_lines_and_the_notices_are_in_the_debug_log(tmp_path):
    """Tracing a LoRA model runs peft's get_peft_model, which reads transformers' deprecated
    is_gradient_checkpointing (a FutureWarning on stderr before render/notices.py)."""
    model = tmp_path / "micro"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MICRO_LLAMA))
    spec = tmp_path / "lora.toml"
    spec.write_text(LORA_SPEC.format(model=model, out=tmp_path / "run"))
    r = run(command("plan", spec, "--trace"), capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "traced peak" in r.stdout
    assert foreign_lines(r.stdout + r.stderr) == []
    log = (tmp_path / "run" / DEBUG_LOG).read_text()
    assert "`is_gradient_checkpointing` is deprecated" in log
    debug = run(command("plan", spec, "--trace"), capture_output=True, text=True, env=env(GPUPLAN_DEBUG="1"), timeout=300)
    assert debug.returncode == 0, debug.stderr
    assert "`is_gradient_checkpointing` is deprecated" in debug.stderr  # GPUPLAN_DEBUG=1: on the terminal too


def test_a_library_log_record_waits_for_the_output_dir_then_goes_to_the_log(tmp_path, capsys, monkeypatch):
    """bitsandbytes logs its CPU-kernel notice on its module logger, which propagates to the root
    logger (Python's last-resort handler prints it on stderr when nothing else is configured)."""
    monkeypatch.delenv("GPUPLAN_DEBUG", raising=False)
    with captured():
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(BNB_NOTICE)
        log_to(str(tmp_path / "run"))
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert err == ""  # both are known notices: nothing on the screen, not even the count line
    log = (tmp_path / "run" / DEBUG_LOG).read_text()
    assert "bitsandbytes.backends.cpu.ops WARNING: Failed to load CPU gemm_4bit_forward" in log
    assert "FutureWarning" in log and "is_gradient_checkpointing" in log
    assert known_notice(BNB_NOTICE) is not None
    assert known_notice(KERNELS_OFFLINE_NOTICE) is not None
    assert not logging.getLogger().handlers or all(h.__class__.__name__ != "_Handler" for h in logging.getLogger().handlers)


def test_the_kernels_offline_notice_of_bitsandbytes_import_is_known_when_it_is_the_installed_kernels_words():
    """kernels 0.19 logs its offline notice while bitsandbytes 0.50 probes it at import (on CPUs with AVX512-BF16
    only, so not every machine sees it): the words gpuplan knows are the ones the installed kernels writes."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("kernels._internals.hf_hub")
    if spec is None or spec.origin is None:
        pytest.skip("kernels is not installed (transformers[kernels] brings it)")
    source = Path(spec.origin).read_text(encoding="utf-8")
    assert "Skipping publisher trust check for '{repo_id}' because Hugging Face Hub is in offline mode." in source
    said = "Skipping publisher trust check for '{repo_id}' because Hugging Face Hub is in offline mode.".format(
        repo_id="kernels-community/quantization-bitsandbytes"
    )
    assert said == KERNELS_OFFLINE_NOTICE and known_notice(said) is not None
    assert known_notice(said.replace("quantization-bitsandbytes", "another-kernel")) is None  # only the probe's own repo


def test_gpuplan_debug_echoes_and_unknown_warnings_are_counted(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUPLAN_DEBUG", "1")
    with captured():
        log_to(str(tmp_path))
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(BNB_NOTICE)
    assert BNB_NOTICE in capsys.readouterr().err
    monkeypatch.delenv("GPUPLAN_DEBUG")
    with captured():
        log_to(str(tmp_path))
        warnings.warn("a warning gpuplan has never seen", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert "never seen" not in err
    assert f"1 library warning(s) that gpuplan does not explain are in {tmp_path / DEBUG_LOG}" in err
    assert "never seen" in (tmp_path / DEBUG_LOG).read_text()


def test_the_mtime_notice_of_checkpoints_saved_within_a_second_is_not_counted(tmp_path, capsys, monkeypatch):
    """transformers orders checkpoints by mtime and, when they are less than a second apart (a short
    run), says "mtime may not be reliable" and orders them by step: the right order, nothing to do."""
    from transformers.trainer_utils import sort_checkpoints
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("GPUPLAN_DEBUG", raising=False)
    # transformers says it with logger.warning_once, an lru_cache over the whole process (utils/logging.py):
    # once any earlier run in this process sorted checkpoints it would not be said again; as in a fresh gpuplan
    hf_logging.warning_once.cache_clear()
    for step in (2, 1):
        (tmp_path / f"checkpoint-{step}").mkdir()
    with captured():
        log_to(str(tmp_path))
        order = sort_checkpoints(str(tmp_path), use_mtime=True)
    assert [p.rsplit("-", 1)[1] for p in order] == ["1", "2"]
    assert "mtime may not be reliable" in (tmp_path / DEBUG_LOG).read_text()  # the library said it
    assert "does not explain" not in capsys.readouterr().err


def test_without_an_output_dir_the_records_are_printed_as_the_library_wrote_them(capsys, monkeypatch):
    monkeypatch.delenv("GPUPLAN_DEBUG", raising=False)
    with captured():
        logging.getLogger("huggingface_hub.something").warning("the hub said this")
    assert capsys.readouterr().err == "the hub said this\n"  # nothing is lost when no log file exists


def test_transformers_load_report_becomes_gpuplans_warning_with_its_fix(tmp_path):
    """Loading a causal LM checkpoint as a classifier: transformers 5 logs its LOAD REPORT table
    (score.weight MISSING); gpuplan says it in one line with the fix."""
    from transformers import AutoModelForSequenceClassification

    model = tmp_path / "micro"
    model.mkdir()
    for name, content in tiny_model_files(tmp_path).items():
        (model / name).write_bytes(content)
    said = []
    with captured(say=said.append):
        log_to(str(tmp_path / "run"))
        AutoModelForSequenceClassification.from_pretrained(model, num_labels=2)
    assert len(said) == 1
    d = said[0]
    assert d.severity == "warning" and d.key == "model.name_or_path"
    assert "1 weight(s) of LlamaForSequenceClassification are not in the checkpoint" in d.summary
    assert "score.weight" in d.summary and "model.task" in d.fix
    assert "LOAD REPORT" in (tmp_path / "run" / DEBUG_LOG).read_text()
