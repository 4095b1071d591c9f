"""A TrainerCallback that writes metrics.jsonl and keeps the numbers for the summary.

One JSON object per line, flushed at each log so `tail -f` follows the run:
    {"event": "train", "step", "epoch", "loss", "learning_rate", "grad_norm",
     "tokens_per_second", "elapsed_s", "samples_seen"}
and, when an eval split exists, {"event": "eval", "step", "epoch", "eval_loss", ...}. A grpo / rloo line also holds
TRL's reward metrics (rewards/<name>/mean and /std per reward, reward, kl, completion lengths, clip ratios:
render/run_metrics.py RL_METRICS) under TRL's names.
tokens_per_second covers the steps since the previous train line, in wall time (an eval
or a checkpoint save in that interval counts: it is what the run spends); every example
holds seq_len tokens (apply/data/prepare.py), so tokens per step = samples per step x seq_len. A dpo / kto
example's tokens are what the plan expects TRL to pad it to (plan/estimate/padding.py: the batch's
longest sequence, not max_length), so its tokens/s compares the step time with the plan's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TextIO

from transformers import TrainerCallback

from gpuplan.lifecycle.run_dir import METRICS_FILE
from gpuplan.render.run_metrics import RL_METRICS


class MetricsCallback(TrainerCallback):
    def __init__(
        self,
        output_dir: str,
        *,
        samples_per_step: int,
        seq_len: int,
        on_progress: Callable[[int, int | None, int], None] | None = None,
        echo: Callable[[str], None] | None = None,
        live: Any = None,
        started: float | None = None,
        append: bool = False,
    ):
        self.path = os.path.join(output_dir, METRICS_FILE)
        self.samples_per_step = samples_per_step
        self.tokens_per_step = samples_per_step * seq_len
        self.on_progress = on_progress
        self.echo = echo  # per-log line when no progress bar is shown
        self.live = live  # on a terminal: the progress line (progress_line.ProgressLine), on rank 0
        self.started = time.perf_counter() if started is None else started
        self.file: TextIO | None = None
        self.append = append  # a resumed run continues the file of the run it resumes
        self.start_step = 0
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.last_eval_loss: float | None = None
        self.time_to_first_step_s: float | None = None
        self.train_start: float | None = None
        self.train_end: float | None = None
        self._mark = (0, 0.0)  # (global_step, perf_counter) at the previous train line
        self.steady_steps = 0  # steps after the first one, for steady-state throughput
        self.steady_time = 0.0
        self.last_step_end: float | None = None  # perf_counter at the end of the latest optimizer step

    # -- Trainer events -------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # one metrics.jsonl per run, written by rank 0
            if not self.append:
                open(self.path, "w").close()  # a new run starts the file empty
            # O_APPEND: lines others append meanwhile ([eval] sample_at_eval, apply/train/samples.py) are kept
            self.file = open(self.path, "a", encoding="utf-8")
        self.train_start = time.perf_counter()
        self.start_step = state.global_step  # > 0 when resuming from a checkpoint
        self._mark = (state.global_step, self.train_start)
        if self.live is not None and state.is_world_process_zero:
            self.live.begin(state.global_step, state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.time_to_first_step_s is None:
            self.time_to_first_step_s = now - self.started
        elif self.last_step_end is not None:
            self.steady_steps += 1
            self.steady_time += now - self.last_step_end
        self.last_step_end = now
        if self.live is not None and state.is_world_process_zero:
            self.live.update(state.global_step, state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        now = time.perf_counter()
        step = state.global_step
        record: dict[str, Any] | None = None
        if "loss" in logs:
            prev_step, prev_t = self._mark
            dt = now - prev_t
            record = {
                "event": "train",
                "step": step,
                "epoch": logs.get("epoch", state.epoch),
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "tokens_per_second": (step - prev_step) * self.tokens_per_step / dt if dt > 0 else None,
                "elapsed_s": now - (self.train_start or now),
                "samples_seen": step * self.samples_per_step,
            }
            # dpo / kto: TRL's implicit rewards (rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies);
            # grpo / rloo: each reward's rewards/<name>/mean and /std, and the RL metrics as TRL names them
            record.update({k: v for k, v in logs.items() if k.startswith("rewards/") or k in RL_METRICS})
            self._mark = (step, now)
            if self.first_loss is None:
                self.first_loss = float(logs["loss"])
            self.last_loss = float(logs["loss"])
        elif "eval_loss" in logs:
            record = {"event": "eval", "step": step, "epoch": logs.get("epoch", state.epoch)}
            record.update({k: v for k, v in logs.items() if k.startswith("eval_")})
            self.last_eval_loss = float(logs["eval_loss"])
        if record is not None and self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if record is not None and record["event"] == "train" and state.is_world_process_zero:
            if self.on_progress is not None:
                self.on_progress(step, state.max_steps, step * self.samples_per_step)
            if self.live is not None:
                self.live.update(step, state.max_steps, loss=float(record["loss"]), tokens_per_second=record["tokens_per_second"])
            if self.echo is not None:
                tps = record["tokens_per_second"]
                self.echo(
                    f"step {step}/{state.max_steps}  loss {record['loss']:.4f}"
                    + (f"  margin {record['rewards/margins']:.3f}" if "rewards/margins" in record else "")
                    + (f"  accuracy {record['rewards/accuracies']:.2f}" if "rewards/accuracies" in record else "")
                    + (f"  reward {record['reward']:.3f}" if isinstance(record.get("reward"), (int, float)) else "")
                    + (f"  kl {record['kl']:.4f}" if isinstance(record.get("kl"), (int, float)) else "")
                    + (f"  {tps:,.0f} tokens/s" if tps else "")
                )

    def on_train_end(self, args, state, control, **kwargs):
        self.train_end = time.perf_counter()
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()  # also when training stops on an error: the message starts on a line of its own
        if self.file is not None:
            self.file.close()
            self.file = None

    # -- results --------------------------------------------------------
    def tokens_per_second(self, global_step: int) -> float | None:
        """Whole-loop throughput: this session's optimizer steps over the training loop's wall time."""
        if self.train_start is None or self.train_end is None or self.train_end <= self.train_start:
            return None
        return (global_step - self.start_step) * self.tokens_per_step / (self.train_end - self.train_start)

    def steady_tokens_per_second(self) -> float | None:
        """Throughput after the first step (compilation, allocator warm-up and loader start excluded)."""
        if self.steady_steps == 0 or self.steady_time <= 0:
            return None
        return self.steady_steps * self.tokens_per_step / self.steady_time

    def steady_step_time_s(self) -> float | None:
        """Seconds per optimizer step after the first one (the steady rate's step)."""
        return self.steady_time / self.steady_steps if self.steady_steps and self.steady_time > 0 else None

    def startup_s(self) -> float | None:
        """The run's start-up: from the start of apply to the end of the first step (loading the model
        and data, building the Trainer, the first step's compilation and warm-up), less one steady step,
        so that the time to the last step's end is start-up + steps x steady step time."""
        step = self.steady_step_time_s()
        if self.time_to_first_step_s is None or step is None:
            return None
        return max(self.time_to_first_step_s - step, 0.0)
