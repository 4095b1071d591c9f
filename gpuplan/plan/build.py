"""Spec -> Plan, as the pipeline's named steps (docs/design.md, "The pipeline"):

    load      the spec dict validated (spec/validate.py) and flattened into settings
    inputs    the GPU profile, the Hub ids pinned to commits, the model's facts
    walk      every rule in graph order (plan/rules/), the Resolver holding the outcome
    check     whole-plan checks that are not rules (plan/checks/: the data files)
    refuse    a walk with errors raises them, with the hardware that would fit (plan/fit/)
    assemble  memory, step time, cost and advice into the frozen Plan

plan_file() is the one entry point the CLI uses; it never imports torch for a
known architecture (tests/plan/test_plan_imports.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuplan.hardware.catalog import load_interconnects
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.assembly import cost_section, memory_section, step_advice, trainable_section, with_communication
from gpuplan.plan.checks.advice import auto_resolved_to_cpu, long_run
from gpuplan.plan.checks.data_files import data_file_problems
from gpuplan.plan.engine.graph import Node, rule_order, writers
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.calibration import calibrated_scale, calibration_assumption, calibration_key, modelled_parts
from gpuplan.plan.estimate.comm_time import communication
from gpuplan.plan.estimate.interval import time_interval
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.padding import ExampleLengths
from gpuplan.plan.estimate.throughput import estimate_throughput
from gpuplan.plan.fingerprint import fingerprint
from gpuplan.plan.fit.fixes import NoFitError
from gpuplan.plan.fit.search import workload as solve_workload
from gpuplan.plan.inputs.environment import Environment, EnvironmentLike
from gpuplan.plan.inputs.lookup import load_facts, resolve_gpu
from gpuplan.plan.inputs.preference_lengths import example_lengths
from gpuplan.plan.inputs.sources import cached_split_files, resolve_sources, source_settings
from gpuplan.plan.inputs.spec_settings import PATH_LIST_KEYS, flatten
from gpuplan.plan.rules import ALL_RULES
from gpuplan.plan.rules.chat_data import has_chat_template
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION, LORA_COUNT, NO_FIT, world_size
from gpuplan.plan.rules.vision import IMAGE_PLAN
from gpuplan.plan.sections import HardwareSection, ModelSection, ThroughputSection
from gpuplan.plan.types import Change, Diagnostic, Plan, PlanError, Setting
from gpuplan.plan.vision_settings import derived_settings, images_note
from gpuplan.spec.data_fields import data_field_problems
from gpuplan.spec.data_steps import data_size, data_steps_diagnostics
from gpuplan.spec.load import LoadedSpec, load_toml, table
from gpuplan.spec.schema import HardwareSpec, Spec
from gpuplan.spec.validate import validate_spec

SOURCE_REFS: Node[dict[str, Any]] = Node("sources")  # Hub ids resolved to commits (inputs/sources.py), for assemble


def resolve(
    loaded: LoadedSpec,
    *,
    detect: Callable[[], GPUProfile] | None,
    environment: EnvironmentLike,
    strict: bool = False,
    probe: bool = False,
) -> tuple[Spec, dict[str, Setting], GPUProfile, ModelFacts, Resolver]:
    """load, inputs, walk, check: the Resolver holds the outcome, errors included."""
    spec, settings = load(loaded)
    gpu, refs, facts = inputs(loaded, spec, settings, detect)
    ctx = walk(settings, gpu, facts, environment=environment, strict=strict, probe=probe)
    ctx.internal[SOURCE_REFS] = refs
    check(ctx, settings, loaded)
    return spec, settings, gpu, facts, ctx


def load(loaded: LoadedSpec) -> tuple[Spec, dict[str, Setting]]:
    """The spec validated (every problem at once) and flattened into one setting per key."""
    spec = validate_spec(loaded.raw)
    return spec, flatten(spec, loaded.path.parent, loaded.path.stem)


def inputs(
    loaded: LoadedSpec, spec: Spec, settings: Mapping[str, Setting], detect: Callable[[], GPUProfile] | None
) -> tuple[GPUProfile, dict[str, Any], ModelFacts]:
    """What the rules read besides the spec: the GPU, the Hub pins ({} without Hub ids), the model."""
    gpu = resolve_gpu(spec, detect)
    refs = resolve_sources(dict(settings), loaded.path)
    return gpu, refs, load_facts(settings, spec, refs)


def walk(
    settings: dict[str, Setting], gpu: GPUProfile, facts: ModelFacts, *, environment: EnvironmentLike, strict: bool, probe: bool = False
) -> Resolver:
    """Every rule once, in the graph's order (plan/engine/graph.py)."""
    ctx = Resolver(settings, gpu, facts, strict=strict, environment=Environment.of(environment), written_by=writers(ALL_RULES), probe=probe)
    for rule in rule_order(ALL_RULES):
        ctx.rule = rule
        rule.apply(ctx)
        ctx.done.add(rule.id)
    ctx.rule = None
    return ctx


