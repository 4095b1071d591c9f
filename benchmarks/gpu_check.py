"""Train a matrix of small real models through `gpuplan apply` and record measured memory beside the plan.

One command for the first CUDA GPU at hand: three families (Llama: RMSNorm/SwiGLU/GQA;
GPT-2: LayerNorm/gelu_new; GPT-NeoX: parallel residual) x fp16/bf16 autocast x gradient
checkpointing off/on x the methods (GPU default full, lora, qlora: 36 cases; CPU default
full), cases not started within --budget-s skipped and counted (full rows run first), each case
planned by gpuplan and trained for a few steps by `gpuplan.apply.execute` (the Trainer path
a user's run takes) in a fresh process, so the CUDA counters and NVML see that case alone.
On a GPU each case's per-device batch is the largest whose planned tensor peak stays under
--target (default half the GPU's memory, at least a third: the issue's floor), at seq_len 2048.

Recorded per case, beside the plan's figures (memory.allocated_peak_bytes, reserved_peak_bytes,
throughput.tokens_per_second): torch.cuda.max_memory_allocated / max_memory_reserved, the peak
NVML used memory of the process (pynvml, else nvidia-smi, else the device's used memory from
cudaMemGetInfo; the source is recorded), and the tokens/s of the steps after the first. On CPU
the same code path runs a tiny matrix and records what a CPU can measure: time and peak RSS.
fp16 on CPU is planned as fp32 (no GradScaler without CUDA): the "planned" column shows it.

    python benchmarks/gpu_check.py                    # the GPU matrix (a CPU-only host: the tiny one)
    python benchmarks/gpu_check.py --device cpu --families llama --precisions bf16
    python benchmarks/gpu_check.py --device cpu --families llama --methods lora,qlora
    python benchmarks/gpu_check.py --quick   # CI: one tiny CPU case (llama, full, bf16), 2 steps, writes nothing

GRPO rows (--methods grpo,grpo-vllm; on a GPU by default): TRL's GRPOTrainer through apply on the first
family's saved base, bf16, 4 generations per prompt of specs/data/arrow-prompts.jsonl, scored by the
built-in exact-match and length rewards; `grpo` generates with transformers, `grpo-vllm` with vLLM
colocated (rl.generation_backend = "vllm-colocate"). Each records the plan's generation memory (its
"generation" part) and generation seconds per step (the step-time model's generation terms) beside the
measured peak memory and seconds per step. vLLM runs only on a GPU: off one, or where vllm is not
importable, the grpo-vllm row is skipped and the reason recorded.

LoRA and QLoRA rows fine-tune a base (apply refuses adapters on a from-scratch model): the
family's model built from its config (seeded) and saved with save_pretrained, safetensors,
plus the byte-level tokenizer, once per family in the run's temporary directory.

Results: --json (default benchmarks/data/gpu_check-<device>.json) and a RESULTS.md section per device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

_IDS = dict(pad_token_id=256, bos_token_id=257, eos_token_id=258)  # the byte-level tokenizer's (apply/data/tokenizer.py)
FAMILIES = {  # GPU: ~150-200M parameters, vocabulary 32000 (a real-sized LM head)
    "llama": dict(
        model_type="llama",
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=4096,
        **_IDS,
    ),
    "gpt2": dict(model_type="gpt2", n_embd=1024, n_layer=12, n_head=16, vocab_size=32000, n_positions=2048, **_IDS),
    "gpt_neox": dict(
        model_type="gpt_neox",
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=12,
        num_attention_heads=16,
        vocab_size=32000,
        max_position_embeddings=2048,
        **_IDS,
    ),
}
TINY = {  # CPU: the same families, small enough for a few steps in seconds
    "llama": dict(
        FAMILIES["llama"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=260,
    ),
    "gpt2": dict(FAMILIES["gpt2"], n_embd=64, n_layer=2, n_head=4, vocab_size=260),
    "gpt_neox": dict(
        FAMILIES["gpt_neox"], hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=260
    ),
}
# method -> spec tables it adds. lora/qlora: [lora] at its defaults (r 16), on a saved base (save_base).
METHODS: dict[str, dict] = {"full": {}, "lora": {"model": {"method": "lora"}}, "qlora": {"model": {"method": "qlora"}}}
ADAPTER_METHODS = ("lora", "qlora")
# GRPO rows: rl.generation_backend per method (TRL's GRPOTrainer; apply/train/rl.py); they too train a saved base
RL_METHODS = {"grpo": "transformers", "grpo-vllm": "vllm-colocate"}
METHODS.update({m: {"training": {"objective": "grpo"}, "rl": {"generation_backend": b}} for m, b in RL_METHODS.items()})
BASE_METHODS = ADAPTER_METHODS + tuple(RL_METHODS)
PROMPTS = ROOT / "specs" / "data" / "arrow-prompts.jsonl"  # {"prompt", "answer"} rows
RL_GENERATIONS = 4
# exact match of the number after the arrow, and a length penalty: built-ins, no file beside the spec
RL_REWARDS = (
    '[[rl.rewards]]\nkind = "exact-match"\ncolumn = "answer"\npattern = "(\\\\d+)"\n\n'
    '[[rl.rewards]]\nkind = "length"\ntarget_length = 8\nweight = 0.1\n'
)
PRECISIONS = {"fp16": {"fp16": True, "bf16": False}, "bf16": {"bf16": True, "fp16": False}}
CORPUS = ROOT / "specs" / "data" / "tiny-corpus.txt"


def matrix(families, methods, precisions, checkpointing=(False, True)) -> list[dict]:
    """Every family x precision x checkpointing of each training method; one GRPO row per RL method
    (the first family, bf16 where it is asked for, checkpointing off): generation is what they measure."""
    out = []
    for m in methods:
        if m in RL_METHODS:
            out.append(dict(family=families[0], method=m, precision="bf16" if "bf16" in precisions else precisions[0], ckpt=False))
        else:
            out += [dict(family=f, method=m, precision=p, ckpt=c) for f in families for p in precisions for c in checkpointing]
    return out


def vllm_missing(device: str) -> str | None:
    """Why a vllm-colocate row cannot run here (None: it can)."""
    if device != "cuda":
        return "vLLM runs only on a GPU (apply refuses a vllm backend on CPU)"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not importable on this machine (pip install vllm)"
    return None


def spec_text(case: dict, cfg: str, data: str, out: str, *, gpu: str, batch: int, seq: int, steps: int) -> str:
    """`cfg`: a config.json (full: trained from scratch) or, for lora/qlora, the saved base's directory."""
    model = {"name_or_path": cfg} if case["method"] in BASE_METHODS else {"config": cfg, "from_scratch": True}
    rl = case["method"] in RL_METHODS
    tables: dict[str, dict] = {
        "model": {**model, "task": "causal-lm"},
        "hardware": {"gpu": gpu, "count": 1},
        "data": {"train_files": [str(PROMPTS) if rl else data], **({} if rl else {"seq_len": seq})},
        "training": {
            "effective_batch_size": batch,
            "per_device_train_batch_size": batch,
            "max_steps": steps,
            "gradient_checkpointing": case["ckpt"],
            "logging_steps": 1,
            "save_steps": 100000,
            "seed": 0,
            **PRECISIONS[case["precision"]],
        },
        "output": {"dir": out},
    }
    for section, values in METHODS[case["method"]].items():
        tables[section] = {**tables.get(section, {}), **values}
    if rl:  # completions per step = batch, in groups of RL_GENERATIONS; the prompts (~60 bytes) and a short answer
        tables["rl"].update(num_generations=RL_GENERATIONS, max_prompt_length=64, max_completion_length=min(seq, 128))
    text = "\n".join(f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in t.items()) for name, t in tables.items())
    return text + ("\n" + RL_REWARDS if rl else "")


