"""The training objective (what the loss is), a descriptor per objective, independent of the method.

The method (full / lora / qlora) says what trains and how the base is stored; the objective
says what one example costs: how many sequences run through the policy with gradients,
what else the step runs (a frozen reference model, a no-grad KL forward), and which TRL
trainer applies it. Rules, the memory model and the step-time model read these fields
instead of branching on the objective's name.

The objectives are those TRL 1.16 ships as stable trainers (`trl.DPOTrainer`, `trl.KTOTrainer`,
and for online RL `trl.GRPOTrainer`, `trl.RLOOTrainer`; trl/__init__.py). ORPO is only under
`trl.experimental.orpo` there (trl/experimental/orpo), so it
is refused with that reason (spec/validate.py) rather than planned on an API TRL may change.

Sources, TRL 1.16:
- DPO (trainer/dpo_trainer.py `_compute_loss`): the collator concatenates [chosen; rejected], so
  the policy runs 2 sequences per example with gradients; the reference (a frozen model, the
  base with adapters disabled for peft, or log-probs precomputed before training) runs the
  same 2 sequences without gradients. Loss default `sigmoid`, beta 0.1, learning rate 1e-6 (dpo_config.py).
- KTO (trainer/kto_trainer.py `_compute_loss`): one completion per example with gradients,
  plus a mismatched KL completion (the batch's completions shifted by one) through the
  policy without gradients; the reference runs both. Loss default `kto`, beta 0.1, learning rate 1e-6 (kto_config.py).
  loss_type = "apo_zero_unpaired" computes no KL term (kto_trainer.py `__init__`: calculate_kl =
  args.loss_type not in ["apo_zero_unpaired"]; `_compute_kl_logps` and the reference's KL forward run only
  under calculate_KL): one completion through the policy with gradients and through the reference, nothing else.
- Both replace the model's LM head by a fused, chunked log-prob head (trainer/utils.py
  `add_fused_lm_head`, kernels/chunked_logprob.py): no (tokens x vocab) logits are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "Objective",
    "OBJECTIVES",
    "EXPERIMENTAL_IN_TRL",
    "GRPO_LOSSES",
    "computes_kl",
    "min_per_device_batch",
    "objective",
    "rl_objective",
]


@dataclass(frozen=True)
class Objective:
    name: str
    summary: str  # how the plan names it
    grad_sequences: int  # sequences per example through the policy with gradients
    nograd_policy_sequences: int  # sequences per example through the policy without gradients (KTO's KL)
    reference_sequences: int  # sequences per example through the reference model (no gradients)
    fused_head: bool  # TRL's chunked log-prob head instead of the model's logits + cross-entropy
    logprob_tensors: tuple[str, ...]  # the loss's extra per-token fp32 tensors (policy side)
    trainer_class: str  # the Trainer subclass apply builds
    config_class: str  # its TrainingArguments subclass
    trl_module: str | None  # where both live; None: transformers itself
    loss_types: tuple[str, ...]  # loss_type values the trainer accepts (TRL's names)
    default_loss: str | None
    default_beta: float | None
    default_learning_rate: float | None  # the trainer config's own default, where it differs from the Trainer's
    example_fields: tuple[str, ...]  # the columns a row must have
    metrics: tuple[str, ...] = ()  # the trainer's logged metrics the run records beside the loss
    collator_class: str | None = None  # the trainer's own collator (TRL's); None: gpuplan's (apply/data/prepare.py)
    config_sampling: bool = False  # its config has train_sampling_strategy (TRL 1.16 KTOConfig; kto_config.py)
    # online RL (grpo, rloo): the examples are completions the policy generates in the run, scored by rewards
    online: bool = False
    default_num_generations: int | None = None  # completions per prompt (the group), the config's default

    @property
    def needs_reference(self) -> bool:
        return self.reference_sequences > 0

    @property
    def is_preference(self) -> bool:
        """Offline preference tuning on given completions (dpo, kto)."""
        return self.name != "sft" and not self.online

    @property
    def is_rl(self) -> bool:
        """Online RL (grpo, rloo): [rl] applies, the rows are prompts."""
        return self.online

    @property
    def paired(self) -> bool:
        """A row is a chosen / rejected pair, both through the policy (DPO)."""
        return "chosen" in self.example_fields

    @property
    def labelled_completions(self) -> bool:
        """A row is one completion with a desirable / undesirable label (KTO); TRL unpairs pair rows into two."""
        return "completion" in self.example_fields

    def flops_multiplier(self, reference_forward: bool = True) -> float:
        """Step FLOPs per example over SFT's (one sequence, forward + backward = 3 forwards):
        policy forward + backward on the graded sequences, forwards alone for the rest."""
        forwards = 3 * self.grad_sequences + self.nograd_policy_sequences
        if reference_forward:
            forwards += self.reference_sequences
        return forwards / 3


SFT = Objective(
    name="sft",
    summary="supervised fine-tuning (next-token cross-entropy)",
    grad_sequences=1,
    nograd_policy_sequences=0,
    reference_sequences=0,
    fused_head=False,
    logprob_tensors=(),
    trainer_class="Trainer",
    config_class="TrainingArguments",
    trl_module=None,
    loss_types=(),
    default_loss=None,
    default_beta=None,
    default_learning_rate=None,
    example_fields=(),
)

# dpo_config.py DPOConfig.loss_type help: the values _compute_loss implements
DPO_LOSSES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
# Losses of DPO_LOSSES that run as named only with DPOConfig.label_smoothing > 0 (trl/trainer/dpo_config.py,
# default 0.0), which no spec key sets: plan/rules/preference.py refuses them rather than run something
# else, and the schema's enum leaves them out (spec/value_types.py preference_loss_names).
NEEDS_LABEL_SMOOTHING = {
    "exo_pair": "needs label_smoothing > 0 (TRL's DPOTrainer refuses 0.0: \"Label smoothing must be greater than "
    "0.0 when using 'exo_pair' loss\"), which gpuplan does not set",
    "robust": "with label_smoothing 0 (TRL's default; gpuplan does not set it) is exactly the sigmoid loss: "
    "-((1 - e) log s(bx) - e log s(-bx)) / (1 - 2e) at e = 0, so robust DPO would not run",
}
PREFERENCE_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")

DPO = Objective(
    name="dpo",
    summary="direct preference optimization (Rafailov et al. 2023) on chosen/rejected pairs",
    grad_sequences=2,
    nograd_policy_sequences=0,
    reference_sequences=2,
    fused_head=True,
    # per token: log-prob (with grad), entropy, mean logit, top-1 flag (the trainer's metrics), ref log-prob
    logprob_tensors=("log_probs", "entropy", "mean_logits", "is_top1", "ref_log_probs"),
    trainer_class="DPOTrainer",
    config_class="DPOConfig",
    trl_module="trl",
    loss_types=DPO_LOSSES,
    default_loss="sigmoid",
    default_beta=0.1,
    default_learning_rate=1e-6,  # dpo_config.py: "`learning_rate`: Defaults to `1e-6` instead of `5e-5`"
    example_fields=("prompt", "chosen", "rejected"),
    metrics=PREFERENCE_METRICS,
    collator_class="DataCollatorForPreference",  # trl/trainer/dpo_trainer.py
)

KTO = Objective(
    name="kto",
    summary="Kahneman-Tversky optimization (Ethayarajh et al. 2024) on labelled completions",
    grad_sequences=1,
    nograd_policy_sequences=1,
    reference_sequences=2,
    fused_head=True,
    logprob_tensors=("log_probs", "entropy", "mean_logits", "is_top1", "ref_log_probs"),
    trainer_class="KTOTrainer",
    config_class="KTOConfig",
    trl_module="trl",
    loss_types=("kto", "apo_zero_unpaired"),
    default_loss="kto",
    default_beta=0.1,  # kto_config.py
    default_learning_rate=1e-6,  # kto_config.py: "`learning_rate`: Defaults to `1e-6` instead of `5e-5`"
    example_fields=("prompt", "completion", "label"),
    metrics=PREFERENCE_METRICS,
    collator_class="DataCollatorForUnpairedPreference",  # trl/trainer/kto_trainer.py
    config_sampling=True,
)

# grpo_config.py GRPOConfig.loss_type help: "Supported values are 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo',
# 'sapo', 'luspo', and 'vespo'"; default "dapo"
GRPO_LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
# Losses of GRPO_LOSSES that TRL 1.16 runs only with settings no [rl] key sets: the plan refuses them with the
# reason (plan/rules/rl.py) and the schema's enum leaves them out (spec/value_types.py rl_loss_names).
GRPO_NEEDS_SETTINGS = {
    "luspo": 'needs importance_sampling_level = "sequence" (grpo_config.py loss_type help: luspo "requires '
    "`importance_sampling_level='sequence'`\"), which no [rl] key sets (TRL's default is \"token\")",
    "vespo": 'needs vLLM importance sampling in a token mode (grpo_trainer.py __init__: "VESPO loss requires '
    "`vllm_importance_sampling_mode` to be either 'token_truncate' or 'token_mask'\"; the default is \"sequence_mask\"), "
    "which no [rl] key sets",
}
RL_METRICS = ("reward", "reward_std", "kl", "completions/mean_length", "completions/clipped_ratio")

# TRL 1.16 GRPOTrainer (trainer/grpo_trainer.py): each row of a micro-batch is one completion (prompt +
# completion ids), its loss over the completion tokens through the fused log-prob head (add_fused_lm_head,
# outputs log_probs and entropy). Without gradients, in _generate_and_score_completions: the policy's "old"
# log-probs when generation and optimization are misaligned or vLLM's importance-sampling correction is on
# (vllm_importance_sampling_correction, default True), and the reference's when beta != 0. rl_objective gives
# the descriptor of a planned run; these are the defaults (grpo: beta 0.0, no reference; rloo: beta 0.05).
GRPO = Objective(
    name="grpo",
    summary="group relative policy optimization (Shao et al. 2024): completions sampled per prompt, scored by rewards",
    grad_sequences=1,
    nograd_policy_sequences=0,
    reference_sequences=0,
    fused_head=True,
    logprob_tensors=("log_probs", "entropy"),
    trainer_class="GRPOTrainer",
    config_class="GRPOConfig",
    trl_module="trl",
    loss_types=GRPO_LOSSES,
    default_loss="dapo",  # grpo_config.py loss_type default
    default_beta=0.0,  # grpo_config.py beta: "If `0.0` (default), the reference model is not loaded"
    default_learning_rate=1e-6,  # grpo_config.py learning_rate default
    example_fields=("prompt",),
    metrics=RL_METRICS,
    online=True,
    default_num_generations=8,  # grpo_config.py num_generations
)
# TRL 1.16 RLOOTrainer (trainer/rloo_trainer.py): the same step, with the policy's old log-probs always computed
# without gradients (_generate_and_score_completions), the REINFORCE leave-one-out baseline, no loss_type.
RLOO = Objective(
    name="rloo",
    summary="REINFORCE leave-one-out (Ahmadian et al. 2024): completions sampled per prompt, scored by rewards",
    grad_sequences=1,
    nograd_policy_sequences=1,
    reference_sequences=1,
    fused_head=True,
    logprob_tensors=("log_probs", "entropy"),
    trainer_class="RLOOTrainer",
    config_class="RLOOConfig",
    trl_module="trl",
    loss_types=(),
    default_loss=None,
    default_beta=0.05,  # rloo_config.py beta
    default_learning_rate=1e-6,  # rloo_config.py learning_rate default
    example_fields=("prompt",),
    metrics=RL_METRICS,
    online=True,
    default_num_generations=2,  # rloo_config.py num_generations
)

OBJECTIVES = {o.name: o for o in (SFT, DPO, KTO, GRPO, RLOO)}


def rl_objective(name: str, beta: float, old_logprobs: bool) -> Objective:
    """The descriptor of a planned grpo / rloo step: the reference forward runs when beta != 0 (both trainers
    skip it at 0.0), the policy's no-grad forward for the old log-probs when `old_logprobs` (rloo: always)."""
    base = OBJECTIVES[name]
    return replace(
        base,
        reference_sequences=1 if beta != 0 else 0,
        nograd_policy_sequences=1 if (old_logprobs or name == "rloo") else 0,
    )


