"""Hypothesis strategies for tests/plan/test_fuzz_specs.py: valid, near-valid and hostile specs.

Specs are generated as dicts and written as TOML text by tests/helpers/fuzz_toml.py;
hostile inputs are raw text or bytes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from hypothesis import strategies as st

from gpuplan.hardware.catalog import names
from gpuplan.spec.names import OPTIMIZER_NAMES, REMOVED_OPTIMIZERS
from gpuplan.spec.schema import SECTIONS
from tests.helpers.fuzz_toml import toml_str

MODELS_DIR = Path(__file__).resolve().parents[2] / "specs" / "models"
MODEL_CONFIGS = sorted(str(p) for p in MODELS_DIR.glob("*.json"))
GPUS = names()
SCHEMA_KEYS = [(s, k) for s, cls in SECTIONS.items() for k in cls.model_fields]


def choices(key: str) -> st.SearchStrategy:
    """The Literal values the schema allows for a key (kept in step with the schema)."""
    section, name = key.split(".")
    out: list = []

    def walk(t) -> None:
        if get_origin(t) is Literal:
            out.extend(get_args(t))
        elif get_origin(t) in (Union, UnionType):
            for a in get_args(t):
                walk(a)

    walk(SECTIONS[section].model_fields[name].annotation)
    assert out, key
    return st.sampled_from(out)


# ---- (a) valid specs ------------------------------------------------------------------
AUTO_BOOL = st.sampled_from(["auto", True, False])
BATCHES = st.one_of(st.integers(1, 128), st.sampled_from([256, 512, 1024, 4096, 65536]))


def _opt(**kw) -> dict:
    return kw


def valid_specs(output_dir: str) -> st.SearchStrategy[dict]:
    """Specs built from the schema's real keys and values over the shipped model configs."""
    model = st.fixed_dictionaries(
        {"config": st.sampled_from(MODEL_CONFIGS)},
        optional=_opt(
            task=choices("model.task"),
            num_labels=st.integers(2, 1000),
            dtype=st.one_of(st.sampled_from(["float32", "bfloat16"]), choices("model.dtype")),
            attn_implementation=choices("model.attn_implementation"),
            from_scratch=st.booleans(),
            trust_remote_code=st.booleans(),
            allow_pickle_weights=st.booleans(),
        ),
    )
    hardware = st.fixed_dictionaries(
        {"gpu": st.sampled_from(GPUS + ["a100-80gb", "H100", "nvidia a10g", "Tesla T4", "rtx 4090"])},
        optional=_opt(
            count=st.one_of(st.integers(1, 16), st.sampled_from([64, 1024])),
            nodes=st.one_of(st.integers(1, 8), st.sampled_from([512, 4096])),
            memory_gib=st.floats(0.25, 4096),
            headroom=st.floats(0, 0.5),
            host_memory_gib=st.floats(1, 4096),
            cpu_count=st.integers(1, 512),
            interconnect=choices("hardware.interconnect"),
            network=choices("hardware.network"),
        ),
    )
    data = st.fixed_dictionaries(
        {},
        optional=_opt(
            seq_len=st.one_of(st.integers(8, 4096), st.sampled_from([8192, 32768, 131072, 1_048_576])),
            packing=AUTO_BOOL,
            train_files=st.lists(st.sampled_from(["data/a.jsonl", "d/b.txt", "c.csv"]), max_size=3),
            eval_files=st.lists(st.just("data/eval.jsonl"), max_size=1),
            eval_fraction=st.floats(0, 0.5),
            text_field=st.sampled_from(["text", "content"]),
            label_field=st.sampled_from(["label", "y"]),
        ),
    )
    training = st.fixed_dictionaries(
        {},
        optional=_opt(
            effective_batch_size=st.one_of(st.integers(1, 4096), st.sampled_from([2**20, 2**24])),
            per_device_train_batch_size=st.one_of(st.just("auto"), BATCHES),
            per_device_eval_batch_size=st.one_of(st.just("auto"), BATCHES),
            gradient_accumulation_steps=st.one_of(st.just("auto"), st.integers(1, 64)),
            gradient_checkpointing=AUTO_BOOL,
            bf16=AUTO_BOOL,
            fp16=AUTO_BOOL,
            tf32=AUTO_BOOL,
            optim=st.sampled_from(("auto",) + OPTIMIZER_NAMES + tuple(REMOVED_OPTIMIZERS)),
            learning_rate=st.floats(1e-7, 1),
            max_steps=st.integers(1, 10**6),
            num_train_epochs=st.floats(0.1, 100),
            lr_scheduler_type=choices("training.lr_scheduler_type"),
            warmup_steps=st.integers(0, 10_000),
            warmup_ratio=st.floats(0, 0.99),
            weight_decay=st.floats(0, 1),
            max_grad_norm=st.floats(0, 10),
            logging_steps=st.integers(1, 1000),
            save_steps=st.integers(1, 10_000),
            save_total_limit=st.integers(1, 10),
            eval_steps=st.integers(1, 10_000),
            seed=st.integers(0, 2**32 - 1),
            dataloader_pin_memory=AUTO_BOOL,
            dataloader_num_workers=st.one_of(st.just("auto"), st.integers(0, 32)),
            torch_compile=st.booleans(),
            torch_compile_backend=choices("training.torch_compile_backend"),
            torch_compile_mode=choices("training.torch_compile_mode"),
            torch_empty_cache_steps=st.one_of(st.just("auto"), st.integers(0, 100)),
        ),
    )
    distributed = st.fixed_dictionaries(
        {},
        optional=_opt(
            strategy=choices("distributed.strategy"),
            fsdp_sharding=choices("distributed.fsdp_sharding"),
            fsdp_cpu_offload=st.booleans(),
            zero_stage=choices("distributed.zero_stage"),
            offload_optimizer=st.booleans(),
            offload_params=st.booleans(),
            master_addr=st.sampled_from(["10.0.0.1", "node0"]),
            master_port=st.integers(1, 65535),
        ),
    )
    output = st.fixed_dictionaries({}, optional=_opt(dir=st.sampled_from([output_dir, "runs/x", "../out"])))
    return st.fixed_dictionaries(
        {"model": model, "hardware": hardware},
        optional=_opt(data=data, training=training, distributed=distributed, output=output),
    ).map(consistent)