def plan_case(case: dict, work: Path, *, device: str, batch: int, seq: int, steps: int):
    from gpuplan.cli.common import detect_hardware
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.inputs.environment import local_environment

    if case["method"] in BASE_METHODS:
        cfg = save_base(case["family"], work.parent / f"base-{case['family']}", device=device)
    else:
        cfg = work / "config.json"
        cfg.write_text(json.dumps((FAMILIES if device == "cuda" else TINY)[case["family"]]))
    spec = work / "spec.toml"
    spec.write_text(
        spec_text(
            case,
            str(cfg),
            str(work / "train.txt"),
            str(work / "run"),
            gpu="auto" if device == "cuda" else "cpu",
            batch=batch,
            seq=seq,
            steps=steps,
        )
    )
    return plan_file(spec, detect=detect_hardware, environment=local_environment())


def save_base(family: str, path: Path, *, device: str) -> Path:
    """The family's model from its config (seed 0) saved as a pretrained base, with the byte-level
    tokenizer (apply refuses a fine-tune from a directory without tokenizer files); once per path."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    values = dict((FAMILIES if device == "cuda" else TINY)[family])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save_pretrained(path)
    return path


def size_batch(case: dict, work: Path, *, seq: int, steps: int, target: float) -> tuple[int, object]:
    """The largest per-device batch whose planned tensor peak is under target x the GPU's memory."""
    from gpuplan.plan.types import PlanError

    best = None
    for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256):
        try:
            plan = plan_case(case, work, device="cuda", batch=b, seq=seq, steps=steps)
        except PlanError:
            break
        if best is not None and plan.memory.allocated_peak_bytes > target * plan.memory.capacity_bytes:
            break
        best = (b, plan)
    return best


