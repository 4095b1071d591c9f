"""Named chat templates for data.chat_template, as Jinja text (torch-free: the plan checks names).

chatml: OpenAI's Chat Markup Language as Qwen and many fine-tunes ship it
(https://github.com/openai/openai-python/blob/release-v0.28.0/chatml.md; the same text as
the "chat_template" of Qwen/Qwen2.5-0.5B-Instruct without its tool branches). Its markers
are plain text, so any tokenizer can encode them, the byte-level one included.
"""

from __future__ import annotations

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CHAT_TEMPLATES = {"chatml": CHATML}
