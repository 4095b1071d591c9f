"""Live-storage accounting for a fake-tensor training step.

A TorchDispatchMode sees every op's outputs; each new untyped storage is counted
once (views and in-place results share a storage) and uncounted when its Python
storage object dies (torch preserves the storage PyObject as long as the storage
lives; torch.distributed._tools.mem_tracker relies on the same). The peak is
checked after every op; at each new peak the per-category byte counters are
copied, so the parts at the peak cost nothing extra to find.

Categories (memory.types.COMPONENTS) are assigned as storages are born and moved
when their role becomes known: parameters -> weights; a .grad -> gradients (post-
accumulate-grad hook); a tensor in optimizer.state -> optimizer_states (scanned
after each step); forward outputs -> activations, or logits_loss when their last
outputs born from the LM head (output embeddings) on, in forward (logits, their fp32
copy, the loss) -> logits_loss; backward outputs whose last dimension is the vocabulary (the loss's
gradients) -> logits_loss; other backward and step outputs -> temporaries (recomputed forward inside backward -> activations).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_PENDING = "optimizer_pending"  # born in the step: state or temporary, known after it


class StorageTracker(TorchDispatchMode):
    def __init__(self, logits_last_dims: tuple[int, ...] = ()):
        super().__init__()
        self.logits_last_dims = set(d for d in logits_last_dims if d and d > 1)
        self.info: dict[int, list] = {}  # id(storage) -> [nbytes, category]
        self._refs: dict[int, weakref.ref] = {}
        self.counters: dict[str, int] = {}
        self.live = 0
        self.peak = 0
        self.peak_counters: dict[str, int] = {}
        self.peak_pending: frozenset[int] = frozenset()
        self.peak_where = ""
        self.phase = "idle"  # forward | backward | optimizer | idle
        self.step_index = 0
        self.module_depth = 0
        self.in_head = False  # set once the LM head starts, until the next forward
        self.state_ids: set[int] = set()

    # -- bookkeeping ------------------------------------------------------
    def _add(self, st: torch.UntypedStorage, category: str) -> None:
        key = id(st)
        if key in self.info:
            return
        n = st.nbytes()
        self.info[key] = [n, category]
        self.counters[category] = self.counters.get(category, 0) + n
        self.live += n
        self._refs[key] = weakref.ref(st, lambda _r: self._free(key))

    def _free(self, key: int) -> None:
        rec = self.info.pop(key, None)
        self._refs.pop(key, None)
        if rec is None:
            return
        self.counters[rec[1]] -= rec[0]
        self.live -= rec[0]

    def relabel(self, t: torch.Tensor, category: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key not in self.info:
            self._add(st, category)
            self._check_peak()
            return
        rec = self.info[key]
        if rec[1] != category:
            self.counters[rec[1]] -= rec[0]
            self.counters[category] = self.counters.get(category, 0) + rec[0]
            rec[1] = category

    def _check_peak(self) -> None:
        if self.live > self.peak:
            self.peak = self.live
            self.peak_counters = dict(self.counters)
            self.peak_where = f"step {self.step_index + 1}, {self.phase}"
            if self.counters.get(_PENDING):
                self.peak_pending = frozenset(k for k, r in self.info.items() if r[1] == _PENDING)
            else:
                self.peak_pending = frozenset()

    def _category_for(self, t: torch.Tensor) -> str:
        if self.phase == "backward" and self.module_depth > 0:
            return "activations"  # a checkpointed layer recomputing its forward
        if self.phase == "forward":
            return "logits_loss" if self.in_head else "activations"
        if self.phase == "backward":
            if t.dim() >= 2 and t.shape[-1] in self.logits_last_dims:
                return "logits_loss"
            return "temporaries"
        if self.phase == "optimizer":
            return _PENDING
        if self.phase == "generation":  # online RL: the round's tensors and its no-grad forwards (trace/rl.py)
            return "generation"
        return "temporaries"

    # -- dispatch ---------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage(), self._category_for(t))
        self._check_peak()
        return out

    # -- roles known after the fact ----------------------------------------
    def track_model(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            self._add(p.untyped_storage(), "weights")
        for b in model.buffers():
            self._add(b.untyped_storage(), "weights")
        for t in _quant_state_tensors(model):  # bitsandbytes 4-bit: absmax, code, nested state
            self._add(t.untyped_storage(), "weights")

        def on_grad(p: torch.Tensor) -> None:
            if p.grad is not None:
                self.relabel(p.grad, "gradients")

        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(on_grad)

        def pre(_m, _a):
            self.module_depth += 1

        def post(_m, _a, _o):
            self.module_depth -= 1

        def enter_head(_m, _a):
            self.in_head = True

        hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(pre),
            torch.nn.modules.module.register_module_forward_hook(post, always_call=True),
        ]
        get_head = getattr(model, "get_output_embeddings", None)  # a PreTrainedModel's (a PeftModel forwards it)
        head = get_head() if get_head is not None else None
        if head is not None:
            hooks.append(head.register_forward_pre_hook(enter_head))
        self._hooks = tuple(hooks)

    def track_fused_head(self, model: torch.nn.Module, ref: torch.nn.Module | None) -> None:
        """TRL's fused head never calls the output embedding module: its part starts when a
        backbone returns. A frozen reference's parameters are weights (they get no gradient)."""

        def enter(_m, _a):
            self.in_head = False

        def leave(_m, _a, _o):
            self.in_head = True

        hooks = list(getattr(self, "_hooks", ()))
        for m in (model, ref):
            if m is None:
                continue
            get_base = getattr(m, "get_base_model", None)  # a PeftModel's
            base = cast("PreTrainedModel", get_base() if get_base is not None else m)  # build_model's model
            backbone = base.base_model
            hooks += [backbone.register_forward_pre_hook(enter), backbone.register_forward_hook(leave)]
        if ref is not None:
            for p in ref.parameters():
                self._add(p.untyped_storage(), "weights")
            for b in ref.buffers():
                self._add(b.untyped_storage(), "weights")
        self._hooks = tuple(hooks)

    def close(self) -> None:
        for h in getattr(self, "_hooks", ()):
            h.remove()

    def scan_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """After a step: states are states; what else the step left is a temporary."""
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self.relabel(v, "optimizer_states")
                    self.state_ids.add(id(v.untyped_storage()))
        for _key, rec in list(self.info.items()):
            if rec[1] == _PENDING:
                self.counters[_PENDING] -= rec[0]
                self.counters["temporaries"] = self.counters.get("temporaries", 0) + rec[0]
                rec[1] = "temporaries"

    def peak_components(self) -> dict[str, int]:
        """Bytes per component at the peak; pending step allocations resolved by what became state."""
        parts = {k: v for k, v in self.peak_counters.items() if k != _PENDING and v}
        pending = self.peak_counters.get(_PENDING, 0)
        if pending:
            # bytes of pending storages that became states: their size is still in info
            # when they are alive; states live on, so look them up there.
            as_state = sum(self.info[k][0] for k in self.peak_pending if k in self.state_ids and k in self.info)
            parts["optimizer_states"] = parts.get("optimizer_states", 0) + as_state
            parts["temporaries"] = parts.get("temporaries", 0) + pending - as_state
        return parts


def _quant_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors of every bitsandbytes QuantState (they are neither parameters nor buffers)."""
    out = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        while qs is not None:
            out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
            qs = getattr(qs, "state2", None)
    return out
