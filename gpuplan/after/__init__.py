"""After the run: use what `apply` produced.

    run.py          find a spec's finished run and the plan it trained (no torch)
    fingerprint.py  what the base model's files looked like when apply read them (no torch)
    load.py         the trained model and tokenizer: full, merged, or the adapter on its base
    prompting.py    prompts in the training's chat / instruction template, and where a turn ends
    generate.py     generation (gpuplan generate, gpuplan chat, [eval] sample_prompts)
    samples.py      [eval] sample_prompts during apply, written to metrics.jsonl
    evaluate.py     held-out loss and perplexity with the training's masking (gpuplan eval)
    lmeval.py       lm-evaluation-harness tasks on the trained model (the `eval` extra)
    record.py       evaluations written into gpuplan-state.json
    export.py       a merged standalone safetensors model (gpuplan export)
"""