def check(ctx: Resolver, settings: Mapping[str, Setting], loaded: LoadedSpec) -> None:
    """Whole-plan checks that are not rules: the files the run will read, and the fields it reads from their rows."""
    ctx.diagnostics.extend(data_file_problems({k: settings[k].value for k in PATH_LIST_KEYS}, str(loaded.path.parent)))
    values = {k: s.value for k, s in settings.items() if k.startswith("data.") or k in ("model.task", "training.objective")}
    source = settings["model.name_or_path"].value if not settings["model.from_scratch"].value else None
    # as chat_checks decides it (rules/chat_data.py): no template set, and none in the tokenizer
    no_template = settings["data.chat_template"].value is None and (
        source is None or (os.path.isdir(source) and not has_chat_template(source))
    )
    ctx.diagnostics.extend(data_field_problems(values, chat_template_missing=no_template))
    ctx.diagnostics.extend(image_rows(ctx, values, source))
    if not ctx.has_errors:
        ctx.diagnostics.extend(data_steps(ctx, settings, loaded, settings["model.name_or_path"].value))


def image_rows(ctx: Resolver, values: Mapping[str, Any], source: str | None) -> list[Diagnostic]:
    """The images of chat rows: missing, undecodable, resized, or given to a text model (plan/checks/image_rows.py)."""
    from gpuplan.hub.resolve import fetch_command
    from gpuplan.plan.checks.image_rows import image_row_problems

    vision = getattr(ctx.facts, "vision", None)
    family = (getattr(vision, "family", None) or ctx.facts.model_type) if vision is not None else None
    refs = ctx.internal[SOURCE_REFS]
    model_dir = source if isinstance(source, str) and os.path.isdir(source) else None
    if model_dir is None and "model.name_or_path" in refs:  # a Hub model: its snapshot, where a fetched processor lies
        model_dir = os.path.dirname(refs["model.name_or_path"].path)
    out: list[Diagnostic] = []
    files = None
    if family is not None and values.get("data.format") == "chat" and "data.dataset" in refs:
        ref = refs["data.dataset"]
        files = cached_split_files(ref, values.get("data.split") or "train")
        if files is None:
            out.append(
                Diagnostic(
                    "note",
                    "data.dataset",
                    f"data.dataset: the files of split {values.get('data.split') or 'train'!r} of {ref.repo_id} are not in the "
                    "cache, so their images are checked by apply once it has fetched them",
                    fix=f"{fetch_command(ref.repo_id, 'dataset', ref.commit)} to check them at plan time",
                )
            )
    return out + image_row_problems(values, vision_family=family, model_type=ctx.facts.model_type, model_dir=model_dir, dataset_files=files)


def data_steps(ctx: Resolver, settings: Mapping[str, Setting], loaded: LoadedSpec, source: str | None) -> list[Diagnostic]:
    """The optimizer steps the training data gives under the resolved batch split (spec/data_steps.py)."""

    def value(key: str) -> Any:
        return ctx.resolved.get(key, settings[key]).value

    split = [value(k) for k in ("training.per_device_train_batch_size", "training.gradient_accumulation_steps")]
    if not all(isinstance(v, int) and v > 0 for v in split):
        return []
    values = {k: value(k) for k in settings if k.startswith("data.") or k == "training.objective"}
    size = data_size(values, str(loaded.path.parent), source=source, from_scratch=bool(settings["model.from_scratch"].value))
    if size is None:
        return []
    return data_steps_diagnostics(
        size,
        per_device=split[0],
        accumulation=split[1],
        world=world_size(ctx),
        epochs=float(value("training.num_train_epochs")),
        max_steps=value("training.max_steps"),
    )


