"""The traced estimate: two real training steps under FakeTensorMode, tiny models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # each case traces a (tiny) real model: about a second

from gpuplan.plan.estimate.memory.types import COMPONENTS, Workload  # noqa: E402
from gpuplan.trace import trace_memory  # noqa: E402

LLAMA = dict(
    model_type="llama",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
)
GPT2 = dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=512)


def _peak(cfg, **kw):
    return trace_memory(cfg, Workload(**{"per_device_batch": 2, "seq_len": 128, **kw}))


def test_parts_add_up_and_nothing_is_allocated():
    est = _peak(LLAMA, amp="bf16")
    assert est.method == "traced"
    assert set(est.components) == set(COMPONENTS)
    assert sum(v for k, v in est.components.items() if k != "overhead") == est.allocated_peak_bytes
    assert est.reserved_peak_bytes == est.allocated_peak_bytes + est.components["overhead"]
    # weights are exactly the parameters (+ the rotary buffer), in fp32
    n_params = 128 * 1000 * 2 + 2 * (128 * 128 * 2 + 2 * 128 * 64 + 3 * 128 * 352 + 2 * 128) + 128
    assert est.components["weights"] >= 4 * n_params
    assert any("wall" in n for n in est.notes)


def test_adamw_states_are_two_per_parameter():
    est = _peak(LLAMA, optim="adamw_torch")
    w = est.components["weights"]
    # exp_avg + exp_avg_sq (+ a 4-byte step per tensor); buffers make weights a bit larger
    assert 2 * w * 0.98 < est.components["optimizer_states"] <= 2 * w + 4 * 64


def test_checkpointing_lowers_the_peak():
    cfg = dict(LLAMA, vocab_size=256)
    off = _peak(cfg, per_device_batch=8, seq_len=512)
    on = _peak(cfg, per_device_batch=8, seq_len=512, gradient_checkpointing=True)
    assert on.components["activations"] < off.components["activations"] / 2
    assert on.allocated_peak_bytes < off.allocated_peak_bytes


def test_more_tokens_more_memory():
    assert _peak(LLAMA, per_device_batch=4).allocated_peak_bytes > _peak(LLAMA, per_device_batch=1).allocated_peak_bytes


def test_eight_bit_states_follow_bitsandbytes_layout():
    pytest.importorskip("bitsandbytes")
    eight = _peak(LLAMA, optim="adamw_8bit")
    adamw = _peak(LLAMA, optim="adamw_torch")
    # embeddings keep 32-bit states (as the Trainer registers them), the rest 8-bit
    assert eight.components["optimizer_states"] < adamw.components["optimizer_states"]


def test_bnb_layout_matches_real_bitsandbytes_init_state():
    """Our pure layout formula against bitsandbytes' own init_state on real CPU tensors."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    from gpuplan.plan.estimate.memory.states import bnb_state_bytes

    bnb.optim.GlobalOptimManager.get_instance().initialize()  # no overrides left by earlier optimizers
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((300, 200), (4095,), (4096,), (1000, 77))]
    opt = bnb.optim.AdamW8bit(params)
    for i, p in enumerate(params):
        opt.init_state(opt.param_groups[0], p, 0, i)
    seen, real = set(), 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                real += v.untyped_storage().nbytes()
    shapes = tuple((str(i), tuple(p.shape)) for i, p in enumerate(params))
    assert bnb_state_bytes(shapes, 2, True) == real


def test_adafactor_and_sgd_run():
    ada = _peak(GPT2, optim="adafactor")
    sgd = _peak(GPT2, optim="sgd")
    assert sgd.components["optimizer_states"] == 0
    assert 0 < ada.components["optimizer_states"] < ada.components["weights"] / 10


def test_gradient_accumulation_keeps_gradients_alive():
    one = _peak(LLAMA, per_device_batch=4, seq_len=256)
    acc = _peak(LLAMA, per_device_batch=4, seq_len=256, gradient_accumulation_steps=2)
    assert acc.components["gradients"] > 0
    assert acc.allocated_peak_bytes > one.allocated_peak_bytes


def test_seq_cls_and_masked_lm():
    bert = dict(model_type="bert", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)
    mlm = _peak(bert, task="masked-lm")
    cls = _peak(bert, task="seq-cls", num_labels=3)
    assert mlm.components["logits_loss"] > cls.components["logits_loss"]


def test_eager_attention_costs_seq_squared():
    cfg = dict(LLAMA, vocab_size=256)
    sdpa = _peak(cfg, seq_len=1024, per_device_batch=1)
    eager = _peak(cfg, seq_len=1024, per_device_batch=1, attn_implementation="eager")
    # eager keeps the (b, a, s, s) fp32 probabilities per layer (4 heads x 1024^2 x 4 bytes each);
    # at the peak at least one layer's are alive
    assert eager.components["activations"] - sdpa.components["activations"] > 4 * 1024 * 1024 * 4