# KTO losses without the KL term: trl/trainer/kto_trainer.py `__init__`, calculate_kl = args.loss_type not in
# ["apo_zero_unpaired"]; without it `_compute_kl_logps` returns None before any forward (policy and reference)
NO_KL_LOSSES = ("apo_zero_unpaired",)
KTO_WITHOUT_KL = replace(KTO, nograd_policy_sequences=0, reference_sequences=1)

# The saver a reference-holding objective adds (rules/preference.py fit_with_reference): no frozen copy,
# the reference log-probs computed once per example before training (TRL's precompute_ref_log_probs)
PRECOMPUTED_REFERENCE = "precomputed reference log-probs"
PRECOMPUTED_REFERENCE_COST = (
    "the reference forwards run once per example before training instead of in every "
    "step (no more FLOPs for one epoch; the first step waits for them); no reference "
    "copy in memory"
)

# Objectives TRL 1.16 has only under trl.experimental: why gpuplan does not plan them yet.
EXPERIMENTAL_IN_TRL = {
    "orpo": "TRL 1.16 ships ORPO only as trl.experimental.orpo.ORPOTrainer (an experimental API, no "
    "stability promise); gpuplan plans the stable trainers: dpo, kto, grpo and rloo",
    "cpo": "TRL 1.16 ships CPO only under trl.experimental; gpuplan plans the stable trainers: dpo, kto, grpo and rloo",
}


