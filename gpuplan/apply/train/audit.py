"""The audit: read the live run back and compare it with the plan, setting by setting.

Terraform stops when a provider's result differs from the plan ("Provider produced an
inconsistent result after apply"); apply does the same before step 1. The libraries change
what they are given (TRL casts and disables dropout, Liger replaces forwards, the Trainer
turns checkpointing on inside train()), so the audit reads the live objects, never the
arguments gpuplan passed. It runs twice:

- "build": after build_trainer() made the Trainer (run.py), on what exists then;
- "train-begin": in TrainerCallback.on_train_begin, which transformers 5.24 calls inside
  Trainer._inner_training_loop after train() applied Liger, enabled activation checkpointing
  and aligned the special tokens, and after _prepare_for_training wrapped the model (DDP /
  FSDP / DeepSpeed), created the optimizer and scheduler and loaded a checkpoint (trainer.py
  `train`, `_inner_training_loop`, `_prepare_for_training`); no optimizer step has run.

Each check is (key, planned, live). The planned side is read from the plan's typed sections
(plan.model, plan.memory.workload: gpuplan/plan/sections.py, plan/estimate/memory/types.py)
where they hold it, else from its settings; a check whose planned value the plan does not
hold (a hand-built plan without a workload) is recorded as skipped. Any difference raises
AuditError before the first optimizer step: it is a gpuplan bug, not a spec mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.methods import Method
from gpuplan.plan.resolved import Resolved
from gpuplan.plan.types import Plan

BUILD, TRAIN_BEGIN = "build", "train-begin"
_SKIP = object()  # planned value the plan does not hold: the check is recorded as skipped


class AuditError(ApplyError):
    """The live run differs from its plan: a gpuplan bug (exit 1, no traceback, state "failed")."""


@dataclass
class Check:
    key: str
    planned: Any
    live: Any

    @property
    def ok(self) -> bool:
        return _same(self.planned, self.live)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "planned": _jsonable(self.planned), "live": _jsonable(self.live), "ok": self.ok}


@dataclass
class AuditLog:
    """The audit's record of one apply: every stage's checks; state.json holds to_dict()."""

    stages: dict[str, list[Check]] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def record(self, stage: str, checks: list[Check], skipped: list[str]) -> None:
        self.stages[stage] = checks
        self.skipped[stage] = skipped

    @property
    def differences(self) -> list[tuple[str, Check]]:
        return [(s, c) for s, cs in self.stages.items() for c in cs if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": list(self.stages),
            "checks": sum(len(c) for c in self.stages.values()),
            "differed": [{"stage": s, **c.to_dict()} for s, c in self.differences],
            "checked": {s: [c.to_dict() for c in cs] for s, cs in self.stages.items()},
            "skipped": {s: k for s, k in self.skipped.items() if k},
        }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _jsonable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


# ---- the plan's side ------------------------------------------------------------------------------


class Planned:
    """What the plan says, through its typed sections where it has them."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.workload = plan.memory.workload

    def wl(self, attr: str, planned: Callable[[Resolved], Any] | None = None) -> Any:
        """The workload's `attr`; without a workload (a plan built by hand), `planned` of the settings."""
        if self.workload is not None:
            return getattr(self.workload, attr)
        if planned is None:
            return _SKIP
        return planned(self.plan.resolved)

    @property
    def method(self) -> Method:
        """What is trained, as its descriptor (plan/methods.py)."""
        return self.plan.resolved.model.method

    @property
    def amp(self) -> str | None:
        if self.workload is not None:
            return self.workload.amp
        return "bf16" if self.plan.resolved.training.bf16 else "fp16" if self.plan.resolved.training.fp16 else None

    @property
    def weight_dtype(self) -> str:
        return str(self.wl("weight_dtype", lambda r: r.model.dtype))

    @property
    def compute_dtype(self) -> str:
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.amp or "", self.weight_dtype)

    @property
    def reference_dtype(self) -> str:
        """The frozen reference's dtype as the plan prices it (memory/preference.py reference_element_bytes):
        a full fine-tune's copy in the policy's dtype, as TRL builds it (trl/trainer/dpo_trainer.py
        dtype=self.model.dtype), so fp32 weights under bf16 autocast keep an fp32 copy; a separate
        reference beside adapters in the compute dtype, as the frozen base."""
        from gpuplan.apply.model.adapters import uses_adapters

        adapters = self.workload.adapters is not None if self.workload is not None else uses_adapters(self.plan)
        return self.compute_dtype if adapters else self.weight_dtype

    def engine(self) -> str:
        """What wraps the model, as engine.engine_of names it."""
        world = self.plan.world_size
        strategy = self.plan.resolved.distributed.strategy
        if strategy == "fsdp":
            return f"fsdp2 {self.plan.resolved.distributed.fsdp_sharding}"
        if strategy == "deepspeed":
            return f"deepspeed zero-{self.plan.resolved.distributed.zero_stage}"
        return "ddp" if world > 1 else "none"