def preference_example_lengths(resolved: Mapping[str, Setting], loaded: LoadedSpec) -> ExampleLengths | None:
    """A preference objective's local rows' padded lengths (plan/inputs/preference_lengths.py); None otherwise."""
    values = {k: s.value for k, s in resolved.items() if k.startswith(("data.", "preference.")) or k == "training.objective"}
    from_scratch = bool(resolved["model.from_scratch"].value)
    return example_lengths(values, str(loaded.path.parent), source=resolved["model.name_or_path"].value, from_scratch=from_scratch)


def plan_spec(
    loaded: LoadedSpec,
    *,
    detect: Callable[[], GPUProfile] | None,
    environment: EnvironmentLike,
    strict: bool = False,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
    alternatives: bool = True,
    probe: bool = False,
) -> Plan:
    """Spec -> Plan. `prices` (the user's prices file) and `calibrations` (measured runs)
    come from the CLI edge (hardware/userfiles.py); `alternatives` adds, to a plan that does not
    fit, the hardware that would (plan/fit/hardware_alternatives.py); `probe` plans only to
    learn whether it fits (a refusal then carries no fixes: Resolver.probe)."""
    spec, settings, gpu, facts, ctx = resolve(loaded, detect=detect, environment=environment, strict=strict, probe=probe)
    if ctx.has_errors:
        replan = None if not alternatives else (lambda raw: _try_plan(raw, loaded, detect=detect, environment=environment, strict=strict))
        raise refusal(ctx, loaded, spec, gpu, replan=replan)
    return assemble(loaded, spec, settings, gpu, facts, ctx, environment=environment, prices=prices, calibrations=calibrations)


def refusal(
    ctx: Resolver, loaded: LoadedSpec, spec: Spec, gpu: GPUProfile, replan: Callable[[Mapping[str, Any]], Plan | None] | None
) -> PlanError:
    """The walk's errors, then its warnings; a run that does not fit names the hardware that
    would, each planned in full by `replan` (None: do not look)."""
    errors = [d for d in ctx.diagnostics if d.severity == "error"]
    others = [d for d in ctx.diagnostics if d.severity != "error"]
    nofit = ctx.internal.get(NO_FIT)
    if nofit is None:
        return PlanError(errors + others)
    options: tuple[Mapping[str, Any], ...] = tuple(f.changes for f in nofit.fixes)
    if replan is not None:
        from gpuplan.plan.fit.hardware_alternatives import with_hardware_alternatives

        errors, options = with_hardware_alternatives(errors, nofit, loaded, spec, gpu, plan=replan)
    return NoFitError(errors + others, nofit, options)


def _try_plan(raw: Mapping[str, Any], loaded: LoadedSpec, **kw: Any) -> Plan | None:
    """The plan of `loaded` with `raw` as its spec dict, or None when it fails for any reason."""
    try:
        return plan_spec(dataclasses.replace(loaded, raw=dict(raw)), alternatives=False, probe=True, **kw)
    except PlanError:
        return None


def _server_gpus(resolved: Mapping[str, Setting]) -> int:
    """GPUs a vLLM server holds besides the training GPUs (rules/rl.py resolves rl.vllm_server_gpus)."""
    s = resolved.get("rl.vllm_server_gpus")
    backend = resolved.get("rl.generation_backend")
    return int(s.value) if s is not None and backend is not None and backend.value == "vllm-server" and s.value else 0


def _plan_settings(
    loaded: LoadedSpec, settings: Mapping[str, Setting], ctx: Resolver
) -> tuple[dict[str, Setting], list[str], list[Change], list[Diagnostic]]:
    """The plan's settings (the walk's, Hub commits, derived vision.* keys), their key order, the commits' changes and diagnostics."""
    resolved = {k: ctx.resolved.get(k, s) for k, s in settings.items()}
    commits, commit_changes, commit_diags = source_settings(ctx.internal[SOURCE_REFS], loaded.path)
    resolved.update(commits)  # model.commit / data.commit, only for Hub ids
    vision = derived_settings(ctx.internal.get(IMAGE_PLAN), resolved["model.method"].value)  # vision.*: a VLM only
    resolved.update(vision)
    order = [*settings, *commits, *vision]
    return resolved, order, commit_changes, commit_diags