def min_per_device_batch(name: str | None, loss_type: str | None) -> int:
    """The smallest per-device batch the objective's trainer runs. KTO's KL term pairs each
    completion with another example's in the same micro-batch, so TRL 1.16 refuses a per-device
    batch of 1 for every loss that computes it, all but apo_zero_unpaired (trl/trainer/kto_trainer.py
    `__init__`: "Actual (not effective) batch size must be > 1"; calculate_kl = loss_type not in
    ["apo_zero_unpaired"])."""
    if computes_kl(name, loss_type):
        return 2
    return 1


def computes_kl(name: str | None, loss_type: str | None) -> bool:
    """Whether TRL's KTOTrainer estimates the KL term (a mismatched completion per example through the
    policy and the reference, each without gradients): every KTO loss but apo_zero_unpaired."""
    return name == "kto" and loss_type not in NO_KL_LOSSES


def objective(name: str | None, loss_type: str | None = None) -> Objective:
    """The descriptor of training.objective (sft when unset); for KTO, `loss_type` says whether the step
    runs the KL forwards (apo_zero_unpaired: none, KTO_WITHOUT_KL). Without a loss type: the default loss's."""
    if name == "kto" and loss_type in NO_KL_LOSSES:
        return KTO_WITHOUT_KL
    return OBJECTIVES[name or "sft"]