MASKED_LM = ("bert", "roberta")


def consistent(spec: dict) -> dict:
    """Settle the pairs that contradict each other, so most valid specs plan (near-valid keeps the conflicts)."""
    t, m, d = spec.get("training", {}), spec["model"], spec.get("distributed", {})
    if "warmup_steps" in t:
        t.pop("warmup_ratio", None)
    if t.get("torch_compile") is False and ("torch_compile_backend" in t or "torch_compile_mode" in t):
        t["torch_compile"] = True
    if t.get("bf16") is True and t.get("fp16") is True:
        t["fp16"] = False
    if t.get("torch_compile_backend", "inductor") != "inductor":
        t.pop("torch_compile_mode", None)  # mode is inductor's alone
    data = spec.get("data", {})
    if t.get("lr_scheduler_type") in ("reduce_lr_on_plateau", "greedy") and not (data.get("eval_files") or data.get("eval_fraction")):
        t["lr_scheduler_type"] = "linear"  # these step on the eval loss
    if d.get("fsdp_sharding") == "hybrid_shard":
        d["fsdp_sharding"] = "full_shard"  # FSDP1 only in transformers 5.24
    if m.get("task") == "masked-lm" and not Path(m["config"]).stem.startswith(MASKED_LM):
        m["task"] = "causal-lm"
    if d.get("strategy") == "deepspeed":
        d.pop("fsdp_sharding", None), d.pop("fsdp_cpu_offload", None)
    if d.get("strategy") == "fsdp":
        for k in ("zero_stage", "offload_optimizer", "offload_params"):
            d.pop(k, None)
    return spec


# ---- (b) near-valid: a few keys mutated ------------------------------------------------
SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**100, -(10**100)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, 5e-324, 0.5, 1.5]),
    st.text(max_size=40),
    st.sampled_from(["auto", "AUTO", "", "true", "1", "none", "null", "nan", "-1", "0x10", "../../etc/passwd"]),
)


def _small_containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4))


VALUES = st.recursive(SCALARS, _small_containers, max_leaves=8)


def _misspell(key: str, how: int, at: int) -> str:
    i = at % max(len(key), 1)
    if how == 0:
        return key[:i] + key[i + 1 :]  # drop a character
    if how == 1:
        return key[:i] + key[i : i + 2][::-1] + key[i + 2 :]  # swap two
    if how == 2:
        return key.upper()
    return key.replace("_", "-")


@st.composite
def mutation(draw) -> tuple:
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "misspell", "move", "section", "replace_section"]))
    section, key = draw(st.sampled_from(SCHEMA_KEYS))
    if kind == "set":
        return ("set", section, key, draw(VALUES))
    if kind == "delete":
        return ("delete", section, key)
    if kind == "misspell":
        return ("misspell", section, key, _misspell(key, draw(st.integers(0, 3)), draw(st.integers(0, 50))))
    if kind == "move":
        return ("move", section, key, draw(st.sampled_from(list(SECTIONS))), draw(VALUES))
    if kind == "section":
        name = draw(st.one_of(st.sampled_from(["trainig", "Training", "hw", "models", "lora", "data2"]), st.text(max_size=12)))
        return ("section", name, draw(st.dictionaries(st.text(max_size=10), SCALARS, max_size=3)))
    return ("replace_section", section, draw(VALUES))


