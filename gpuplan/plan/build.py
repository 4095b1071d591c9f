"""Spec -> Plan: validate, look up hardware and model, walk the rules, assemble.

plan_file() is the one entry point the CLI uses; it never imports torch for a
known architecture (tests/test_plan_imports.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, load_interconnects, lookup
from gpuplan.hardware.prices import price_for
from gpuplan.hardware.profile import GPUProfile
from gpuplan.hub.ids import is_hub_id
from gpuplan.modelinfo import ModelConfigError, model_facts, read_config
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.checks.advice import auto_resolved_to_cpu, long_run
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.lifecycle.fingerprint import fingerprint
from gpuplan.plan.engine.graph import rule_order, writers
from gpuplan.plan.checks.data_files import data_file_problems
from gpuplan.plan.checks.fixed_costs import fixed_costs_advice, fixed_share
from gpuplan.plan.rules import ALL_RULES
from gpuplan.plan.engine.graph import Node
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION, LORA_COUNT, NO_FIT
from gpuplan.plan.sections import HardwareSection, MemorySection, ModelSection, Saver, ThroughputSection
from gpuplan.plan.estimate.communication import communication
from gpuplan.plan.fit.savers import saver_cost
from gpuplan.plan.inputs.environment import Environment, EnvironmentLike
from gpuplan.plan.inputs.sources import resolve_sources, source_settings
from gpuplan.plan.fit.search import workload as solve_workload
from gpuplan.plan.estimate.calibration import calibrated_scale, calibration_assumption, calibration_key, modelled_parts
from gpuplan.plan.estimate.throughput import estimate_throughput
from gpuplan.plan.types import Diagnostic, Plan, PlanError, Setting
from gpuplan.spec.chat_templates import CHAT_TEMPLATES
from gpuplan.spec.load import LoadedSpec, load_toml, table
from gpuplan.spec.schema import SECTIONS, Spec
from gpuplan.spec.validate import validate_spec
from gpuplan.units import GIB
from gpuplan.plan.methods import method_named

PATH_KEYS = ("model.config", "model.name_or_path", "output.dir", "eval.include_path")
PATH_LIST_KEYS = ("data.train_files", "data.eval_files")


def flatten(spec: Spec, spec_dir: Path, spec_stem: str) -> dict[str, Setting]:
    """Every key of every section, as the spec gives it (user) or the default.

    Paths resolve relative to the spec file, so a spec plans the same from anywhere.
    """
    out: dict[str, Setting] = {}
    for section in SECTIONS:
        obj = getattr(spec, section)
        for name in type(obj).model_fields:
            key = f"{section}.{name}"
            value = getattr(obj, name)
            if key == "model.name_or_path" and value is not None and is_hub_id(value, spec_dir):
                pass  # a Hub id stays as written; gpuplan/hub resolves it
            elif key == "data.chat_template" and value is not None and value not in CHAT_TEMPLATES:
                value = str((spec_dir / value).resolve())
            elif key in PATH_KEYS and value is not None:
                value = str((spec_dir / value).resolve())
            elif key in PATH_LIST_KEYS:
                value = [str((spec_dir / v).resolve()) for v in value]
            out[key] = Setting(value, "user" if name in obj.model_fields_set else "default")
    if out["output.dir"].value is None:
        out["output.dir"] = Setting(str((Path.cwd() / "runs" / spec_stem).resolve()), "default")
    if out["training.run_name"].value is None:  # trackers name the run after the spec
        out["training.run_name"] = Setting(spec_stem, "default")
    return out


SOURCE_REFS: Node[dict[str, Any]] = Node("sources")  # Hub ids resolved to commits (inputs/sources.py), for assemble


def resolve_gpu(spec: Spec, detect: Callable[[], GPUProfile] | None) -> GPUProfile:
    """The spec's GPU from the catalog; "auto" calls `detect` (the CLI edge), only then."""
    hw = spec.hardware
    try:
        if hw.gpu == "auto":
            detected = detect() if detect is not None else None
            if detected is None:
                raise PlanError([Diagnostic("error", "hardware.gpu", 'hardware.gpu = "auto" but no device was detected',
                                            fix='set hardware.gpu to a catalog name such as "A100-80GB"')])
            gpu = detected
            if hw.memory_gib is not None:
                gpu = dataclasses.replace(gpu, memory_bytes=int(hw.memory_gib * GIB))
            return gpu
        gpu = lookup(hw.gpu, hw.memory_gib)
        if gpu.is_cpu and hw.memory_gib is None:
            from gpuplan.hardware.detect import cpu_profile  # this host's RAM and cores: no torch

            gpu = cpu_profile()[0]
        return gpu
    except (UnknownGPUError, AmbiguousGPUError) as e:
        raise PlanError([Diagnostic("error", "hardware.gpu", f"hardware.gpu = {hw.gpu!r}: {e}",
                                    fix="run `gpuplan gpus` for the catalog")]) from None


