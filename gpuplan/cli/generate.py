"""`gpuplan generate` and `gpuplan chat`: talk to the model a finished run produced.

Everything is checked before the model loads (the run, --checkpoint, the flags, the
prompts file), so a mistake costs no load and writes nothing; otherwise they write nothing but the
notices of the libraries they load, into the run's gpuplan-debug.log (render/notices.py). The heavy part is gpuplan/after (imported lazily).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpuplan.cli.common import UserError

MAX_PROMPTS = 10_000


def check_generation_flags(args) -> None:
    if args.max_new_tokens is not None and not 1 <= args.max_new_tokens <= 1_000_000:
        raise UserError(f"--max-new-tokens {args.max_new_tokens} must be at least 1", fix="e.g. --max-new-tokens 64")
    if args.temperature is not None and not 0.0 <= args.temperature <= 100.0:
        raise UserError(
            f"--temperature {args.temperature} must be 0 (greedy) or more",
            fix="--temperature 0 for the same text every time, 0.7 to sample",
        )
    if args.checkpoint is not None and args.checkpoint < 0:
        raise UserError(f"--checkpoint {args.checkpoint} must be a step number (a checkpoint-N folder)")
    check_images(getattr(args, "image", None))


def check_images(images: list[str] | None) -> None:
    """Every --image file exists and decodes (spec/chat_images.py), before anything loads."""
    from gpuplan.spec.chat_images import decode, pil_available

    if images and not pil_available():
        raise UserError("--image needs Pillow to read images", fix="pip install 'gpuplan[vision]' (or pip install pillow)")
    for path in images or []:
        problem = decode(os.path.abspath(path)).problem
        if problem is not None:
            raise UserError(f"--image {path}: {problem}", fix="give the path of a PNG or JPEG image")


def read_prompts(args) -> list[str]:
    """--prompt TEXT, or --prompts FILE (.txt: one per line; .jsonl: a string or {"prompt": ...} per line)."""
    if args.prompt is not None and args.prompts is not None:
        raise UserError("give --prompt TEXT or --prompts FILE, not both")
    if args.prompt is not None:
        return [args.prompt]
    if args.prompts is None:
        raise UserError("nothing to generate from", fix="give --prompt TEXT or --prompts FILE (one prompt per line)")
    path = args.prompts
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        raise UserError(f"--prompts {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {path}: cannot read it as UTF-8 text ({e})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.endswith(".jsonl"):
            try:
                row = json.loads(line)
            except ValueError as e:
                raise UserError(
                    f"--prompts {path}:{n}: not JSON ({e})", fix='write one "prompt" string or {"prompt": "..."} per line'
                ) from None
            row = row.get("prompt") if isinstance(row, dict) else row
            if not isinstance(row, str):
                raise UserError(
                    f"--prompts {path}:{n}: holds no prompt text", fix='write one "prompt" string or {"prompt": "..."} per line'
                )
            prompts.append(row)
        else:
            prompts.append(line)
    if not prompts:
        raise UserError(f"--prompts {path} holds no prompt", fix="write one prompt per line")
    if len(prompts) > MAX_PROMPTS:
        raise UserError(f"--prompts {path} holds {len(prompts)} prompts; at most {MAX_PROMPTS}")
    return prompts


def _load(args, command: str) -> tuple[Any, Any, Any]:
    """(finished run, loaded model, prompting), after every check that needs no model."""
    from gpuplan.after.finished_run import finished_run
    from gpuplan.cli.apply import check_remote_code

    run = finished_run(args.spec, args.checkpoint, command=command)
    check_remote_code(run.plan, args.trust_remote_code)
    from gpuplan.apply.model.generation import check_causal

    check_causal(run.plan.resolved.model.task, command)
    if getattr(args, "image", None):
        from gpuplan.apply.model.vision import is_vision_language

        if not is_vision_language(run.plan):
            raise UserError(
                f"--image: this run trained a text model ({run.plan.model.model_type}), which reads no images",
                fix="drop --image, or train a vision-language model (one whose config.json has a vision_config)",
            )
    from gpuplan.render.notices import log_to

    log_to(run.output_dir, load_libraries=True)  # library notices to the run's gpuplan-debug.log (render/notices.py)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the run's files are local: never reach for the Hub
    from gpuplan.after.load import load_trained
    from gpuplan.apply.data.prompting import prompting

    loaded = load_trained(run, echo=lambda s: print(s, file=sys.stderr))
    print(f"loaded {loaded.what} on {loaded.device}", file=sys.stderr)
    return run, loaded, prompting(run.plan, loaded.tokenizer)


def cmd_generate(args) -> int:
    check_generation_flags(args)
    prompts = read_prompts(args)
    from gpuplan.apply.model.generation import DEFAULT_MAX_NEW_TOKENS, generate

    run, loaded, how = _load(args, "gpuplan generate")
    out = []
    for p in prompts:
        g = generate(
            loaded,
            how,
            [{"role": "user", "content": p}],
            max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            temperature=args.temperature or 0.0,
            seed=args.seed,
            images=args.image,
        )
        out.append(g)
        if not args.json:
            print(f"> {p}\n{g.completion}\n", flush=True)
    if args.json:
        print(
            json.dumps(
                {
                    "model": loaded.what,
                    "device": loaded.device,
                    "format": how.fmt,
                    "images": args.image or [],
                    "generations": [
                        {"prompt": g.prompt, "text": g.text, "completion": g.completion, "new_tokens": g.new_tokens} for g in out
                    ],
                },
                indent=2,
            )
        )
    return 0


def cmd_chat(args) -> int:
    check_generation_flags(args)
    from gpuplan.apply.model.generation import DEFAULT_MAX_NEW_TOKENS, generate

    run, loaded, how = _load(args, "gpuplan chat")
    tty = sys.stdin.isatty()
    if tty:
        print("Chatting with the trained model; /help lists the commands, /quit or Ctrl-D ends it.", file=sys.stderr)
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    turns: list[dict[str, str]] = []
    while True:
        try:
            line = input("you> " if tty else "")
        except EOFError:
            if tty:
                print(file=sys.stderr)
            return 0
        if not line.strip():
            continue
        command = chat_command(line)
        if command == "/quit":
            return 0
        if command == "/reset":
            turns = []
            print("(conversation forgotten)", file=sys.stderr)
            continue
        if command is not None:  # /help, or a word the chat does not know: said, never sent to the model
            print(CHAT_HELP if command == "/help" else f"(unknown command {command}; {CHAT_HELP})", file=sys.stderr)
            continue
        turns.append({"role": "user", "content": line})
        turns = fit_context(turns, how, loaded.tokenizer, limit, new_tokens)
        g = generate(loaded, how, turns, max_new_tokens=new_tokens, temperature=args.temperature or 0.0, seed=args.seed, images=args.image)
        turns.append({"role": "assistant", "content": g.completion})
        print(("model> " if tty else "") + g.completion, flush=True)


CHAT_COMMANDS = {"/help": "/help", "/quit": "/quit", "/exit": "/quit", "/reset": "/reset"}
CHAT_HELP = "commands: /reset forgets the conversation, /quit (or Ctrl-D) ends the chat, /help shows this"


def chat_command(line: str) -> str | None:
    """A chat command (/help, /quit or /exit, /reset), or another single /word; None for a message.
    A line of several words is a message even when it starts with "/"."""
    words = line.split()
    if len(words) != 1 or not words[0].startswith("/"):
        return None
    return CHAT_COMMANDS.get(words[0].lower(), words[0])


def fit_context(turns: list[dict[str, str]], how: Any, tokenizer: Any, limit: int | None, new_tokens: int) -> list[dict[str, str]]:
    """Drop the oldest exchanges while the conversation and the answer would not fit the model's positions."""
    if not limit:
        return turns
    while len(turns) > 1:
        n = len(tokenizer(how.render(tokenizer, turns), add_special_tokens=how.add_special_tokens)["input_ids"])
        if n + new_tokens <= limit:
            break
        turns = turns[2:]
        print(f"(the conversation is longer than the model's {limit} positions: forgot the oldest exchange)", file=sys.stderr)
    return turns