def apply_mutations(spec: dict, muts: list[tuple]) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in spec.items()}
    for m in muts:
        kind = m[0]
        if kind in ("set", "misspell", "move", "delete") and not isinstance(out.get(m[1]), dict):
            out[m[1]] = {}
        if kind == "set":
            out[m[1]][m[2]] = m[3]
        elif kind == "delete":
            out[m[1]].pop(m[2], None)
        elif kind == "misspell":
            value = out[m[1]].pop(m[2], "auto")
            out[m[1]][m[3]] = value
        elif kind == "move":
            out[m[1]].pop(m[2], None)
            if not isinstance(out.get(m[3]), dict):
                out[m[3]] = {}
            out[m[3]][m[2] if m[3] != m[1] else m[2] + "_"] = m[4]
        elif kind == "section":
            out[m[1]] = m[2]
        else:
            out[m[1]] = m[2]
    return out


@st.composite
def text_damage(draw, text: str) -> str:
    """Damage TOML text at a random place: cut, insert, delete or repeat a line."""
    kind = draw(st.sampled_from(["cut", "insert", "delete", "repeat_line", "unclose"]))
    i = draw(st.integers(0, max(len(text) - 1, 0)))
    if kind == "cut":
        return text[:i]
    if kind == "insert":
        return text[:i] + draw(st.sampled_from(['"', "[", "]", "=", "{", "\n", "\\", "'''", "\x00", "\x7f", "\u2028"])) + text[i:]
    if kind == "delete":
        return text[:i] + text[i + 1 :]
    if kind == "unclose":
        return text + '\nx = "unterminated'
    lines = text.splitlines()
    j = i % max(len(lines), 1)
    return "\n".join(lines[: j + 1] + lines[j:]) + "\n"


CONFIG_FIELDS = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
    "model_type",
    "num_local_experts",
    "num_experts_per_tok",
    "tie_word_embeddings",
    "n_embd",
    "n_layer",
    "n_head",
    "torch_dtype",
]


@st.composite
def damaged_model_config(draw) -> str:
    """A shipped config.json with a few fields set to hostile values (JSON allows NaN/Infinity)."""
    cfg = json.loads(Path(draw(st.sampled_from(MODEL_CONFIGS))).read_text())
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(CONFIG_FIELDS + list(cfg)))
        if draw(st.integers(0, 4)) == 0:
            cfg.pop(field, None)
        else:
            cfg[field] = draw(st.one_of(VALUES, st.integers(-4, 10**6), st.sampled_from([0, -1, 10**12, 10**30])))
    return json.dumps(cfg)


# ---- (c) hostile ----------------------------------------------------------------------
KEYS = st.text(min_size=0, max_size=20)


def _containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5))


TREES = st.recursive(SCALARS, _containers, max_leaves=25)


@st.composite
def unicode_spec(draw) -> dict:
    """Random unicode keys and values at every level, sometimes around a valid core."""
    doc = draw(st.dictionaries(KEYS, TREES, max_size=6))
    if draw(st.booleans()):
        doc.setdefault("model", {"config": draw(st.sampled_from(MODEL_CONFIGS))})
        if isinstance(doc["model"], dict):
            doc["model"].update(draw(st.dictionaries(KEYS, SCALARS, max_size=3)))
    return doc


@st.composite
def deep_text(draw) -> str:
    """TOML nested up to thousands deep: arrays, inline tables, dotted keys, table headers."""
    n = draw(st.one_of(st.integers(1, 60), st.integers(60, 3000)))
    kind = draw(st.sampled_from(["array", "inline", "dotted", "header", "mixed"]))
    if kind == "array":
        body = "x = " + "[" * n + "1" + "]" * n
    elif kind == "inline":
        body = "x = " + "{a = " * n + "1" + "}" * n
    elif kind == "dotted":
        body = "x" + ".a" * n + " = 1"
    elif kind == "header":
        body = "[" + ".".join(["a"] * n) + "]\nb = 1"
    else:
        body = "x = " + "[{a = " * n + "1" + "}]" * n
    where = draw(st.sampled_from(["top", "training", "model"]))
    if where == "top":
        return body + "\n"
    head = f"[model]\nconfig = {toml_str(MODEL_CONFIGS[0])}\n"
    return head + ("" if where == "model" else "[training]\n") + body.replace("[a", "[training.a") + "\n"


SMALL_TEXTS = st.sampled_from(
    [
        "",
        " ",
        "\n",
        "\n\n\n",
        "# only a comment\n",
        "\ufeff",
        "\ufeff[model]\n",
        "[model]",
        "[model]\n",
        "model = 1",
        "model = {}",
        "[[model]]\nconfig = 'x'",
        "[model]\nconfig = ''",
        "[model]\nconfig = '/'",
        "[model]\nconfig = '/dev/null'",
        '[model]\nconfig = "\\u0000"',
        "\x00",
        "=",
        "[]",
        "[model\n",
    ]
)

# Values for path keys: absurd, empty, NUL bytes, too long, a directory, a device.
FIXED_PATHS = [
    "",
    ".",
    "/",
    "..",
    "/dev/null",
    "/proc/self/status",
    "/etc",
    "~",
    "a\x00b",
    "\x00",
    "x" * 300,
    "/".join(["d"] * 2000),
    "y" * 5000,
    "spec.toml",
    "config-dir",
    "bad.json",
]
PATH_VALUES = st.one_of(st.sampled_from(FIXED_PATHS), st.text(max_size=30))
