"""The final model directory: safetensors weights and JSON only.

Trainer.save_model also writes training_args.bin, a pickle of the TrainingArguments
(trainer.py `_save`: torch.save(self.args, ...)). gpuplan refuses pickle weights on
load (model.allow_pickle_weights), so it writes none: the arguments go to
training_args.json instead (TrainingArguments.to_json_string), readable without
running code.
"""

from __future__ import annotations

import os
from typing import Any

PICKLED_ARGS = "training_args.bin"
ARGS_JSON = "training_args.json"


def save_final_model(trainer: Any, final_dir: str) -> None:
    """Save through the Trainer (it gathers sharded FSDP/DeepSpeed weights), then drop the pickle."""
    trainer.save_model(final_dir)
    if not trainer.args.should_save:  # only the main process writes files
        return
    pickled = os.path.join(final_dir, PICKLED_ARGS)
    if os.path.exists(pickled):
        os.remove(pickled)
    from gpuplan.fsutil import write_text_atomic

    write_text_atomic(os.path.join(final_dir, ARGS_JSON), trainer.args.to_json_string() + "\n")
