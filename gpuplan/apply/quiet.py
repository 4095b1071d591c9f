"""The libraries' progress bars off, on a terminal or not, once the Hub downloads are done.

`gpuplan apply ... > log 2>&1` used to fill the log with tqdm bars redrawn with `\\r`
(datasets' "Generating train split", the tokenize and pack maps, transformers'
"Writing model shards"). Off a terminal apply prints one line per stage and the step
lines instead; each library's own switch turns its bars off, and TQDM_DISABLE (read by
tqdm >= 4.66 as the default of `disable`, tqdm/utils.py envwrap) covers any other tqdm,
including in the processes torchrun starts. On a terminal they were a second display
beside gpuplan's own progress line (progress_line.py), so they are off there too.
"""

from __future__ import annotations

import os


def disable_progress_bars() -> None:
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # datasets/config.py, read at import
    import datasets
    from transformers.utils import logging as transformers_logging

    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars as hub_off

        hub_off()
    except ImportError:  # an older hub without the switch draws no bars apply triggers
        pass