def load_facts(settings: Mapping[str, Setting], spec: Spec, refs: Mapping[str, Any] | None = None) -> ModelFacts:
    src_key = "model.config" if settings["model.config"].value else "model.name_or_path"
    hub = (refs or {}).get(src_key)
    try:
        config = read_config(hub.path if hub is not None else settings[src_key].value)
        return model_facts(config, spec.model.task, spec.model.num_labels or 2)
    except ModelConfigError as e:
        raise PlanError([Diagnostic("error", src_key, f"{src_key}: {e}")]) from None


def resolve(loaded: LoadedSpec, *, detect: Callable[[], GPUProfile] | None, environment: EnvironmentLike,
            strict: bool = False) -> tuple[Spec, dict[str, Setting], GPUProfile, ModelFacts, Resolver]:
    """Validate, look up, and walk every rule; the Resolver holds the outcome, errors included."""
    spec = validate_spec(loaded.raw)
    settings = flatten(spec, loaded.path.parent, loaded.path.stem)
    gpu = resolve_gpu(spec, detect)
    refs = resolve_sources(settings, loaded.path)  # Hub ids -> commits; {} without any
    facts = load_facts(settings, spec, refs)
    ctx = Resolver(settings, gpu, facts, strict=strict, environment=Environment.of(environment),
                   written_by=writers(ALL_RULES))
    for rule in rule_order(ALL_RULES):
        ctx.rule = rule
        rule.apply(ctx)
        ctx.done.add(rule.id)
    ctx.rule = None
    ctx.internal[SOURCE_REFS] = refs
    ctx.diagnostics.extend(data_file_problems({k: settings[k].value for k in PATH_LIST_KEYS}, str(loaded.path.parent)))
    return spec, settings, gpu, facts, ctx


def plan_spec(
    loaded: LoadedSpec,
    *,
    detect: Callable[[], GPUProfile] | None,
    environment: EnvironmentLike,
    strict: bool = False,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
    alternatives: bool = True,
) -> Plan:
    """Spec -> Plan. `prices` (the user's prices file) and `calibrations` (measured runs)
    come from the CLI edge (userfiles.py); `alternatives` adds, to a plan that does not
    fit, the hardware that would (plan/alternatives.py)."""
    spec, settings, gpu, facts, ctx = resolve(loaded, detect=detect, environment=environment, strict=strict)
    if ctx.has_errors:
        errors = [d for d in ctx.diagnostics if d.severity == "error"]
        nofit = ctx.internal.get(NO_FIT)
        if alternatives and nofit is not None:
            from gpuplan.plan.fit.hardware_alternatives import with_hardware_alternatives

            errors = with_hardware_alternatives(errors, nofit, loaded, spec, gpu, plan=lambda raw: _try_plan(
                raw, loaded, detect=detect, environment=environment, strict=strict))
        raise PlanError(errors + [d for d in ctx.diagnostics if d.severity != "error"])
    return assemble(loaded, spec, settings, gpu, facts, ctx, environment=environment, prices=prices,
                    calibrations=calibrations)


def _try_plan(raw: Mapping[str, Any], loaded: LoadedSpec, **kw: Any) -> Plan | None:
    """The plan of `loaded` with `raw` as its spec dict, or None when it fails for any reason."""
    try:
        return plan_spec(dataclasses.replace(loaded, raw=dict(raw)), alternatives=False, **kw)
    except PlanError:
        return None