# ---- the live side -------------------------------------------------------------------------------


def _unwrap_optimizer(opt: Any) -> Any:
    while hasattr(opt, "optimizer") and opt.optimizer is not opt:  # accelerate's AcceleratedOptimizer
        opt = opt.optimizer
    return opt


def _base(model: Any) -> Any:
    """The transformers model inside a PeftModel (or the model)."""
    from gpuplan.apply.model.chunked_loss import causal_lm_of

    return causal_lm_of(model)


def _dtypes(params: Any) -> list[str]:
    return sorted({str(p.dtype).removeprefix("torch.") for p in params})


def _trainable(model: Any) -> int:
    from gpuplan.apply.model.adapters import trainable_params

    return trainable_params(model)


def _wrapper_name(fn: Any) -> str | None:
    """ "loss_chunk" / "activation_offload" for the forwards chunked_loss.install and activation_offload.install
    define (told apart by their code's file: functools.wraps copies __module__ and __qualname__)."""
    import os

    from gpuplan.apply.model import activation_offload, chunked_loss

    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    files = {os.path.abspath(chunked_loss.__file__): "loss_chunk", os.path.abspath(activation_offload.__file__): "activation_offload"}
    return files.get(os.path.abspath(code.co_filename)) if code.co_name == "forward" else None


def _forward_chain(model: Any) -> list[Any]:
    """The instance forward of the CausalLM and every function it wraps (functools' __wrapped__), outermost
    first. accelerate wraps it for mixed precision (accelerator.py prepare_model: autocast and
    convert_outputs_to_fp32, both functools-wrapped), and still calls what it wrapped; a library that
    replaces `forward` instead (Liger's MethodType) leaves no path to gpuplan's wrappers."""
    out: list[Any] = []
    fn = _base(model).__dict__.get("forward")
    while fn is not None and len(out) < 64:
        fn = getattr(fn, "__func__", fn)
        out.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    return out


def _forward_wrappers(model: Any) -> list[str]:
    """gpuplan's forward wrappers (chunked_loss.py, activation_offload.py) still on the CausalLM, outermost first."""
    return [n for n in map(_wrapper_name, _forward_chain(model)) if n is not None]


def _chunk_of(model: Any) -> int | None:
    """The chunk size the installed chunked-loss forward closes over (chunked_loss.install)."""
    import inspect

    for fn in _forward_chain(model):
        if _wrapper_name(fn) == "loss_chunk":
            return inspect.getclosurevars(fn).nonlocals.get("chunk")
    return None


def _batch_size(dataloader: Any) -> int | None:
    """Examples per micro-batch of the DataLoader (accelerate's DataLoaderShard keeps torch's fields)."""
    sampler = getattr(dataloader, "batch_sampler", None)
    size = getattr(sampler, "batch_size", None)
    return size if size is not None else getattr(dataloader, "batch_size", None)


def _liger(model: Any) -> bool:
    """Liger kernels in the live model: a module of liger_kernel's, or a forward it installed."""
    lm = _base(model)
    fwd = lm.__dict__.get("forward") or type(lm).forward
    if str(getattr(getattr(fwd, "__func__", fwd), "__module__", "")).startswith("liger_kernel"):
        return True
    return any(
        type(m).__module__.startswith("liger_kernel")
        or "forward" in m.__dict__
        and str(getattr(m.forward, "__module__", "")).startswith("liger_kernel")
        for m in lm.modules()
    )


