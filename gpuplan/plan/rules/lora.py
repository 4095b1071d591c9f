"""LoRA and QLoRA settings: the [lora] table resolved for peft, the method, the merge.

- lora.lora_alpha: unset -> 2 x r (the issue's default; peft's own is 8).
- lora.target_modules: "all-linear" -> the explicit list of layer names peft matches;
  a list is checked against the model's linear layers with a "did you mean"
  (modelinfo/lora_targets.py).
- lora.modules_to_save: seq-cls adds the classification head (peft's SEQ_CLS task
  does the same: peft_model.py PeftModelForSequenceClassification), else as given.
- quantization.bnb_4bit_compute_dtype: rules/quantization.py.
- output.merge_adapter with qlora is refused: merging into 4-bit weights would
  re-quantize the merged weights (peft bnb.py Linear4bit.merge warns "Merge lora module
  to 4-bit linear may get different generations due to rounding errors"), so the saved
  model would not be the one trained.
"""

from __future__ import annotations

from gpuplan.modelinfo.lora_targets import TargetError, check_saved, count_adapters, default_modules_to_save, resolve_targets
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.types import Adapters
from gpuplan.plan.methods import METHODS
from gpuplan.plan.rules.common import FIT_METHOD, LORA_COUNT, QUANT_COMPUTE
from gpuplan.plan.rules.vision import IMAGE_PLAN
from gpuplan.units import gib

LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "use_dora", "modules_to_save")


def lora_config(ctx: Resolver) -> None:
    method = ctx.spec("model.method")
    r = ctx.spec("lora.r")
    # a full fine-tune keeps the [lora] values as written: resolving them would print changes
    # that do nothing; they are still checked and resolved internally (the no-fit alternatives)
    record = method != "full"
    alpha = ctx.spec("lora.lora_alpha")
    if alpha is None and record:
        ctx.resolve("lora.lora_alpha", 2 * r, f"default: 2 x r = {2 * r} (scaling lora_alpha / r = 2)")
    else:
        ctx.keep("lora.lora_alpha")
    user_set = [k for k in LORA_KEYS if ctx.is_user(f"lora.{k}")]
    if method == "full" and user_set:
        ctx.warn(
            f"lora.{user_set[0]}",
            '[lora] is set but model.method = "full": the adapters settings are not used',
            fix='set model.method = "lora" (or "qlora"), or remove [lora]',
        )
    asked_save = ctx.spec("lora.modules_to_save")
    try:
        check_saved(ctx.facts, asked_save)
    except TargetError as e:
        ctx.error("lora.modules_to_save", f"lora.modules_to_save: {e}", fix="remove it or use a module name the model has")
        for key in ("lora.lora_alpha", "lora.target_modules", "lora.modules_to_save"):
            if key not in ctx.resolved:
                ctx.keep(key)
        ctx.set_internal(LORA_COUNT, None)
        return
    saved = default_modules_to_save(ctx.facts, asked_save)
    if saved != asked_save and record:
        ctx.resolve(
            "lora.modules_to_save",
            saved,
            f"sequence classification: the new head {', '.join(s for s in saved or [] if s not in (asked_save or []))} "
            "trains in full beside the adapters (peft's SEQ_CLS task saves it too)",
        )
    else:
        ctx.keep("lora.modules_to_save")
    asked = ctx.spec("lora.target_modules")
    images = ctx.get(IMAGE_PLAN)  # a VLM: no adapters on its frozen tower and projector
    excluded = images.frozen_modules(adapters=True) if images is not None else ()
    try:
        targets = resolve_targets(ctx.facts, asked, saved or [], excluded)
    except TargetError as e:
        ctx.error(
            "lora.target_modules", f"lora.target_modules: {e}", fix='set lora.target_modules = "all-linear" or to names from that list'
        )
        ctx.keep("lora.target_modules")
        ctx.set_internal(LORA_COUNT, None)
        return
    if not record:
        ctx.keep("lora.target_modules")
    elif asked == "all-linear":
        ctx.resolve(
            "lora.target_modules",
            targets,
            f'"all-linear": every linear layer of this {ctx.facts.model_type} model but the output head, by the names peft matches'
            + (f" (not the frozen {' and '.join(excluded)}: peft's exclude_modules)" if excluded else ""),
        )
    elif targets != asked:
        ctx.resolve("lora.target_modules", targets, "duplicates removed")
    else:
        ctx.keep("lora.target_modules")
    ctx.set_internal(
        LORA_COUNT,
        (count_adapters(ctx.facts, targets, r, ctx.spec("lora.use_dora"), saved or [], excluded), tuple(targets), tuple(saved or ())),
    )


