"""A prompt row -> the tokens a GRPO step generates from, and the columns its rewards read (data=prompts).

A row's `prompt` (`data.prompt_field`) is a message list, rendered with the tokenizer's own chat
template with `add_generation_prompt` (GRPO's tools' schemas, then those of `data.tools_field` as
data=chat hands them), or a string, tokenized as it is (TRL's standard prompts). Every other column goes to the reward
functions as it is (`columns`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qwen3_neuron.data.chat_rows import ChatFormatError, row_conversation, row_tools

PROMPT = "prompt_length"  # a prompt sample's key: how many of its `input` tokens are the prompt
ROW = "row"  # a prompt sample's key: the row's columns as JSON (the rewards read them)
DEFAULT_PROMPT_FIELD = "prompt"


def prompt_field(source) -> str:
    return source.prompt_field or DEFAULT_PROMPT_FIELD


def prompt_tokens(tokenizer, row: Mapping[str, Any], source) -> list[int]:
    """The prompt's token ids, ending where the completion starts."""
    field = prompt_field(source)
    prompt = row.get(field)
    if prompt in (None, "", []):
        raise ChatFormatError(f"data.prompt_field={field}: the row has no prompt (its columns: {', '.join(sorted(row))})")
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_bos=True, add_eos=False)
    if not isinstance(prompt, list):
        shape = "one message, not a list of them" if isinstance(prompt, Mapping) else f"a {type(prompt).__name__}"
        raise ChatFormatError(f"data.prompt_field={field}: the prompt is {shape}; a prompt is a list of messages "
                              '([{"role": "user", "content": "..."}]) or a string')  # fmt: skip
    messages = row_conversation({"_listed": list(prompt)}, _as_chat(source), check=False).messages
    if messages[-1]["role"] == "assistant":
        raise ChatFormatError(f"data.prompt_field={field}: the prompt ends with an assistant turn; the "
                              "completion is the next assistant turn")  # fmt: skip
    tools = [*(source.tools or []), *(row_tools(row, source.tools_field) or [])]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **({"tools": tools} if tools else {}))
    ids = list(tokenizer.tokenizer.encode(text).ids)
    bos = getattr(tokenizer, "bos_id", None)
    if bos is not None and not getattr(tokenizer, "hf_adds_bos", False):
        ids = [bos, *ids]  # as torchtitan's encode(add_bos=True), and data=chat
    return ids


def row_columns(row: Mapping[str, Any]) -> str:
    """The row as JSON (every column, the prompt too), as a sample carries it to the step."""
    return json.dumps(dict(row), default=str)


def _as_chat(source):
    from dataclasses import replace

    return replace(source, format="chat", messages_field="_listed", prompt_field=None, response_field=None)