def assemble(loaded: LoadedSpec, spec: Spec, settings: Mapping[str, Setting], gpu: GPUProfile, facts: ModelFacts,
             ctx: Resolver, *, environment: EnvironmentLike,
             prices: Mapping[str, tuple[float, str]] | None = None,
             calibrations: Sequence[Mapping[str, Any]] | None = None) -> Plan:
    """The Plan of a resolution without errors: memory, throughput, cost, fingerprint."""
    resolved = {k: ctx.resolved.get(k, s) for k, s in settings.items()}
    commits, commit_changes, commit_diags = source_settings(ctx.internal[SOURCE_REFS], loaded.path)
    resolved.update(commits)  # model.commit / data.commit, only for Hub ids
    order = [*settings, *commits]
    sol = ctx.internal[FIT_SOLUTION]
    memory = memory_section(sol, ctx.internal[FIT_PROBLEM], gpu, spec.hardware.headroom)
    final = sol.estimate
    hw = spec.hardware
    world = hw.world_size
    wl = solve_workload(ctx.internal[FIT_PROBLEM], sol.per_device_batch, sol.knobs)  # what the plan runs
    tf32 = resolved["training.tf32"].value
    comm = communication(facts, wl, gpu, count=hw.count, nodes=hw.nodes, interconnect=hw.interconnect,
                         network=hw.network, networks=load_interconnects())
    # more named step-time terms (a saver's time cost, sharded adapters' gathers) go here: plan/estimate/step_time/terms.py Term
    extra_terms: list = []
    throughput = estimate_throughput(facts, wl, gpu, max_steps=spec.training.max_steps, world_size=world, tf32=tf32,
                                     comm=comm, extra_terms=extra_terms)
    calibrated = None
    if calibrations and throughput.get("step_time"):
        key = calibration_key(throughput["peak_dtype"], resolved["model.method"].value, wl.gradient_checkpointing,
                              sol.savers)
        calibrated = calibrated_scale(calibrations, gpu, hw.count, hw.nodes, key=key,
                                      modelled=modelled_parts(throughput["step_time"]))
    if calibrated:
        throughput = estimate_throughput(facts, wl, gpu, max_steps=spec.training.max_steps, world_size=world,
                                         tf32=tf32, comm=comm, scale=calibrated[0], extra_terms=extra_terms,
                                         assumption=calibration_assumption(calibrated[1]))
    throughput = with_communication(throughput, comm)
    throughput = {**throughput, "calibration": calibrated[1] if calibrated else None,
                  **cost_section(throughput, gpu.name, world, spec_price=hw.price_per_hour, user_prices=prices)}
    hardware = HardwareSection.from_dict({**gpu.to_dict(), "count": hw.count, "nodes": hw.nodes})
    advice = [auto_resolved_to_cpu(hw.gpu, gpu), long_run(throughput, gpu.is_cpu),
              step_advice(throughput, wl, ctx.internal[FIT_PROBLEM], sol, resolved, facts, gpu, tf32, comm)]
    model = {**facts.summary(), **trainable_section(resolved["model.method"].value, ctx.internal.get(LORA_COUNT), facts,
                                                   wl.gradient_checkpointing)}
    plan = Plan(
        spec_path=str(loaded.path),
        spec_sha256=loaded.sha256,
        hardware=hardware,
        model=ModelSection.from_dict(model),
        settings=resolved,
        changes=tuple(sorted([*ctx.changes, *commit_changes], key=lambda c: order.index(c.key))),
        diagnostics=tuple([*ctx.diagnostics, *commit_diags]) + tuple(d for d in advice if d is not None),
        memory=dataclasses.replace(memory, workload=wl, method=final.method),
        throughput=ThroughputSection.from_dict(throughput),
    )
    return dataclasses.replace(plan, fingerprint=fingerprint(plan, Environment.of(environment)))


def step_advice(throughput, wl, problem, sol, resolved, facts, gpu, tf32, comm):
    """The fixed-costs advice (plan/checks/fixed_costs.py), checked with the same memory and step models."""
    from gpuplan.plan.fit.search import _fits, price

    def share_at(new):
        return fixed_share(estimate_throughput(facts, new, gpu, max_steps=None, world_size=throughput["world_size"],
                                               tf32=tf32, comm=comm).get("step_time"))

    packing = resolved["data.packing"].value if "data.packing" in resolved else None
    return fixed_costs_advice(throughput.get("step_time"), wl, user_batch=problem.user_batch,
                              user_accumulation=problem.user_accumulation,
                              samples_per_device=problem.samples_per_device, packing=packing,
                              fits=lambda b: _fits(price(problem, b, sol.knobs), problem), share_at=share_at)