def merge(ctx: Resolver) -> None:
    if not ctx.spec("output.merge_adapter"):
        ctx.keep("output.merge_adapter")
        return
    method = ctx.get("model.method")
    if method == "qlora":
        ctx.error(
            "output.merge_adapter",
            "output.merge_adapter = true with qlora: merging into the 4-bit base re-quantizes the merged "
            "weights (peft warns of rounding errors), so the saved model would not be the one trained",
            fix="set output.merge_adapter = false and merge later into a 16-bit copy of the base "
            "(PeftModel.from_pretrained on the unquantized model, then merge_and_unload())",
        )
    elif method == "full":
        ctx.warn(
            "output.merge_adapter",
            'output.merge_adapter = true with model.method = "full": no adapter to merge',
            fix="remove output.merge_adapter",
        )
    ctx.keep("output.merge_adapter")


def adapters_for(method: str, ctx: Resolver) -> Adapters | None:
    """The Workload's adapters for a method (None: full fine-tuning, or the targets were refused)."""
    resolved = ctx.get(LORA_COUNT)
    if method == "full" or resolved is None:
        return None
    _, targets, saved = resolved
    images = ctx.get(IMAGE_PLAN)
    return Adapters(
        excluded_modules=images.frozen_modules(adapters=True) if images is not None else (),
        method=method,
        r=ctx.spec("lora.r"),
        target_modules=targets,
        modules_to_save=saved,
        use_dora=ctx.spec("lora.use_dora"),
        lora_dropout=ctx.spec("lora.lora_dropout"),
        quant_type=ctx.spec("quantization.bnb_4bit_quant_type"),
        double_quant=ctx.spec("quantization.bnb_4bit_use_double_quant"),
        compute_dtype=ctx.get(QUANT_COMPUTE),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "lora.config",
        reads=(
            "spec:model.method",
            "spec:lora.r",
            "spec:lora.lora_alpha",
            "spec:lora.target_modules",
            "spec:lora.use_dora",
            "spec:lora.modules_to_save",
            IMAGE_PLAN,
        ),
        writes=("lora.lora_alpha", "lora.target_modules", "lora.modules_to_save", LORA_COUNT),
        apply=lora_config,
        doc="lora_alpha 2 x r; all-linear -> explicit layer names (did-you-mean for unknown ones); seq-cls saves the head.",
    ),
    Rule(
        "lora.merge",
        reads=("spec:output.merge_adapter", "model.method"),
        writes=("output.merge_adapter",),
        apply=merge,
        doc="merge_adapter: lora only; a 4-bit base is refused (re-quantizing the merge changes the model).",
    ),
)


def select_method(ctx: Resolver) -> None:
    """model.method: kept as written; "auto" becomes the first of full, lora, qlora that fits."""
    asked = ctx.spec("model.method")
    fit = ctx.get(FIT_METHOD)
    if asked != "auto" or fit is None:
        ctx.keep("model.method")
        return
    chosen, tried = fit
    why = []
    for method, sol in tried:
        need = sol.estimate.reserved_peak_bytes if sol.fits else sol.smallest_bytes
        why.append(f"{method} {'fits' if sol.fits else 'does not fit'} ({gib(need)})")
    # the reason says why, as every rule's does; "auto" is the change's `before` (a "+" line), not its words
    ctx.resolve(
        "model.method",
        chosen,
        ", ".join(why) + ("" if not METHODS[chosen].frozen_base else f"; {chosen} trains adapters on a frozen base, not every weight"),
    )


RULES = RULES + (
    Rule(
        "lora.method",
        reads=("spec:model.method", FIT_METHOD),
        writes=("model.method",),
        apply=select_method,
        doc='model.method "auto": full if it fits, else lora, else qlora, with the reason; otherwise kept.',
    ),
)