def _checkpointing(model: Any) -> tuple[bool, bool | None]:
    """(every decoder layer checkpointed, use_reentrant of their checkpoint function)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in _base(model).modules() if isinstance(m, GradientCheckpointingLayer)]
    on = bool(layers) and all(m.gradient_checkpointing for m in layers)
    if not on:
        return any(m.gradient_checkpointing for m in layers), None
    fn = getattr(layers[0], "_gradient_checkpointing_func", None)
    kw = getattr(fn, "keywords", None) or {}
    return True, bool(kw.get("use_reentrant", True))  # torch's checkpoint default is reentrant


def _four_bit(model: Any) -> list[Any]:
    return [m for m in model.modules() if type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes")]


def _quant_state(m: Any) -> Any:
    """The QuantState a Linear4bit dequantizes with: its weight's, or under FSDP (a DTensor shard, no
    attribute) the copy bitsandbytes keeps on the module (nn/modules.py fix_4bit_weight_quant_state_from_module)."""
    return getattr(m.weight, "quant_state", None) or m.quant_state


def _adapter_dropouts(model: Any) -> list[float]:
    out = set()
    for m in model.modules():
        drops = getattr(m, "lora_dropout", None)
        if drops is None or not hasattr(drops, "values"):
            continue
        for d in drops.values():
            out.add(float(getattr(d, "p", 0.0)))  # nn.Identity when the dropout is 0
    return sorted(out)


def _sampler_kind(trainer: Any, dataloader: Any) -> str:
    """The training sampler's kind, "sequential", "random" or its class name: at build the one the trainer picks
    (KTOTrainer `_get_train_sampler`, transformers' by train_sampling_strategy), at train-begin the one inside
    the DataLoader the loop iterates (accelerate's BatchSampler(Shard) around it; its SeedableRandomSampler is
    a RandomSampler)."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    if dataloader is None:
        sampler = trainer._get_train_sampler()
    else:
        sampler = getattr(dataloader, "batch_sampler", None) or getattr(dataloader, "sampler", None)
        for _ in range(4):  # BatchSamplerShard -> BatchSampler -> the sampler
            inner = getattr(sampler, "batch_sampler", None) or (
                getattr(sampler, "sampler", None) if isinstance(sampler, BatchSampler) else None
            )
            if inner is None:
                break
            sampler = inner
    if isinstance(sampler, SequentialSampler):
        return "sequential"
    if isinstance(sampler, RandomSampler):
        return "random"
    return type(sampler).__name__


def _collator_name(collator: Any) -> str:
    return getattr(collator, "__name__", None) or type(collator).__name__


def _tokens(tok: Any) -> dict[str, Any]:
    tok = getattr(tok, "tokenizer", None) or tok  # a vision-language run's processing_class is its processor
    return {k: getattr(tok, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}


# ---- the checks ----------------------------------------------------------------------------------


class _Checks:
    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.skipped: list[str] = []

    def add(self, key: str, planned: Any, live: Callable[[], Any] | Any) -> None:
        if planned is _SKIP:
            self.skipped.append(key)
            return
        if callable(live):
            try:
                live = live()
            except Exception as e:  # noqa: BLE001 - a live object without the attribute differs from the plan
                live = f"unreadable ({type(e).__name__}: {e})"
        self.checks.append(Check(key, planned, live))


def run_checks(
    plan: Plan, trainer: Any, stage: str, tokens: dict[str, Any] | None = None, dataloader: Any = None
) -> tuple[list[Check], list[str]]:
    """Every check of `stage` on the live `trainer` (its model, optimizer, scheduler, collator) and, at
    train-begin, the training DataLoader the loop iterates."""
    import trl  # noqa: F401  (the objective's trainer classes)

    from gpuplan.apply.train import preference
    from gpuplan.apply.train.arguments import training_arguments_kwargs

    p = Planned(plan)
    c = _Checks()
    model = trainer.model
    base = _base(model)
    method = p.method
    obj = preference.objective_of(plan)

    # what is trained
    _trained_checks(c, plan, p, trainer, model, obj)
    if method.frozen_base:
        _adapter_checks(c, plan, p, model)
    _quantization_checks(c, plan, p, model)
    from gpuplan.apply.model.vision import is_vision_language

    if is_vision_language(plan):
        _vision_checks(c, plan, trainer, model, stage)
    attn = p.wl("attn_implementation", lambda r: r.model.attn_implementation)
    c.add("model.attn_implementation", attn, lambda: base.config._attn_implementation)

    _batch_checks(c, plan, p, trainer, obj, dataloader)
    _forward_checks(c, p, trainer, model, stage)
    _data_checks(c, plan, trainer, obj, tokens, dataloader)

    # the objective
    if obj.is_preference:
        _preference_checks(c, plan, p, trainer, obj, dataloader)
    if obj.is_rl:
        _rl_checks(c, plan, p, trainer, stage)

    if stage == TRAIN_BEGIN:
        _checkpointing_checks(c, plan, p, model)
        c.add("distributed.strategy", p.engine(), lambda: _engine(trainer))
        _optimizer_checks(c, plan, trainer, training_arguments_kwargs(plan, progress=False))
    return c.checks, c.skipped


def _trained_checks(c: _Checks, plan: Plan, p: Planned, trainer: Any, model: Any, obj: Any) -> None:
    """What trains live: the objective's trainer class, the trainable count, the trainable and frozen-base dtypes."""
    method = p.method
    c.add("training.objective", obj.trainer_class if obj.is_preference or obj.is_rl else "Trainer", _objective_class(trainer, obj))
    c.add(
        "model.trainable_params",
        plan.model.trainable_params if plan.model.trainable_params is not None else _SKIP,
        lambda: _trainable(model),
    )
    trainable = [q for q in model.parameters() if q.requires_grad]
    # adapters in fp32 whatever the base dtype (plan/estimate/memory/adapters.py: autocast_adapter_dtype)
    c.add("model.trainable_dtype", _planned_trainable_dtypes(plan, p), lambda: _dtypes(trainable))
    if method.frozen_base and not method.quantized_base:  # adapters on a base in its planned dtype
        frozen = [q for n, q in model.named_parameters() if not q.requires_grad and q.dtype.is_floating_point]
        c.add("model.dtype", [p.weight_dtype], lambda: _dtypes(frozen))


def _adapter_checks(c: _Checks, plan: Plan, p: Planned, model: Any) -> None:
    """The live adapters on a frozen base: their dropout and whether they are DoRA."""
    ad = p.workload.adapters if p.workload is not None else None
    dropout = ad.lora_dropout if ad is not None else plan.resolved.lora.lora_dropout
    c.add("lora.lora_dropout", [float(dropout)], lambda: _adapter_dropouts(model))
    c.add("lora.use_dora", bool(ad.use_dora if ad is not None else plan.resolved.lora.use_dora), lambda: _uses_dora(model))


def _quantization_checks(c: _Checks, plan: Plan, p: Planned, model: Any) -> None:
    """The live 4-bit layers: whether there are any and, where planned, their quant type, compute dtype and double quant."""
    method = p.method
    four = _four_bit(model)
    c.add("quantization.4bit_layers", method.quantized_base, bool(four))
    if method.quantized_base and four:
        ad = p.workload.adapters if p.workload is not None else None
        quant = ad.quant_type if ad is not None else plan.resolved.quantization.bnb_4bit_quant_type
        compute = ad.compute_dtype if ad is not None else plan.resolved.quantization.bnb_4bit_compute_dtype
        double = ad.double_quant if ad is not None else plan.resolved.quantization.bnb_4bit_use_double_quant
        c.add("quantization.bnb_4bit_quant_type", [quant], lambda: sorted({_quant_state(m).quant_type for m in four}))
        c.add("quantization.bnb_4bit_compute_dtype", [compute], lambda: sorted({str(m.compute_dtype).removeprefix("torch.") for m in four}))
        c.add("quantization.bnb_4bit_use_double_quant", [bool(double)], lambda: sorted({bool(_quant_state(m).nested) for m in four}))


def _batch_checks(c: _Checks, plan: Plan, p: Planned, trainer: Any, obj: Any, dataloader: Any) -> None:
    """The live batch: per-device rows (an RL generation round's too), accumulation, processes and autocast."""
    batch = _batch_size(dataloader) if dataloader is not None else trainer._train_batch_size
    if obj.is_rl and dataloader is not None:
        # TRL's loader yields a whole generation round per process, per_device x steps_per_generation rows
        # (grpo_trainer.py / rloo_trainer.py get_train_dataloader), which _prepare_inputs splits into the micro-batches
        generation = _batch_size(dataloader)
        c.add("rl.generation_batch_size", plan.resolved.rl.generation_batch_size, (generation or 0) * trainer.args.world_size)
        batch = (generation or 0) // trainer.args.steps_per_generation
    c.add("training.per_device_train_batch_size", p.wl("per_device_batch", lambda r: r.training.per_device_train_batch_size), batch)
    c.add(
        "training.gradient_accumulation_steps",
        p.wl("gradient_accumulation_steps", lambda r: r.training.gradient_accumulation_steps),
        trainer.args.gradient_accumulation_steps,
    )
    c.add("hardware.world_size", plan.world_size, trainer.args.world_size)
    c.add("training.autocast", p.amp or "no", lambda: trainer.accelerator.mixed_precision)


def _forward_checks(c: _Checks, p: Planned, trainer: Any, model: Any, stage: str) -> None:
    """The forward wrappers the plan installs on the live model (offload, chunked loss) and Liger's kernels."""
    chunk = int(p.wl("loss_chunk_size", lambda r: r.training.loss_chunk_size))
    offload = bool(p.wl("offload_activations", lambda r: r.training.activation_offloading))
    wrappers = [w for w, on in (("activation_offload", offload), ("loss_chunk", chunk > 0)) if on]
    c.add("model.forward_wrappers", wrappers, lambda: _forward_wrappers(model))
    if chunk:
        c.add("training.loss_chunk_size", chunk, lambda: _chunk_of(model))
    # Liger is applied by Trainer.train() itself, `if self.args.use_liger_kernel: apply_liger_kernel(...)` at the
    # top of train() (transformers trainer.py): at build the live state is that flag, at train-begin the model
    liger = bool(p.wl("liger_kernel", lambda r: r.training.use_liger_kernel))
    if stage == TRAIN_BEGIN:
        c.add("training.use_liger_kernel", liger, lambda: _liger(model))
    else:
        c.add("training.use_liger_kernel", liger, lambda: bool(getattr(trainer.args, "use_liger_kernel", False)))


def _data_checks(c: _Checks, plan: Plan, trainer: Any, obj: Any, tokens: dict[str, Any] | None, dataloader: Any) -> None:
    """The live data: the collator, whether the rows are packed, the tokenizer's special tokens."""
    planned_collator, packing = _planned_collator(plan, obj)
    collate = getattr(dataloader, "collate_fn", None) if dataloader is not None else trainer.data_collator
    c.add("data.collator", planned_collator, _collator_name(collate))
    if obj.is_preference:
        c.add("data.packing", False, lambda: bool(getattr(trainer.args, "padding_free", False)))
    elif obj.is_rl:
        pass  # prompts, and completions TRL pads itself: nothing is packed
    else:
        c.add("data.packing", packing, lambda: _packed(trainer.train_dataset))
    if tokens is not None:  # the ids of the tokenizer as gpuplan loaded it, before any trainer saw it
        c.add("tokenizer.special_tokens", tokens, lambda: _tokens(trainer.processing_class))


def _preference_checks(c: _Checks, plan: Plan, p: Planned, trainer: Any, obj: Any, dataloader: Any) -> None:
    """The preference settings on the live trainer: beta, the loss, how the rows are read, the reference."""
    from gpuplan.apply.train import preference

    c.add("preference.beta", preference.preference_run(plan).beta, lambda: float(trainer.beta))
    c.add("preference.loss_type", [preference.preference_run(plan).loss_type], lambda: _loss_types(trainer))
    if obj.config_sampling:  # how the rows are read (preference.py train_sampling): TRL's default reads them in order
        c.add("data.train_sampler", preference.train_sampling(plan), lambda: _sampler_kind(trainer, dataloader))
    _reference_checks(c, plan, p, trainer)


def _checkpointing_checks(c: _Checks, plan: Plan, p: Planned, model: Any) -> None:
    """Activation checkpointing on the live model, non-reentrant; FSDP's own is left to FSDP."""
    ckpt_on, reentrant = _checkpointing(model)
    planned_ckpt = bool(p.wl("gradient_checkpointing", lambda r: r.training.gradient_checkpointing))
    fsdp_ckpt = plan.resolved.distributed.strategy == "fsdp" and planned_ckpt  # FSDP's own (convert.py)
    if not fsdp_ckpt:
        c.add("training.gradient_checkpointing", planned_ckpt, ckpt_on)
        if planned_ckpt:
            # non-reentrant: what transformers 5.24 passes by default and adapters need (adapters.py)
            c.add("training.gradient_checkpointing_reentrant", False, reentrant)


def _vision_checks(c: _Checks, plan: Plan, trainer: Any, model: Any, stage: str) -> None:
    """A vision-language run: which parts train (the live requires_grad) and the tokens an image becomes."""
    from gpuplan.apply.model.vision import frozen_prefixes, live_frozen

    # every part the plan keeps frozen trains no parameter live (requires_grad); what does train is
    # held to the plan by model.trainable_params
    frozen = sorted(frozen_prefixes(plan))
    c.add("vision.frozen_modules", frozen, lambda: live_frozen(model, frozen))
    vision = plan.resolved.vision
    collator = trainer.data_collator
    if stage != TRAIN_BEGIN or not hasattr(collator, "image_tokens_of"):
        return
    planned = vision.image_tokens if vision.image_size is not None else _SKIP
    # the processor's tokens for one image of the planned size, and the most any image of the first rows became
    c.add("vision.image_tokens", planned, lambda: collator.image_tokens_for_size(vision.image_size))
    c.add(
        "vision.image_tokens_in_batch",
        True if planned is not _SKIP else _SKIP,
        lambda: max(collator.image_tokens_of(trainer.train_dataset, rows=4)) <= planned,
    )


def _planned_trainable_dtypes(plan: Plan, p: Planned) -> list[str]:
    """Full: the weights' dtype. Adapters: fp32 whatever the base dtype (get_peft_model's
    autocast_adapter_dtype, plan/estimate/memory/adapters.py); saved modules (modules_to_save) train a
    copy in their own dtype, fp32 under qlora (prepare_model_for_kbit_training)."""
    if not p.method.frozen_base:
        return [p.weight_dtype]
    saved = int((plan.model.adapters or {}).get("saved_params") or 0)
    return sorted({"float32"} | ({p.weight_dtype} if saved and not p.method.quantized_base else set()))


def _objective_class(trainer: Any, obj: Any) -> str:
    from transformers import Trainer

    if obj.is_preference or obj.is_rl:
        import trl

        cls = getattr(trl, obj.trainer_class)
        return obj.trainer_class if isinstance(trainer, cls) else type(trainer).__name__
    # A TRL trainer (any of them) has a class of trl's in its MRO. Asked so, the check imports no TRL trainer
    # module: trl's are lazy (trl/_lazy_module.py), and trl.GRPOTrainer's import loads mlflow through
    # trl/extras/profiling.py where it is installed, 5-10 s that a plain causal-LM apply paid at its audit.
    from_trl = any(c.__module__.split(".")[0] == "trl" for c in type(trainer).__mro__)
    return "Trainer" if isinstance(trainer, Trainer) and not from_trl else type(trainer).__name__


def _uses_dora(model: Any) -> bool:
    return any(
        bool(getattr(m, "use_dora", {}).get("default", False)) for m in model.modules() if isinstance(getattr(m, "use_dora", None), dict)
    )


def _loss_types(trainer: Any) -> list[str]:
    types = getattr(trainer, "loss_types", None) or getattr(trainer, "loss_type", None)
    return list(types) if isinstance(types, (list, tuple)) else [str(types)]


def _packed(ds: Any) -> bool:
    """Packed examples fill every sequence with tokens (no padding, or position ids restarting)."""
    cols = getattr(ds, "column_names", None) or []
    if "images" in cols:  # rows with images: the collator pads each to seq_len (apply/data/vision.py)
        return False
    if "position_ids" in cols:
        return True
    if "attention_mask" not in cols:
        return bool(cols)  # blocks of seq_len tokens carry no mask (data._tokenize_lm)
    return False


def _planned_collator(plan: Plan, obj: Any) -> tuple[str, bool]:
    """(collator name, packed) the plan's data settings mean (data.py, chat.py, examples.py; TRL's own
    collators for the preference objectives: trl/trainer/dpo_trainer.py, kto_trainer.py)."""
    if obj.is_preference:
        return obj.collator_class or "?", False
    if obj.is_rl:  # rows go to the trainer as they are (grpo_trainer.py / rloo_trainer.py: data_collator=identity)
        return "identity", False
    from gpuplan.apply.data.flatten import needs_flattening
    from gpuplan.apply.model.vision import is_vision_language

    if is_vision_language(plan):  # apply/data/vision.py: never packed
        return "ImageTextCollator", False
    packing = plan.resolved.data.packing
    task, fmt = plan.resolved.model.task, plan.resolved.data.format
    if task == "masked-lm":
        return "DataCollatorForLanguageModeling", packing
    if fmt in ("chat", "instruction"):
        flat = needs_flattening(plan.resolved.model.attn_implementation, packing)
        return ("flatten_micro_batch" if flat else "default_data_collator"), packing
    if task == "seq-cls":
        return "default_data_collator", False
    return "DataCollatorForLanguageModeling", packing


def _engine(trainer: Any) -> str:
    from gpuplan.apply.train.engine import engine_of

    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = trainer.accelerator.state.deepspeed_plugin
        return f"deepspeed zero-{plugin.zero_stage}"
    return engine_of(trainer.model_wrapped)


def _reference_checks(c: _Checks, plan: Plan, p: Planned, trainer: Any) -> None:
    from gpuplan.apply.train.preference import preference_run

    pref = preference_run(plan)
    planned = pref.reference
    ref = getattr(trainer, "ref_model", None)
    precomputed = bool(getattr(trainer.args, "precompute_ref_log_probs", False))
    is_peft = hasattr(trainer.model, "peft_config")
    if precomputed:
        live = "precomputed"
    elif ref is None:
        live = "adapters-off" if is_peft else "none"
    else:
        path = getattr(ref.config, "_name_or_path", None)
        live = "model" if path and path == pref.reference_model else "copy"
    c.add("preference.reference", planned, live)
    if ref is not None:
        c.add("preference.reference_dtype", [p.reference_dtype], lambda: _dtypes(ref.parameters()))
        c.add("preference.reference_frozen", True, lambda: not any(q.requires_grad for q in ref.parameters()))
        if plan.resolved.distributed.strategy == "fsdp" and plan.world_size > 1:
            # TRL fully_shards the reference with the policy's plugin when FSDP is on (trl/models/utils.py
            # prepare_fsdp), as memory/preference.py counts it; under a DDP fallback it stays whole
            c.add("preference.reference_engine", p.engine(), lambda: _reference_engine(ref))


def _rl_checks(c: _Checks, plan: Plan, p: Planned, trainer: Any, stage: str) -> None:
    """The online-RL settings on the live GRPOTrainer / RLOOTrainer: the group, the generation (its config, the
    backend), the temperature the log-prob head divides by, the KL weight and the reference, the loss, the rewards."""
    rl = plan.resolved.rl
    c.add("rl.num_generations", rl.num_generations, lambda: trainer.num_generations)
    if stage == BUILD:
        c.add("rl.generation_batch_size", rl.generation_batch_size, lambda: trainer.args.generation_batch_size)
    c.add("rl.max_completion_length", rl.max_completion_length, lambda: trainer.max_completion_length)
    c.add("rl.temperature", rl.temperature, lambda: float(trainer.temperature))
    c.add("rl.top_p", rl.top_p, lambda: float(trainer.top_p))
    c.add("rl.generation_backend", rl.generation_backend, lambda: _backend(trainer))
    if not getattr(trainer, "use_vllm", False):  # model.generate's config: what sampling really runs with
        gen = trainer.generation_config
        c.add(
            "rl.generation_config",
            [rl.max_completion_length, True, rl.temperature, rl.top_p],
            lambda: [gen.max_new_tokens, bool(gen.do_sample), float(gen.temperature), float(gen.top_p)],
        )
    # the fused log-prob head TRL installs (trl/trainer/utils.py add_fused_lm_head) divides the logits by the
    # sampling temperature: the log-probs the loss uses are those of the distribution sampled from
    c.add("rl.logprob_temperature", rl.temperature, lambda: _head_temperature(trainer.model))
    c.add("rl.beta", rl.beta, lambda: float(trainer.beta))
    if plan.resolved.training.objective.loss_types:
        c.add("rl.loss_type", rl.loss_type, lambda: str(trainer.loss_type))
    c.add("rl.rewards", [[r.name, r.weight] for r in rl.rewards], lambda: _live_rewards(trainer))
    ref = getattr(trainer, "ref_model", None)
    is_peft = hasattr(trainer.model, "peft_config")
    if ref is not None:
        live = "copy"
    else:
        live = "adapters-off" if is_peft and float(trainer.beta) != 0 else "none"
    c.add("rl.reference", rl.reference, live)
    if is_peft:  # TRL adds a "ref" adapter only to a model that came as a PeftModel: never here
        c.add("rl.adapters", ["default"], lambda: sorted(trainer.model.peft_config))
    if ref is not None:
        c.add("rl.reference_dtype", [p.weight_dtype], lambda: _dtypes(ref.parameters()))
        c.add("rl.reference_frozen", True, lambda: not any(q.requires_grad for q in ref.parameters()))
        c.add("rl.reference_logprob_temperature", rl.temperature, lambda: _head_temperature(ref))


def _backend(trainer: Any) -> str:
    if not getattr(trainer, "use_vllm", False):
        return "transformers"
    return f"vllm-{trainer.vllm_mode}"


def _head_temperature(model: Any) -> float | None:
    """The temperature TRL's fused log-prob forward closes over (add_fused_lm_head), on the CausalLM."""
    import inspect

    base = _base(model).__dict__
    # under mixed precision accelerate wraps the forward in autocast and keeps the one it wrapped as
    # _original_forward (accelerate/accelerator.py prepare_model): TRL's fused forward is that one
    for fwd in (base.get("_original_forward"), base.get("forward")):
        fn = getattr(fwd, "__func__", fwd)
        if fn is None or not inspect.isfunction(fn):
            continue
        t = inspect.getclosurevars(fn).nonlocals.get("temperature")
        if t is not None:
            return float(t)
    return None


def _live_rewards(trainer: Any) -> list[list[Any]]:
    weights = [float(w) for w in trainer.reward_weights.tolist()]
    return [[n, w] for n, w in zip(trainer.reward_func_names, weights, strict=True)]


def _reference_engine(ref: Any) -> str:
    from gpuplan.apply.train.engine import engine_of

    return engine_of(ref)


def _optimizer_checks(c: _Checks, plan: Plan, trainer: Any, kwargs: dict[str, Any]) -> None:
    """The optimizer and scheduler the plan's names mean (transformers' own mapping from a fresh
    TrainingArguments built from the plan) against the ones the Trainer created."""
    from transformers import Trainer, get_scheduler

    if kwargs.get("deepspeed"):
        return  # DeepSpeed builds its own optimizer (convert.py): not read here
    args = _planned_arguments(trainer.args, kwargs)
    cls, okw = Trainer.get_optimizer_cls_and_kwargs(args, trainer.model)
    opt = _unwrap_optimizer(trainer.optimizer)
    groups = opt.param_groups
    c.add("training.optim", [cls.__name__, bool(okw.get("fused", False))], [type(opt).__name__, bool(groups[0].get("fused", False))])
    # LambdaLR sets every step's lr from base_lrs (torch/optim/lr_scheduler.py): they are the live peak lr
    base_lrs = getattr(trainer.lr_scheduler, "base_lrs", None) or [g.get("initial_lr", g["lr"]) for g in groups]
    c.add("training.learning_rate", [plan.resolved.training.learning_rate], sorted({float(x) for x in base_lrs}))
    if "betas" in okw:
        c.add("training.adam_betas", [list(okw["betas"])], sorted({tuple(g.get("betas", ())) for g in groups}))
    wd = plan.resolved.training.weight_decay
    c.add("training.weight_decay", wd, max(float(g.get("weight_decay", 0.0)) for g in groups))
    trainable = {id(q) for q in trainer.model.parameters() if q.requires_grad}
    in_groups = [q for g in groups for q in g["params"]]
    c.add(
        "optimizer.param_groups",
        [len(trainable), 0],
        [len({id(q) for q in in_groups} & trainable), sum(id(q) not in trainable for q in in_groups)],
    )
    steps = trainer.state.max_steps
    dummy = _dummy_optimizer(plan.resolved.training.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, dummy, num_warmup_steps=args.get_warmup_steps(steps), num_training_steps=steps)
    at = sorted({0, 1, max(steps // 2, 0), max(steps - 1, 0)})
    c.add("training.lr_scheduler_type", _multipliers(sched, at), lambda: _multipliers(trainer.lr_scheduler, at))


_OPTIMIZER_FIELDS = ("adam_beta1", "adam_beta2", "adam_epsilon", "optim_args", "optim_target_modules", "lr_scheduler_kwargs")


def _planned_arguments(live: Any, kwargs: dict[str, Any]) -> Any:
    """The live TrainingArguments with the plan's values put back and TrainingArguments' own defaults
    for the optimizer fields the plan leaves to it: what the plan's names mean, whatever TRL changed.
    (A new TrainingArguments would reset accelerate's shared state under the live Trainer.)"""
    import copy
    import dataclasses

    from transformers import TrainingArguments

    args = copy.copy(live)
    defaults = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    for name in _OPTIMIZER_FIELDS:
        f = defaults[name]
        if f.default is not dataclasses.MISSING:
            setattr(args, name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            setattr(args, name, f.default_factory())
    for name in ("optim", "learning_rate", "weight_decay", "lr_scheduler_type", "warmup_steps"):
        setattr(args, name, kwargs[name])
    return args


def _dummy_optimizer(lr: float) -> Any:
    import torch

    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _multipliers(sched: Any, steps: list[int]) -> list[float]:
    lambdas = getattr(sched, "lr_lambdas", None)
    if not lambdas:
        return [type(sched).__name__]  # type: ignore[list-item]
    return [round(float(lambdas[0](s)), 9) for s in steps]


# ---- running it ----------------------------------------------------------------------------------


def tokens_of(tokenizer: Any) -> dict[str, Any]:
    """The BOS / EOS / pad ids to hold the live tokenizer to (taken before the Trainer is built)."""
    return _tokens(tokenizer)


def audit(plan: Plan, trainer: Any, stage: str, log: AuditLog, tokens: dict[str, Any] | None = None, dataloader: Any = None) -> None:
    """Run `stage`'s checks, record them in `log`; AuditError naming every key that differs."""
    checks, skipped = run_checks(plan, trainer, stage, tokens, dataloader)
    log.record(stage, checks, skipped)
    bad = [c for c in checks if not c.ok]
    if bad:
        diffs = "; ".join(f"{c.key}: planned {_jsonable(c.planned)!r}, live {_jsonable(c.live)!r}" for c in bad)
        raise AuditError(
            f"gpuplan bug: the live run differs from its plan ({stage}, {len(bad)} of {len(checks)} checks): {diffs}",
            key=bad[0].key,
            fix="this is not a mistake in the spec: report it as a gpuplan bug with gpuplan-state.json "
            "(its results.audit lists every check); no optimizer step was taken",
        )


def callback(plan: Plan, log: AuditLog, tokens: dict[str, Any] | None) -> Any:
    """The TrainerCallback that audits at on_train_begin; `.trainer` is set once the Trainer exists."""
    from transformers import TrainerCallback

    class AuditCallback(TrainerCallback):
        trainer: Any = None

        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            if self.trainer is not None:
                audit(plan, self.trainer, TRAIN_BEGIN, log, tokens, train_dataloader)

    return AuditCallback()
