"""Spec -> Plan: validate, look up hardware and model, walk the rules, assemble.

plan_file() is the one entry point the CLI uses; it never imports torch for a
known architecture (tests/test_plan_imports.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, load_interconnects, lookup
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo import ModelConfigError, model_facts, read_config
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.context import Resolver
from gpuplan.plan.fingerprint import fingerprint
from gpuplan.plan.graph import rule_order, writers
from gpuplan.plan.memory.types import Workload
from gpuplan.plan.rules import ALL_RULES
from gpuplan.plan.communication import communication
from gpuplan.plan.solve import SAVER_COST
from gpuplan.plan.solve import workload as solve_workload
from gpuplan.plan.throughput import estimate_throughput
from gpuplan.plan.types import Diagnostic, Plan, PlanError, Setting
from gpuplan.spec.load import LoadedSpec, load_toml
from gpuplan.spec.schema import SECTIONS, Spec
from gpuplan.spec.validate import validate_spec

PATH_KEYS = ("model.config", "model.name_or_path", "output.dir")
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
            if key in PATH_KEYS and value is not None:
                value = str((spec_dir / value).resolve())
            elif key in PATH_LIST_KEYS:
                value = [str((spec_dir / v).resolve()) for v in value]
            source = "user" if name in obj.model_fields_set else "default"
            out[key] = Setting(value, source)
    if out["output.dir"].value is None:
        out["output.dir"] = Setting(str((Path.cwd() / "runs" / spec_stem).resolve()), "default")
    return out


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
                gpu = dataclasses.replace(gpu, memory_bytes=int(hw.memory_gib * 1024**3))
            return gpu
        gpu = lookup(hw.gpu, hw.memory_gib)
        if gpu.vendor == "cpu" and hw.memory_gib is None:
            from gpuplan.hardware.detect import cpu_profile  # this host's RAM and cores: no torch

            gpu = cpu_profile()[0]
        return gpu
    except (UnknownGPUError, AmbiguousGPUError) as e:
        raise PlanError([Diagnostic("error", "hardware.gpu", f"hardware.gpu = {hw.gpu!r}: {e}",
                                    fix="run `gpuplan gpus` for the catalog")]) from None


def load_facts(settings: Mapping[str, Setting], spec: Spec) -> ModelFacts:
    src_key = "model.config" if settings["model.config"].value else "model.name_or_path"
    try:
        config = read_config(settings[src_key].value)
        return model_facts(config, spec.model.task, spec.model.num_labels or 2)
    except ModelConfigError as e:
        raise PlanError([Diagnostic("error", src_key, f"{src_key}: {e}")]) from None


def plan_spec(
    loaded: LoadedSpec,
    *,
    detect: Callable[[], GPUProfile] | None,
    environment: Mapping[str, Any],
    strict: bool = False,
) -> Plan:
    spec = validate_spec(loaded.raw)
    settings = flatten(spec, loaded.path.parent, loaded.path.stem)
    gpu = resolve_gpu(spec, detect)
    facts = load_facts(settings, spec)
    ctx = Resolver(settings, gpu, facts, strict=strict, environment=dict(environment),
                   written_by=writers(ALL_RULES))
    for rule in rule_order(ALL_RULES):
        ctx.rule = rule
        rule.apply(ctx)
        ctx.done.add(rule.id)
    ctx.rule = None
    if ctx.has_errors:
        raise PlanError([d for d in ctx.diagnostics if d.severity == "error"] +
                        [d for d in ctx.diagnostics if d.severity != "error"])
    resolved = {k: ctx.resolved.get(k, s) for k, s in settings.items()}
    sol = ctx.internal["fit.solution"]
    memory = memory_section(sol, ctx.internal["fit.problem"], gpu, spec.hardware.headroom)
    final = sol.estimate
    world = spec.hardware.count * spec.hardware.nodes
    wl = solve_workload(ctx.internal["fit.problem"], sol.per_device_batch, sol.knobs)  # what the plan runs
    throughput = estimate_throughput(facts, wl, gpu, max_steps=spec.training.max_steps, world_size=world,
                                     tf32=resolved["training.tf32"].value)
    throughput = with_communication(throughput, communication(
        facts, wl, gpu, count=spec.hardware.count, nodes=spec.hardware.nodes,
        interconnect=spec.hardware.interconnect, network=spec.hardware.network, networks=load_interconnects()))
    hardware = {**gpu.to_dict(), "count": spec.hardware.count, "nodes": spec.hardware.nodes}
    model = {**facts.summary(), **trainable_section(resolved["model.method"].value, ctx.internal.get("lora.count"), facts,
                                                   wl.gradient_checkpointing)}
    plan = Plan(
        spec_path=str(loaded.path),
        spec_sha256=loaded.sha256,
        hardware=hardware,
        model=model,
        settings=resolved,
        changes=tuple(sorted(ctx.changes, key=lambda c: list(settings).index(c.key))),
        diagnostics=tuple(ctx.diagnostics),
        memory={**memory, "workload": wl.to_dict(), "method": final.method},
        throughput=throughput,
    )
    return dataclasses.replace(plan, fingerprint=fingerprint(plan, environment))


def trainable_section(method: str, resolved, facts: ModelFacts, checkpointing: bool) -> dict[str, Any]:
    """model.method, model.trainable_params and model.total_params (as peft's
    get_nb_trainable_parameters counts them), and the adapters per target for lora/qlora."""
    count = resolved[0] if resolved else None
    if method not in ("lora", "qlora") or count is None:
        return {"method": method, "trainable_params": facts.n_params, "total_params": facts.n_params}
    return {"method": method, "trainable_params": count.trainable_params, "total_params": count.total_params,
            # apply reads this: checkpointing with a frozen base needs the embeddings' output to require grad
            "adapters": {**count.to_dict(), "enable_input_require_grads": bool(checkpointing)}}


def with_communication(throughput: dict[str, Any], comm: dict[str, Any]) -> dict[str, Any]:
    """Add the data-parallel communication time to the compute time of a step."""
    compute = throughput["step_time_s"]
    step = compute + comm["time_s"]
    out = {**throughput, "compute_step_time_s": compute, "step_time_s": step, "communication": comm,
           "tokens_per_second": throughput["tokens_per_step"] / step}
    if throughput.get("max_steps"):
        out["run_time_s"] = step * throughput["max_steps"]
    return out


def memory_section(sol, problem, gpu: GPUProfile, headroom: float) -> dict[str, Any]:
    est = sol.estimate.to_dict()
    return {
        "allocated_peak_bytes": est["allocated_peak_bytes"],
        "reserved_peak_bytes": est["reserved_peak_bytes"],
        "capacity_bytes": gpu.memory_bytes,
        "usable_bytes": problem.usable_bytes,
        "headroom": headroom,
        "fits": sol.fits,
        "components": est["components"],
        "host_bytes": est["host_bytes"],  # offloaded to host RAM, per GPU
        "layout": sol.knobs.sharding.label,
        "savers": [{"name": n, "saved_bytes": sol.saved_bytes.get(n), "cost": SAVER_COST[n]} for n in sol.savers],
        "notes": est["notes"],
    }


def plan_file(path: str | Path, *, detect: Callable[[], GPUProfile] | None = None,
              environment: Mapping[str, Any], strict: bool = False,
              overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Plan:
    """Plan a spec file. `overrides` ({"hardware": {"gpu": "H100"}}) stand in for spec keys (CLI flags)."""
    loaded = load_toml(path)
    if overrides:
        raw = dict(loaded.raw)
        for section, values in overrides.items():
            table = raw.get(section)
            raw[section] = {**(table if isinstance(table, dict) else {}), **values}
        loaded = dataclasses.replace(loaded, raw=raw)
    return plan_spec(loaded, detect=detect, environment=environment, strict=strict)
