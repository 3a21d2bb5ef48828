"""A tiny Qwen2-style tokenizer and model built offline, for smoke runs of a training loop.

:func:`tiny_tokenizer` is a byte-level tokenizer (every UTF-8 byte one token, so any text
round-trips) with Qwen2's special tokens and a chat template in Qwen2's shape that renders
tools, tool calls (``<tool_call>{json}</tool_call>``) and tool messages;
:func:`tiny_model` is a randomly initialised ``Qwen2ForCausalLM`` of a few thousand
parameters over it. Nothing is downloaded. They need ``transformers``, ``tokenizers`` and
``torch`` (the extra ``gym_harness[train]``), imported when called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_TEMPLATE", "tiny_model", "tiny_tokenizer"]

#: Qwen2's layout: tools in the system turn, tool calls as ``<tool_call>`` blocks in the
#: assistant turn, tool results as ``<tool_response>`` blocks in a user turn.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for call in m.tool_calls or [] %}"
    "{% set f = call.function if call.function is defined else call %}\n<tool_call>\n"
    '{"name": "{{ f.name }}", "arguments": '
    "{{ f.arguments if f.arguments is string else f.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_ADDED = ["<tool_call>", "</tool_call>"]


def tiny_tokenizer(*, chat_template: str = CHAT_TEMPLATE) -> Any:
    """A byte-level ``PreTrainedTokenizerFast`` with Qwen2's chat tokens and template.

    ``eos_token`` is ``<|im_end|>`` (the end of an assistant turn), ``pad_token``
    ``<|endoftext|>``; ``<tool_call>`` and ``</tool_call>`` are single tokens that
    ``decode(..., skip_special_tokens=True)`` keeps.

    Args:
        chat_template: The Jinja chat template (default: :data:`CHAT_TEMPLATE`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=_SPECIAL,
        chat_template=chat_template,
    )
    tokenizer.add_tokens(_ADDED)
    return tokenizer


def tiny_model(tokenizer: Any, *, seed: int = 0, hidden_size: int = 32) -> Any:
    """A randomly initialised two-layer ``Qwen2ForCausalLM`` (float32) over ``tokenizer``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model
