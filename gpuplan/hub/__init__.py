"""Hugging Face Hub ids for models and datasets: recognise, resolve to a commit, fetch, lock.

ids.py is pure (no huggingface_hub import); resolve.py imports huggingface_hub lazily,
only when a spec names a Hub id, and never torch.
"""