def _throughput_estimator(
    spec: Spec, facts: ModelFacts, wl: Workload, gpu: GPUProfile, tf32: bool, comm: dict[str, Any], lengths: ExampleLengths | None
) -> Callable[..., ThroughputSection]:
    """estimate_throughput bound to the run the plan makes; a calibration's scale and assumption are passed on the call."""
    # more named step-time terms (a saver's time cost, sharded adapters' gathers) go here: plan/estimate/step_time/terms.py Term
    extra_terms: list = []
    return functools.partial(
        estimate_throughput,
        facts,
        wl,
        gpu,
        max_steps=spec.training.max_steps,
        world_size=spec.hardware.world_size,
        tf32=tf32,
        comm=comm,
        extra_terms=extra_terms,
        example_lengths=lengths,
        rl_server_gpus=spec.rl.vllm_server_gpus
        or (spec.rl.vllm_tensor_parallel_size if spec.rl.generation_backend == "vllm-server" else None),
    )


def _calibrated_throughput(
    estimate: Callable[..., ThroughputSection],
    calibrations: Sequence[Mapping[str, Any]] | None,
    method: str,
    wl: Workload,
    sol: Any,
    gpu: GPUProfile,
    hw: HardwareSpec,
    facts: ModelFacts,
) -> tuple[ThroughputSection, tuple[dict[str, float], dict[str, Any]] | None]:
    """The throughput, re-estimated with the scale and start-up of the calibration that matches (if any), and that calibration."""
    throughput = estimate()
    calibrated = None
    if calibrations and throughput.step_time:
        key = calibration_key(throughput.peak_dtype or "fp32", method, wl.gradient_checkpointing, sol.savers)
        calibrated = calibrated_scale(
            calibrations, gpu, hw.count, hw.nodes, key=key, modelled=modelled_parts(throughput.step_time), n_params=facts.n_params
        )
    if calibrated:
        throughput = estimate(scale=calibrated[0], assumption=calibration_assumption(calibrated[1]))
        startup = calibrated[1]["startup_s"]
        if startup is not None and throughput.run_time_s is not None:  # start-up + steps x step time + finish
            throughput = dataclasses.replace(throughput, run_time_s=throughput.run_time_s + startup)
    return throughput, calibrated


def _with_cost_and_interval(
    throughput: ThroughputSection,
    calibrated: tuple[dict[str, float], dict[str, Any]] | None,
    comm: dict[str, Any],
    gpu: GPUProfile,
    gpus: int,
    spec_price: float | None,
    prices: Mapping[str, tuple[float, str]] | None,
) -> ThroughputSection:
    """The throughput section with its communication, calibration, cost over `gpus` GPUs and time interval attached."""
    throughput = dataclasses.replace(
        with_communication(throughput, comm),
        calibration=calibrated[1] if calibrated else None,
        **cost_section(throughput, gpu.name, gpus, spec_price=spec_price, user_prices=prices),
    )
    return dataclasses.replace(
        throughput,
        time_interval=time_interval(
            step_time_s=throughput.step_time_s,
            run_time_s=throughput.run_time_s,
            cost_usd=throughput.cost_usd,
            bound_by=(throughput.step_time or {}).get("bound_by"),
            modelled=throughput.step_time is not None,
            calibrated=bool(calibrated),
            on_cpu=gpu.is_cpu,
        ),
    )


def _model_section(ctx: Resolver, resolved: Mapping[str, Setting], facts: ModelFacts, wl: Workload) -> ModelSection:
    """The plan's model section: the model's facts and what the method trains of it."""
    model = {
        **facts.summary(),
        **trainable_section(
            resolved["model.method"].value, ctx.internal.get(LORA_COUNT), facts, wl.gradient_checkpointing, full_ft_frozen(ctx, facts)
        ),
    }
    return ModelSection.from_dict(model)


