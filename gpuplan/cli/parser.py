"""The command line's grammar: every command, its flags and an example each (one place)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gpuplan import __version__

EXAMPLES = {
    "plan": "example: gpuplan plan specs/llama-8b-a100.toml --gpu H100-80GB --json",
    "apply": "example: gpuplan apply specs/tiny.toml --yes",
    "validate": "example: gpuplan validate specs/tiny.toml",
    "schema": "example: gpuplan schema > gpuplan.schema.json",
    "gpus": "example: gpuplan gpus",
    "show": "example: gpuplan show runs/tiny --plot tiny.png   (or: gpuplan show run.plan.json --json)",
    "init": "example: gpuplan init meta-llama/Llama-3.1-8B --gpu RTX-4090 --data chat.jsonl --out llama.toml",
    "fmt": "example: gpuplan fmt --check specs/*.toml",
    "compare": "example: gpuplan compare specs/llama-8b-a100.toml --gpus A100-80GB,H100-80GB --counts 1,8",
    "calibration": "example: gpuplan calibration   (or: gpuplan calibration --clear)",
    "data": "example: gpuplan data specs/tiny-chat.toml --examples 2",
    "lock": "example: gpuplan lock specs/chat-hub.toml --upgrade",
    "generate": 'example: gpuplan generate specs/tiny-chat.toml --prompt "What is a GPU?" --max-new-tokens 48',
    "chat": "example: gpuplan chat specs/tiny-chat.toml   (or: printf 'hi\\nand then?\\n' | gpuplan chat SPEC)",
    "eval": "example: gpuplan eval specs/tiny.toml --json   (or: gpuplan eval SPEC --data heldout.jsonl)",
    "export": "example: gpuplan export specs/tiny.toml --to exported/tiny --context 4096",
    "tune": "example: gpuplan tune specs/tiny.toml --budget 300",
}

_Cmd = Callable[[str, str], argparse.ArgumentParser]  # adds one subcommand: name, help


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuplan", description="Terraform for GPU training runs.", epilog="example: gpuplan plan specs/tiny.toml"
    )
    p.add_argument("--version", action="version", version=f"gpuplan {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=EXAMPLES[name])

    _plan_and_apply(cmd)
    _lookup_commands(cmd)
    _sizing_commands(cmd)
    _spec_commands(cmd)
    _after_commands(cmd)
    return p


def _plan_and_apply(cmd: _Cmd) -> None:
    """plan, apply: the core pair, resolving a spec for the hardware and training it."""
    plan = cmd("plan", "Validate a spec, resolve it for the hardware, and print the changes and memory.")
    plan.add_argument("spec", help="spec file (TOML)")
    _plan_flags(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (format 1)")
    plan.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE (apply it later)")
    plan.add_argument("--trace", action="store_true", help="also trace two real training steps under FakeTensorMode (imports torch)")
    plan.add_argument("--detailed-exitcode", action="store_true", help="exit 2 when the plan differs from the last apply in the output dir")

    apply = cmd("apply", "Plan (or load a saved plan) and train with transformers.Trainer.")
    apply.add_argument("target", help="spec file (TOML) or saved plan (JSON from plan --out)")
    _plan_flags(apply)
    apply.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    apply.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code from the model directory (the spec must allow it too)"
    )
    apply.add_argument("--restart", action="store_true", help="start over instead of resuming an incompatible run")
    apply.add_argument("--break-lock", action="store_true", help="remove a lock left by a dead process")
    apply.add_argument(
        "--node-rank", type=int, metavar="R", help="several nodes without SLURM: run this node's share (0 = the rendezvous host)"
    )
    apply.add_argument(
        "--dry-run",
        action="store_true",
        help="[launch] target: write the rendered job (and the saved plan it runs) into output.dir/gpuplan-job without submitting",
    )
    apply.add_argument(
        "--in-job",
        action="store_true",
        help="train here even though [launch] names a cluster: what the submitted job itself runs",
    )


def _lookup_commands(cmd: _Cmd) -> None:
    """validate, show, schema, gpus: the commands that only read and print (a spec, a run, the schema, the catalog)."""
    val = cmd("validate", "Check a spec against the schema; no hardware or model lookups.")
    val.add_argument("spec")
    show = cmd("show", "Print a run's state (its output dir, or its spec) or a saved plan.")
    show.add_argument("target", help="output dir of a run, a spec (.toml: its output.dir), or a saved plan (.json)")
    show.add_argument("--json", action="store_true")
    show.add_argument(
        "--plot", metavar="FILE.png", help="also draw the run (loss, eval loss, tokens/s, plan vs measured) to FILE.png (needs matplotlib)"
    )
    cmd("schema", "Print the spec's JSON Schema (for Taplo / Even Better TOML).")
    cmd("gpus", "List the hardware catalog.")


def _sizing_commands(cmd: _Cmd) -> None:
    """compare, calibration: the commands about plan times across hardware and the measured runs behind them."""
    compare = cmd("compare", "Plan a spec on every catalog GPU and GPU count: fits, settings, time and cost.")
    compare.add_argument("spec", help="spec file (TOML)")
    compare.add_argument("--gpus", metavar="A,B,..", help="catalog names (default: every GPU in the catalog)")
    compare.add_argument(
        "--counts", metavar="1,2,4,8", help="total GPU counts (default: 1,2,4,8); counts above a node's GPUs go on several nodes"
    )
    compare.add_argument("--sort", choices=("cost", "time"), default="cost", help="order of the rows (default: cost)")
    compare.add_argument("--json", action="store_true", help='print {"rows": [...]} as JSON')
    compare.add_argument("--no-color", action="store_true", help=argparse.SUPPRESS)

    cal = cmd("calibration", "List the measured runs that calibrate plan times, or clear them.")
    cal.add_argument("--clear", action="store_true", help="delete every measured run")
    cal.add_argument("--json", action="store_true")


def _spec_commands(cmd: _Cmd) -> None:
    """init, fmt, data, lock, tune: the commands that write a spec, or check and pin what it reads."""
    init = cmd("init", "Write a commented starter spec for a model and a GPU that plans cleanly there.")
    init.add_argument("model", metavar="MODEL", help="a Hub id (org/name, read from the cache first), a model directory, or a config.json")
    init.add_argument(
        "--method",
        default="auto",
        choices=("full", "lora", "qlora", "auto"),
        help="what is trained; auto (default): the planner picks full if it fits, else lora, else qlora",
    )
    init.add_argument(
        "--data",
        metavar="FILE",
        help="training data (a local file or a Hub dataset id); its format (text, chat, instruction, preference) is read from the rows",
    )
    init.add_argument(
        "--objective",
        choices=("sft", "dpo", "kto"),
        default=None,
        help="what the loss is (training.objective); default: read from the rows (preference pairs: dpo, else sft)",
    )
    init.add_argument("--gpu", metavar="NAME", default="auto", help='catalog name, "cpu", or "auto" (default: auto)')
    init.add_argument("--task", default="causal-lm", help="causal-lm (default), seq-cls or masked-lm")
    init.add_argument("--out", metavar="FILE", default="gpuplan.toml", help="spec to write (default: gpuplan.toml)")
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")

    fmt = cmd("fmt", "Lay out specs in schema order, keeping comments and values.")
    fmt.add_argument("specs", nargs="+", metavar="SPEC", help='spec files; "-" reads stdin and writes stdout')
    fmt.add_argument("--check", action="store_true", help="write nothing; list the files fmt would change, exit 1 if any")
    data = cmd("data", "Show training examples as the model sees them (trained parts marked) and data statistics.")
    data.add_argument("spec", help="spec file (TOML)")
    data.add_argument("--examples", "-n", type=int, default=3, metavar="N", help="examples to show (default 3)")
    data.add_argument("--json", action="store_true", help='print {"examples": [{"segments": [{"text", "trained"}]}], "stats": {...}}')
    _plan_flags(data)

    lock = cmd("lock", "Pin every Hub id of a spec to a commit and file hashes, in <spec>.lock.json beside it.")
    lock.add_argument("spec", help="spec file (TOML)")
    lock.add_argument("--upgrade", action="store_true", help="move every pin to where its revision points now")
    tune = cmd(
        "tune",
        "Time a few steps of the fit search's fastest candidates on this machine; write the fastest into the spec.",
    )
    tune.add_argument("spec", help="spec file (TOML); edited in place, its comments kept")
    tune.add_argument("--budget", type=float, default=600.0, metavar="SECONDS", help="seconds of timing at most (default 600)")
    tune.add_argument("--steps", type=int, default=4, metavar="N", help="optimizer steps per candidate, the first one warm-up (default 4)")
    tune.add_argument("--top", type=int, default=4, metavar="K", help="candidates to time, the fastest planned first (default 4)")
    tune.add_argument("--no-write", action="store_true", help="report only: leave the spec as it is")


def _after_commands(cmd: _Cmd) -> None:
    """generate, chat, eval, export: the commands that use what a finished apply produced."""
    gen = cmd("generate", "Generate text with a finished run's model, in the template it trained on.")
    chat = cmd("chat", "Talk to a finished run's model in the terminal; the turns are kept, Ctrl-D ends it.")
    for c in (gen, chat):
        c.add_argument("spec", help="spec file (TOML) of the run, or the run's output dir")
        c.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens to generate per answer (default 64)")
        c.add_argument("--temperature", type=float, metavar="T", help="0 (default): greedy; above 0: sample")
        c.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
        c.add_argument(
            "--image",
            action="append",
            metavar="PATH",
            help="an image the (vision-language) model reads before the first prompt; repeat for several",
        )
    gen.add_argument("--prompt", metavar="TEXT", help="one prompt")
    gen.add_argument("--prompts", metavar="FILE", help='prompts, one per line (.txt) or {"prompt": ...} per line (.jsonl)')
    gen.add_argument("--json", action="store_true", help='print {"generations": [{"prompt", "text", "completion"}]}')
    ev = cmd("eval", "Score a finished run: held-out loss and perplexity, and [eval] tasks with lm-eval.")
    ev.add_argument("spec", help="spec file (TOML) of the run, or the run's output dir")
    ev.add_argument("--data", metavar="FILE", help="held-out rows in the training data's format (default: the run's eval split)")
    ev.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    exp = cmd("export", "Write a finished run as a standalone safetensors model (adapters merged) and say how to serve it.")
    exp.add_argument("spec", help="spec file (TOML) of the run, or the run's output dir")
    exp.add_argument("--to", metavar="DIR", required=True, help="new folder for the model")
    exp.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="weights of the export (default: model.dtype; qlora: a 16-bit copy of the base)",
    )
    exp.add_argument("--context", type=int, metavar="N", help="context length for the memory estimate (default data.seq_len)")
    exp.add_argument("--json", action="store_true")
    for c in (gen, chat, ev, exp):
        c.add_argument("--checkpoint", type=int, metavar="N", help="use checkpoint-N instead of final/")
        c.add_argument(
            "--trust-remote-code", action="store_true", help="allow model code from the model directory (the spec must allow it too)"
        )


def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", metavar="NAME", help='override hardware.gpu (a catalog name, "auto" or "cpu")')
    p.add_argument("--strict", action="store_true", help="refuse to adjust any value the spec sets")
    p.add_argument("--no-color", action="store_true", help="plain text output")
