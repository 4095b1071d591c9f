"""After the run: use what `apply` produced.

finished_run.py  find a spec's finished run and the plan it trained (no torch)
load.py          the trained model and tokenizer: full, merged, or the adapter on its base
evaluate.py      held-out loss and perplexity with the training's masking (gpuplan eval)
lmeval.py        lm-evaluation-harness tasks on the trained model (the `eval` extra)
record.py        evaluations written into gpuplan-state.json
export.py        a merged standalone safetensors model (gpuplan export)

Generation in the training's template (gpuplan generate, gpuplan chat) is apply/model/generation.py
with apply/data/prompting.py: it also runs while apply trains ([eval] sample_prompts,
apply/train/samples.py), so it sits in apply/, below this package.
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "FinishedRun": "gpuplan.after.finished_run",
    "finished_run": "gpuplan.after.finished_run",
    "Loaded": "gpuplan.after.load",
    "load_trained": "gpuplan.after.load",
    "Prompting": "gpuplan.apply.data.prompting",
    "Generation": "gpuplan.apply.model.generation",
    "heldout_loss": "gpuplan.after.evaluate",
    "run_tasks": "gpuplan.after.lmeval",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