def assemble(
    loaded: LoadedSpec,
    spec: Spec,
    settings: Mapping[str, Setting],
    gpu: GPUProfile,
    facts: ModelFacts,
    ctx: Resolver,
    *,
    environment: EnvironmentLike,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> Plan:
    """The Plan of a resolution without errors: memory, throughput, cost, fingerprint."""
    resolved, order, commit_changes, commit_diags = _plan_settings(loaded, settings, ctx)
    sol = ctx.internal[FIT_SOLUTION]
    memory = memory_section(sol, ctx.internal[FIT_PROBLEM], gpu, spec.hardware.headroom, count=spec.hardware.count)
    final = sol.estimate
    hw = spec.hardware
    world = hw.world_size
    wl = solve_workload(ctx.internal[FIT_PROBLEM], sol.per_device_batch, sol.knobs)  # what the plan runs
    tf32 = resolved["training.tf32"].value
    comm = communication(
        facts, wl, gpu, count=hw.count, nodes=hw.nodes, interconnect=hw.interconnect, network=hw.network, networks=load_interconnects()
    )
    # dpo / kto: TRL pads each micro-batch to its longest sequence; the time prices the local rows' expected one
    lengths = preference_example_lengths(resolved, loaded)
    estimate = _throughput_estimator(spec, facts, wl, gpu, tf32, comm, lengths)
    throughput, calibrated = _calibrated_throughput(estimate, calibrations, resolved["model.method"].value, wl, sol, gpu, hw, facts)
    # a vLLM server's GPUs (rl.vllm_server_gpus) are paid beside the training GPUs
    throughput = _with_cost_and_interval(throughput, calibrated, comm, gpu, world + _server_gpus(resolved), hw.price_per_hour, prices)
    hardware = HardwareSection.from_dict({**gpu.to_dict(), "count": hw.count, "nodes": hw.nodes})
    advice = [
        auto_resolved_to_cpu(hw.gpu, gpu),
        long_run(throughput, gpu.is_cpu),
        images_note(ctx.internal.get(IMAGE_PLAN), resolved["model.method"].value, spec.data.seq_len, wl.gradient_checkpointing),
        step_advice(throughput, wl, ctx.internal[FIT_PROBLEM], sol, resolved, facts, gpu, tf32, comm, lengths),
    ]
    model = _model_section(ctx, resolved, facts, wl)
    plan = Plan(
        spec_path=str(loaded.path),
        spec_sha256=loaded.sha256,
        hardware=hardware,
        model=model,
        settings=resolved,
        changes=tuple(sorted([*ctx.changes, *commit_changes], key=lambda c: order.index(c.key))),
        diagnostics=tuple([*ctx.diagnostics, *commit_diags]) + tuple(d for d in advice if d is not None),
        memory=dataclasses.replace(memory, workload=wl, method=final.method),
        throughput=throughput,
    )
    return dataclasses.replace(plan, fingerprint=fingerprint(plan, Environment.of(environment)))


def full_ft_frozen(ctx, facts: ModelFacts) -> int:
    """Parameters a full fine-tune leaves frozen: a VLM's vision tower unless vision.train_tower."""
    image_plan = ctx.internal.get(IMAGE_PLAN)
    if image_plan is None or facts.vision is None or not image_plan.frozen_modules(adapters=False):
        return 0
    return facts.vision.tower_params


def plan_file(
    path: str | Path,
    *,
    detect: Callable[[], GPUProfile] | None = None,
    environment: EnvironmentLike,
    strict: bool = False,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> Plan:
    """Plan a spec file. `overrides` ({"hardware": {"gpu": "H100"}}) stand in for spec keys (CLI flags)."""
    loaded = load_toml(path)
    if overrides:
        loaded = dataclasses.replace(loaded, raw=with_overrides(loaded.raw, overrides))
    return plan_spec(loaded, detect=detect, environment=environment, strict=strict, prices=prices, calibrations=calibrations)


def with_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`raw` (a spec dict) with `overrides` ({"hardware": {"gpu": "H100"}}) in place of its keys."""
    out = dict(raw)
    for section, values in overrides.items():
        out[section] = {**table(raw, section), **values}
    return out