def cost_section(throughput: Mapping[str, Any], gpu_name: str, world: int, *, spec_price: float | None,
                 user_prices: Mapping[str, tuple[float, str]] | None) -> dict[str, Any]:
    """price_per_gpu_hour, price_source, cost_usd (run time x GPUs x price); None where unknown."""
    price = price_for(gpu_name, spec_price=spec_price, user_prices=user_prices)
    run = throughput.get("run_time_s")
    return {
        "price_per_gpu_hour": price.usd_per_gpu_hour if price else None,
        "price_source": price.source if price else None,
        "cost_usd": run / 3600 * world * price.usd_per_gpu_hour if price and run is not None else None,
    }


def trainable_section(method: str, resolved, facts: ModelFacts, checkpointing: bool) -> dict[str, Any]:
    """model.method, model.trainable_params and model.total_params (as peft's
    get_nb_trainable_parameters counts them), and the adapters per target for lora/qlora."""
    count = resolved[0] if resolved else None
    if not method_named(method).frozen_base or count is None:
        return {"method": method, "trainable_params": facts.n_params, "total_params": facts.n_params}
    return {"method": method, "trainable_params": count.trainable_params, "total_params": count.total_params,
            # apply reads this: checkpointing with a frozen base needs the embeddings' output to require grad
            "adapters": {**count.to_dict(), "enable_input_require_grads": bool(checkpointing)}}


def with_communication(throughput: dict[str, Any], comm: dict[str, Any]) -> dict[str, Any]:
    """Attach the data-parallel communication section; the step-time model already priced
    it (plan/estimate/step_time/links.py), so compute_step_time_s is the step without what of it
    compute does not hide."""
    step = throughput["step_time_s"]
    if step is None:
        return {**throughput, "compute_step_time_s": None, "communication": comm}
    terms = (throughput.get("step_time") or {}).get("terms", [])
    exposed = sum(t["exposed_s"] for t in terms if t["group"] == "communication")
    out = {**throughput, "compute_step_time_s": step - exposed, "communication": comm}
    if comm.get("time_s"):
        out["notes"] = [*throughput["notes"], (f"the step time includes {exposed:.3g} s of data-parallel "
                        "communication that compute does not hide" if exposed else
                        f"the {comm['time_s']:.3g} s of data-parallel communication per step hide behind compute "
                        "(overlapped: plan/estimate/step_time/links.py)")]
    return out


def memory_section(sol, problem, gpu: GPUProfile, headroom: float) -> MemorySection:
    """The memory section of the solution's estimate; build adds the workload and method."""
    est = sol.estimate.to_dict()
    return MemorySection(
        allocated_peak_bytes=est["allocated_peak_bytes"],
        reserved_peak_bytes=est["reserved_peak_bytes"],
        capacity_bytes=gpu.memory_bytes,
        usable_bytes=problem.usable_bytes,
        headroom=headroom,
        fits=sol.fits,
        components=est["components"],
        host_bytes=est["host_bytes"],  # offloaded to host RAM, per GPU
        layout=sol.knobs.sharding.label,
        savers=tuple(Saver(n, sol.saved_bytes.get(n), saver_cost(n, problem.base.weight_dtype)) for n in sol.savers),
        notes=tuple(est["notes"]),
    )


def plan_file(path: str | Path, *, detect: Callable[[], GPUProfile] | None = None,
              environment: EnvironmentLike, strict: bool = False,
              overrides: Mapping[str, Mapping[str, Any]] | None = None,
              prices: Mapping[str, tuple[float, str]] | None = None,
              calibrations: Sequence[Mapping[str, Any]] | None = None) -> Plan:
    """Plan a spec file. `overrides` ({"hardware": {"gpu": "H100"}}) stand in for spec keys (CLI flags)."""
    loaded = load_toml(path)
    if overrides:
        loaded = dataclasses.replace(loaded, raw=with_overrides(loaded.raw, overrides))
    return plan_spec(loaded, detect=detect, environment=environment, strict=strict, prices=prices,
                     calibrations=calibrations)


def with_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`raw` (a spec dict) with `overrides` ({"hardware": {"gpu": "H100"}}) in place of its keys."""
    out = dict(raw)
    for section, values in overrides.items():
        out[section] = {**table(raw, section), **values}
    return out
