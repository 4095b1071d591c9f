"""The length TRL 1.16 pads a preference micro-batch to: its longest sequence, in expectation.

TRL's preference collators pad to the longest sequence of the micro-batch, not to max_length:
DataCollatorForPreference (trl/trainer/dpo_trainer.py) truncates each prompt + chosen and prompt +
rejected sequence to max_length (keep_start) and pads the chosen and the rejected sequences of the
micro-batch into one tensor with trl/trainer/utils.py `pad` (the largest shape of the list,
`np.max([t.shape for t in tensors], 0)`; pad_to_multiple_of is None off Neuron, dpo_config.py);
DataCollatorForUnpairedPreference (trl/trainer/kto_trainer.py) does the same for prompt +
completion. So a micro-batch of b examples carries b x sequences x (its longest example) tokens.

An example's length l is that of its longest sequence in the tensor (DPO: max of prompt + chosen and
prompt + rejected, each capped at max_length). The Trainer's RandomSampler cuts a random permutation
into micro-batches, so a micro-batch is a uniform random b-subset of the n rows (each rank's, under
the DistributedSampler, too). With the lengths sorted, l_(1) <= ... <= l_(n), its longest is at most
l_(i) exactly when all b rows are among the i shortest: P(longest <= l_(i)) = C(i, b) / C(n, b), so

    E[longest] = sum_i l_(i) x (C(i, b) - C(i - 1, b)) / C(n, b)

(the distribution of the largest of a sample drawn without replacement, by counting the b-subsets of
the i shortest rows; E[X] = sum of x x P(X = x) over the telescoping differences). Ties need no care:
the terms of equal lengths sum to that length times their share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ExampleLengths:
    """Each training example's longest sequence in tokens (capped at max_length), sorted, and how counted."""

    lengths: tuple[int, ...]
    basis: str  # in words: which rows, and how their tokens were counted

    def expected_longest(self, batch: int) -> float:
        """E[the longest example of a micro-batch of `batch` rows] (module docstring)."""
        ls = sorted(self.lengths)
        n = len(ls)
        b = max(1, min(batch, n))
        total = math.lgamma(n + 1) - math.lgamma(n - b + 1)

        def at_most(i: int) -> float:  # C(i, b) / C(n, b)
            return 0.0 if i < b else math.exp(math.lgamma(i + 1) - math.lgamma(i - b + 1) - total)

        return sum(length * (at_most(i) - at_most(i - 1)) for i, length in enumerate(ls, start=1))

    def padded_length(self, batch: int) -> int:
        """The sequence length the step is priced at: the expectation, rounded up to whole tokens."""
        return math.ceil(self.expected_longest(batch) - 1e-9)
