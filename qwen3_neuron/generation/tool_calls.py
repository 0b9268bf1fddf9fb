"""What an assistant turn wrote: its text, reasoning and tool calls, in Qwen3's format.

Qwen3 (and its chat template, which renders a message's `tool_calls` this way) writes each call as
a block `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` after the turn's text,
and its reasoning as a `<think>...</think>` block first. `parse_turn` returns the turn as TRL's
message (`{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}`, each call
`{"type": "function", "function": {"name", "arguments"}}`, as transformers' response parser with
TRL's Qwen3 template gives it) and, per block, the call or what is wrong with it. Parsed here, not
by transformers' `parse_response`: that needs a `response_template` on a transformers tokenizer
(the run holds torchtitan's, and Qwen3's own files set none), and a block it cannot read fails the
whole turn without saying which block or why, when the model must be told what went wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK = re.compile(r"\s*<think>(.*?)</think>\s*", re.DOTALL)


def tool_error(text: str) -> str:
    """The tool message of a call that failed, TRL's: str() of {"error": text}."""
    return str({"error": text})


def is_tool_error(content: str) -> bool:
    """Whether a tool message is `tool_error`'s."""
    return content.startswith("{'error': ")


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` block: the call (`name`, `arguments`) or, when it cannot be one, `error`."""

    name: str
    arguments: dict[str, Any] | None
    error: str | None = None


def parse_turn(text: str) -> tuple[dict[str, Any], list[ToolCall]]:
    """An assistant turn's decoded text (its end-of-turn marker left out) -> TRL's message and its
    tool-call blocks in order (well-formed calls in the message's `tool_calls`; all of them in the list)."""
    reasoning = None
    think = _THINK.match(text)
    if think:
        reasoning, text = think.group(1).strip("\n"), text[think.end():]
    first = text.find(OPEN)
    content = (text if first < 0 else text[:first]).strip()
    calls = [_call(block) for block in _BLOCK.findall(text)]
    unclosed = text.rfind(OPEN) > text.rfind(CLOSE)
    if unclosed:
        calls.append(ToolCall("", None, f"the last {OPEN} block has no {CLOSE}"))
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    called = [c for c in calls if not c.error]
    if called:
        message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in called]  # fmt: skip
    return message, calls


def _call(block: str) -> ToolCall:
    try:
        call = json.loads(block.strip())
    except json.JSONDecodeError as e:
        return ToolCall("", None, f"the tool call is not JSON ({e.msg} at character {e.pos}): {block.strip()[:80]}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return ToolCall("", None, f'a tool call is {{"name": ..., "arguments": {{...}}}}, got {block.strip()[:80]}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string of the object
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], None, f"the arguments of {call['name']} are not a JSON object: {arguments!r:.80}")
    return ToolCall(call["name"], arguments)