def write_corpus(path: Path, tokens: int) -> None:
    """The shipped corpus repeated to `tokens` bytes (byte-level tokenizer: one token per byte)."""
    text = CORPUS.read_text()
    path.write_text(text * (tokens // len(text.encode()) + 1))


class DeviceMemorySampler:
    """Peak NVML used memory of this process (`peak`) and of the whole device (`peak_device`,
    cudaMemGetInfo: total - free), polled in a thread while the case trains. In a container the
    process list can hide our pid; the device figure is then the one to read (one case per GPU)."""

    def __init__(self, interval: float = 0.1):
        import threading

        import torch

        self.peak, self.peak_device, self.source, self.interval = 0, 0, None, interval
        self._read = self._pick()
        self._device = lambda: (lambda free, total: total - free)(*torch.cuda.mem_get_info())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pick(self):
        pid = os.getpid()
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "pynvml (this process)"
            return lambda: max([p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid] or [0])
        except Exception:  # no pynvml, or no driver
            pass
        try:
            subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=True, timeout=10)
            self.source, self.interval = "nvidia-smi (this process)", 0.5

            def smi() -> int:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                return max([int(m) * 2**20 for p, m in (ln.split(",") for ln in out.splitlines() if "," in ln) if int(p) == pid] or [0])

            return smi
        except Exception:  # no nvidia-smi
            pass
        import torch

        self.source = "cudaMemGetInfo (whole device)"
        return lambda: (lambda free, total: total - free)(*torch.cuda.mem_get_info())

    def _poll(self):
        try:
            self.peak = max(self.peak, int(self._read()))
            self.peak_device = max(self.peak_device, int(self._device()))
        except Exception:  # a poll that fails is skipped, not fatal
            pass

    def _run(self):
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._poll()


def run_case(case: dict, *, device: str, seq: int, steps: int, target: float) -> dict:
    """One case, in this (fresh) process: plan, train through apply's execute, measure."""
    from contextlib import nullcontext

    from gpuplan.apply.train.execute import execute

    work = Path(case["work"])
    work.mkdir(parents=True, exist_ok=True)
    rl = case["method"] in RL_METHODS
    if rl:
        batch = 4 * RL_GENERATIONS if device == "cuda" else RL_GENERATIONS  # whole prompt groups
    elif device == "cuda":
        sized = size_batch(case, work, seq=seq, steps=steps, target=target)
        if sized is None:
            raise SystemExit(f"{case}: gpuplan cannot plan even a batch of 1 at seq_len {seq} on this GPU")
        batch = sized[0]
    else:
        batch = 2
    if not rl:
        write_corpus(work / "train.txt", int(batch * seq * (steps + 2) * 1.2))
    plan = plan_case(case, work, device=device, batch=batch, seq=seq, steps=steps)
    sampler = DeviceMemorySampler() if device == "cuda" else nullcontext()
    with sampler:
        res = execute(plan, echo=lambda line: None, progress=False)
    mem, thr = plan.memory, plan.throughput
    planned = "bf16" if plan.value("training.bf16") else "fp16" if plan.value("training.fp16") else "fp32"
    return dict(
        case,
        batch=batch,
        seq_len=seq,
        steps=steps,
        device=device,
        gpu=plan.hardware.name,
        planned=planned,
        measured=dict(
            allocated=res.get("peak_allocated_bytes"),
            reserved=res.get("peak_reserved_bytes"),
            nvml_used=getattr(sampler, "peak", None),
            nvml_source=getattr(sampler, "source", None),
            device_used=getattr(sampler, "peak_device", None),
            rss=res.get("peak_rss_bytes"),
            tokens_per_second=res.get("steady_tokens_per_second") or res.get("tokens_per_second"),
            train_runtime_s=res.get("train_runtime_s"),
            loss_first=res.get("train_loss_first"),
            loss_last=res.get("train_loss_last"),
        ),
        plan=dict(
            allocated=mem.allocated_peak_bytes,
            reserved=mem.reserved_peak_bytes,
            capacity=mem.capacity_bytes,
            tokens_per_second=thr.tokens_per_second,
            workload=mem.workload.to_dict() if mem.workload else None,
            **({"generation": plan_generation(plan)} if rl else {}),
        ),
    )


def plan_generation(plan) -> dict:
    """The plan's generation: its memory part (memory/generation.py), its seconds per step (the step-time
    model's "generation" terms: prefill, decode, the weight sync to vLLM), the backend and vLLM's share."""
    terms = [t for t in (plan.throughput.step_time or {}).get("terms", []) if t.get("group") == "generation"]
    r = plan.resolved.rl
    return dict(
        backend=r.generation_backend,
        memory=(plan.memory.components or {}).get("generation"),
        seconds_per_step=sum(t["seconds"] for t in terms) if terms else None,
        terms={t["name"]: t["seconds"] for t in terms},
        step_time_s=plan.throughput.step_time_s,
        vllm_gpu_memory_utilization=r.vllm_gpu_memory_utilization if r.generation_backend == "vllm-colocate" else None,
    )


def _gib(n) -> str:
    return f"{n / 2**30:.2f}" if n else "-"


def _err(measured, planned) -> str:
    return f"{(planned - measured) / measured:+.1%}" if measured and planned else "-"


def render(rows: list[dict], summary: dict) -> str:
    cuda = summary["device"] == "cuda"
    head = (
        f"{summary['gpu']}, {len(rows)} cases, {summary['wall_s']:.0f} s wall ({summary['skipped']} skipped "
        f"over the {summary['budget_s']:.0f} s budget). Error = (plan - measured) / measured."
    )
    if summary.get("load_average"):
        head += (
            f" 1-minute load average {summary['load_average'][0]} at the start, {summary['load_average'][1]} "
            f"at the end, on {summary.get('cpus')} CPUs."
        )
    if cuda:
        lines = [
            head,
            "",
            "| family | method | precision (planned) | ckpt | batch x seq | max_memory_allocated GiB | plan "
            "GiB (err) | max_memory_reserved GiB | plan reserved GiB (err) | NVML used GiB (process / device) | tokens/s | "
            "plan tokens/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines = [
            head,
            "CPU: no CUDA counters; peak RSS is the whole process (interpreter, libraries, data), the plan's figure is the tensor peak.",
            "",
            "| family | method | precision (planned) | ckpt | batch x seq | peak RSS GiB | plan tensor peak GiB | "
            "train s | tokens/s | plan tokens/s | loss first -> last |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for r in rows:
        m, p = r["measured"], r["plan"]
        lead = (
            f"| {r['family']} | {r['method']} | {r['precision']} ({r['planned']}) | {'on' if r['ckpt'] else 'off'} | "
            f"{r['batch']} x {r['seq_len']} |"
        )
        tps = f"{m['tokens_per_second']:,.0f}" if m["tokens_per_second"] else "-"
        ptps = f"{p['tokens_per_second']:,.0f}" if p["tokens_per_second"] else "-"
        if cuda:
            lines.append(
                f"{lead} {_gib(m['allocated'])} | {_gib(p['allocated'])} ({_err(m['allocated'], p['allocated'])}) | "
                f"{_gib(m['reserved'])} | {_gib(p['reserved'])} ({_err(m['reserved'], p['reserved'])}) | "
                f"{_gib(m['nvml_used'])} / {_gib(m.get('device_used'))} | {tps} | {ptps} |"
            )
        else:
            loss = f"{m['loss_first']:.3f} -> {m['loss_last']:.3f}" if m["loss_first"] is not None and m["loss_last"] is not None else "-"
            lines.append(
                f"{lead} {_gib(m['rss'])} | {p['allocated'] / 2**20:.1f} MiB | {m['train_runtime_s'] or 0:.1f} | {tps} | {ptps} | {loss} |"
            )
    if cuda and rows:
        lines += ["", f"NVML source: {rows[0]['measured']['nvml_source']}."]
    return "\n".join(lines + rl_lines(rows, summary))


def rl_lines(rows: list[dict], summary: dict) -> list[str]:
    """The GRPO rows' generation: the plan's memory part and seconds per step beside the measured run."""
    rl = [r for r in rows if r["plan"].get("generation")]
    out = []
    if rl:
        out += [
            "",
            "GRPO rows: the plan's generation part of the peak and its generation seconds per step (prefill, decode, weight sync) "
            "beside the measured peak and the measured seconds per step (train runtime / steps, the first step's set-up included).",
            "",
            "| method | backend | completions/step | plan generation GiB | plan generation s/step | plan step s | measured step s | "
            "vLLM share |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rl:
            g, m = r["plan"]["generation"], r["measured"]
            gen_s = f"{g['seconds_per_step']:.3f}" if g["seconds_per_step"] is not None else "-"
            step = f"{g['step_time_s']:.3f}" if g["step_time_s"] else "-"
            measured = f"{m['train_runtime_s'] / r['steps']:.3f}" if m.get("train_runtime_s") else "-"
            share = f"{g['vllm_gpu_memory_utilization']:g}" if g["vllm_gpu_memory_utilization"] is not None else "-"
            out.append(f"| {r['method']} | {g['backend']} | {r['batch']} | {_gib(g['memory'])} | {gen_s} | {step} | {measured} | {share} |")
    for n in summary.get("not_run") or ():
        out.append(f"Not run: {n['family']} {n['method']}: {n['reason']}.")
    for f in summary.get("failed") or ():
        out.append(f"Failed: {f['case']} (the end of its stderr is in the JSON's summary).")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--methods", default=None, help=f"comma list of {sorted(METHODS)} (GPU: all, CPU: full)")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--checkpointing", default="off,on", help="gradient checkpointing rows: off,on")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per case (GPU 6, CPU 3)")
    ap.add_argument("--seq-len", type=int, default=None, help="GPU 2048, CPU 64")
    ap.add_argument("--target", type=float, default=0.5, help="planned peak / GPU memory the batch is sized to")
    ap.add_argument("--budget-s", type=float, default=450, help="cases not started by then are skipped")
    ap.add_argument("--json", help="write the rows here (default benchmarks/data/gpu_check-<device>.json)")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md alone")
    ap.add_argument(
        "--quick", action="store_true", help="CI: one tiny CPU case (llama, full, bf16, no checkpointing), 2 steps; writes no file"
    )
    ap.add_argument("--run-case", help=argparse.SUPPRESS)  # internal: one case in a fresh process
    a = ap.parse_args(argv)
    if a.quick:
        a.device, a.families, a.methods, a.precisions, a.checkpointing = "cpu", "llama", "full", "bf16", "off"
        a.steps, a.no_write = a.steps or 2, True
    if a.run_case:
        job = json.loads(a.run_case)
        row = run_case(job["case"], device=job["device"], seq=job["seq"], steps=job["steps"], target=job["target"])
        Path(job["case"]["work"], "row.json").write_text(json.dumps(row))
        return 0
    device = a.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    methods = (a.methods or ("full,lora,qlora,grpo,grpo-vllm" if device == "cuda" else "full")).split(",")
    for m in methods:
        if m not in METHODS:
            ap.error(f"--methods: {m!r} is not one of {sorted(METHODS)}")
    steps = a.steps or (6 if device == "cuda" else 3)
    seq = a.seq_len or (2048 if device == "cuda" else 64)
    ckpt = tuple({"off": False, "on": True}[c] for c in a.checkpointing.split(","))
    cases = matrix(a.families.split(","), methods, a.precisions.split(","), ckpt)
    rows, skipped, t0, load0 = [], 0, time.perf_counter(), os.getloadavg()[0]
    not_run: list[dict] = []  # rows that cannot run here, each with the reason
    failed: list[dict] = []  # cases whose run failed, each with the end of its stderr
    out = None if a.quick and not a.json else Path(a.json or ROOT / "benchmarks" / "data" / f"gpu_check-{device}.json")

    def summary_now(finished: bool = False) -> dict:
        return dict(
            finished=finished,
            device=device,
            gpu=rows[0]["gpu"] if rows else device,
            wall_s=time.perf_counter() - t0,
            skipped=skipped,
            budget_s=a.budget_s,
            cpus=os.cpu_count(),
            load_average=[round(load0, 1), round(os.getloadavg()[0], 1)],
            not_run=not_run,
            failed=failed,
        )

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        for i, case in enumerate(cases):
            name = f"{case['family']} {case['method']} {case['precision']} ckpt={'on' if case['ckpt'] else 'off'}"
            if time.perf_counter() - t0 > a.budget_s:
                skipped += 1
                print(f"[{i + 1}/{len(cases)}] {name}: skipped (over --budget-s)", flush=True)
                continue
            if case["method"] == "grpo-vllm" and (why := vllm_missing(device)):
                not_run.append(dict(case, reason=why))
                print(f"[{i + 1}/{len(cases)}] {name}: skipped ({why})", flush=True)
                continue
            case["work"] = str(Path(tmp) / f"case{i}")
            job = json.dumps(dict(case=case, device=device, seq=seq, steps=steps, target=a.target))
            try:
                r = subprocess.run([sys.executable, __file__, "--run-case", job], capture_output=True, text=True, cwd=ROOT, timeout=600)
                error = r.stderr[-2000:] if r.returncode != 0 else None
            except subprocess.TimeoutExpired as e:
                error = f"over 600 s; stderr so far: {(e.stderr or b'')[-1500:]!r}"
            if error is not None:  # recorded, and the other cases run: a lent GPU's time is too short to start over
                print(f"[{i + 1}/{len(cases)}] {name}: FAILED\n{error}", flush=True)
                failed.append(dict(case=name, stderr=error))
            else:
                row = json.loads(Path(case["work"], "row.json").read_text())
                row.pop("work")
                rows.append(row)
            if a.json:  # what was measured so far (summary.finished false), should the run be stopped before its end
                Path(a.json).write_text(json.dumps(dict(summary=summary_now(), rows=rows), indent=1))
            if error is not None:
                continue
            m, p = row["measured"], row["plan"]
            peak = m["allocated"] if device == "cuda" else m["rss"]
            print(
                f"[{i + 1}/{len(cases)}] {name}: batch {row['batch']} x {seq}, measured {_gib(peak)} GiB, "
                f"plan {_gib(p['allocated'])} GiB, {m['tokens_per_second'] or 0:,.0f} tokens/s",
                flush=True,
            )
    summary = summary_now(finished=True)
    if out is None or not rows:  # --quick, or nothing measured: the committed results stay as they are
        print(render(rows, summary) if rows else "no case ran: " + ", ".join(f["case"] for f in failed))
        if a.json:
            Path(a.json).write_text(json.dumps(dict(summary=summary, rows=rows), indent=1))
        print(f"{len(rows)} cases in {summary['wall_s']:.0f} s")
        return 1 if failed or not rows else 0
    out.write_text(json.dumps(dict(summary=summary, rows=rows), indent=1))
    print(f"{len(rows)} cases in {summary['wall_s']:.0f} s; rows in {out}")
    if not a.no_write:
        from results import write_section

        title = "Real training memory on a GPU vs the plan" if device == "cuda" else "gpu_check on CPU (its code path, tiny models)"
        command = "python benchmarks/gpu_check.py" + (" --device cpu" if device == "cpu" else "")
        write_section(f"gpu_check_{device}", title, render(rows, summary), command=command)
    if failed:
        print(f"{len(failed)} case(s) failed: " + ", ".join(f["case"] for f in failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
