"""A chat row -> a conversation -> tokens, with the tokens that carry a loss marked.

Rows come in the shapes data sets ship (`row_conversation`): OpenAI/HF `messages` (assistant
`tool_calls` with `content` null or absent, `tool` turns, `reasoning_content`, a row-level tools
list), ShareGPT `conversations` of `{from, value}` (mapped to roles by `role_map`), or instruction
columns (a prompt, Alpaca's optional `input` joined to it, an optional system column, a
response). Whatever else a message carries goes to the template untouched.

The conversation is rendered with the tokenizer's own chat template (torchtitan's
`BaseTokenizer.apply_chat_template`, the model dir's template, `tools` passed as the template
expects), tokenized once, and each token is marked trained when its text lies in an assistant
turn: everything the template writes for it -- its reasoning block, its text, its tool-call
markup -- and its end-of-turn marker (`<|im_end|>` for Qwen3's ChatML); never the system, user or
tool turns, the tool schemas or the role header. The "\\n" the template writes after the marker
is not trained: generation stops at the marker and never emits it.

Where an assistant turn starts: the rendering of the messages before it with
`add_generation_prompt=True` ends there, and must be a prefix of the whole rendering (a template
for which it is not cannot be masked, and says so). Where it ends: the first end-of-turn marker
after its start. The marker is found once per tokenizer from a probe conversation, not assumed;
turns are not found by re-rendering each prefix as a whole conversation, which Qwen3's own
template renders differently (its last assistant turn gets a `<think>` block, and reasoning of
turns before the last user message is not rendered at all).

Openings (`data.thinking`): Qwen3's template opens the final assistant turn with a `<think>` block
(empty without reasoning) and earlier turns without one. With `empty_block` (the default) every
turn the template leaves without a block gets the empty block the template writes for a final turn
(found once per tokenizer from a probe, not assumed), inside the turn's trained span: every turn
teaches one opening. `as_rendered` keeps the template's text.

Token ids come from the underlying `tokenizers.Tokenizer` with character offsets, so a span
boundary inside a BPE merge cannot shift the labels; a token is trained when its characters
overlap an assistant span.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qwen3_neuron.errors import DataError

KNOWN_ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's speakers -> roles; "tool_call" is an assistant turn whose value is the call's JSON
SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "function_call": "tool_call", "observation": "tool", "tool": "tool",
}  # fmt: skip
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class ChatFormatError(DataError):
    """A row that is not a conversation this module can train on; the message says why (the
    callers that know the row's file and line name them; one that escapes is still the user's
    data error, said as one sentence)."""


@dataclass
class Conversation:
    """Messages as the chat template takes them, and the row's tool schemas (None: no tools)."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools} if self.tools else {}


def row_conversation(row: Mapping[str, Any], source, check: bool = True) -> Conversation:
    """The conversation in `row`, read as `source` (a DataSource) says: its `messages_field`
    list, or instruction columns when `prompt_field` / `response_field` are set. Checked: roles
    known, tool calls named with JSON arguments, tool results after a call, an assistant turn
    (`check=False`: the messages only, for a part of a conversation: data=preference's prompt)."""
    if source.prompt_field or source.response_field:
        messages = _instruction_messages(row, source)
    else:
        listed = row.get(source.messages_field)
        if not isinstance(listed, Sequence) or isinstance(listed, str):
            raise ChatFormatError(
                f"data.messages_field={source.messages_field}: expected a list of {{role, content}} "
                f"(or ShareGPT {{from, value}}), got {type(listed).__name__}"
            )
        role_map = source.role_map or SHAREGPT_ROLES
        messages = [_message(m, source.messages_field, i, role_map) for i, m in enumerate(listed)]
    if source.reasoning == "drop":
        messages = [_without_reasoning(m) for m in messages]
    if check:
        check_messages(messages)
    return Conversation(messages, row_tools(row, source.tools_field))


def _instruction_messages(row: Mapping[str, Any], source) -> list[dict[str, Any]]:
    """A user prompt (Alpaca's `input` joined to it when present) and an assistant response,
    after a system turn when `system_field` names a column that is filled."""
    for key, name in (("data.prompt_field", source.prompt_field), ("data.response_field", source.response_field)):
        if not name:
            raise ChatFormatError(f"{key} is not set: data.prompt_field and data.response_field go together")
        if not isinstance(row.get(name), str):
            raise ChatFormatError(f"{key}={name}: expected a string, got {type(row.get(name)).__name__}")
    prompt = row[source.prompt_field]
    extra = row.get(source.input_field) if source.input_field else None
    if extra is not None and not isinstance(extra, str):
        raise ChatFormatError(f"data.input_field={source.input_field}: expected a string, got {type(extra).__name__}")
    if extra:
        prompt = f"{prompt}\n\n{extra}"  # Alpaca's layout: the instruction, then its input
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": row[source.response_field]}]
    system = row.get(source.system_field) if source.system_field else None
    if system is not None and not isinstance(system, str):
        raise ChatFormatError(f"data.system_field={source.system_field}: expected a string, got {type(system).__name__}")
    return [{"role": "system", "content": system}, *messages] if system else messages


def _message(message: Any, field: str, index: int, role_map: Mapping[str, str]) -> dict[str, Any]:
    where = f"{field}[{index}]"
    if isinstance(message, Mapping) and "role" not in message and "from" in message:
        return _sharegpt_message(message, where, role_map)
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ChatFormatError(f"{where}: expected {{role, content}} or {{from, value}}, got {message!r:.80}")
    out = dict(message)  # what the template may read besides role and content goes through untouched
    where = f"{where} ({message['role']})"
    if out.get("tool_calls") is not None:
        if not isinstance(out["tool_calls"], Sequence) or isinstance(out["tool_calls"], str):
            raise ChatFormatError(f"{where}: tool_calls must be a list, got {out['tool_calls']!r:.80}")
        out["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(out["tool_calls"])]
    out["content"] = _content(message.get("content"), where, has_tool_calls=bool(out.get("tool_calls")))
    reasoning = out.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ChatFormatError(f"{where}: reasoning_content must be a string, got {reasoning!r:.80}")
    return out


def _sharegpt_message(message: Mapping[str, Any], where: str, role_map: Mapping[str, str]) -> dict[str, Any]:
    speaker, value = message["from"], message.get("value")
    role = role_map.get(speaker)
    if role is None:
        known = ", ".join(f"{k} -> {v}" for k, v in role_map.items())
        raise ChatFormatError(f"{where}: unknown ShareGPT speaker {speaker!r}; data.role_map maps {known}")
    if not isinstance(value, str):
        raise ChatFormatError(f"{where} ({speaker}): value must be a string, got {value!r:.80}")
    if role != "tool_call":
        return {"role": role, "content": value}
    try:
        calls = json.loads(value)
    except json.JSONDecodeError as e:
        raise ChatFormatError(f"{where} ({speaker}): the call is not JSON ({e}): {value!r:.80}") from e
    calls = calls if isinstance(calls, list) else [calls]
    return {"role": "assistant", "content": "",
            "tool_calls": [_tool_call(c, f"{where} ({speaker})") for c in calls]}  # fmt: skip


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """A tool call as OpenAI ({type, function: {name, arguments}}) or flat ({name, arguments});
    arguments an object or a JSON string of one, kept in the form the data gave them."""
    function = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ChatFormatError(f"{where}: a tool call needs a function name, got {call!r:.80}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ChatFormatError(f"{where} ({function['name']}): arguments are not JSON ({e}): {arguments!r:.80}") from e
    else:
        parsed = arguments
    if not isinstance(parsed, Mapping):
        raise ChatFormatError(f"{where} ({function['name']}): arguments must be a JSON object, got {arguments!r:.80}")
    return dict(call)


def _content(content: Any, where: str, has_tool_calls: bool) -> str:
    """A message's text: a string, text parts joined, or "" for a tool-calling turn without any."""
    if isinstance(content, str):
        return content
    if content is None and has_tool_calls:
        return ""
    if isinstance(content, Sequence) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise ChatFormatError(f"{where}: content must be a string (or null beside tool_calls), got {content!r:.80}")


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """data.reasoning=drop: the turn as a model that answers without thinking would write it."""
    if message["role"] != "assistant":
        return message
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    out["content"] = _THINK_BLOCK.sub("", out["content"], count=1) if "</think>" in out["content"] else out["content"]
    return out


def row_tools(row: Mapping[str, Any], tools_field: str | None) -> list[Any] | None:
    """The row's tool schemas: a list, or a JSON string of one (as many data sets store them)."""
    tools = row.get(tools_field) if tools_field else None
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ChatFormatError(f"data.tools_field={tools_field}: not a JSON list of tools ({e})") from e
    if tools is None or (isinstance(tools, Sequence) and not isinstance(tools, str)):
        return list(tools) if tools else None
    raise ChatFormatError(f"data.tools_field={tools_field}: expected a list of tools, got {type(tools).__name__}")


def check_messages(messages: list[dict[str, Any]]) -> None:
    unknown = sorted({m["role"] for m in messages} - set(KNOWN_ROLES))
    if unknown:
        raise ChatFormatError(f"unknown role {', '.join(map(repr, unknown))}; roles are {', '.join(KNOWN_ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ChatFormatError("no assistant turn: nothing to train on (roles: "
                              f"{', '.join(m['role'] for m in messages) or 'none'})")  # fmt: skip
    called = False
    for index, message in enumerate(messages):
        called = called or bool(message.get("tool_calls"))
        if message["role"] == "tool" and not called:
            raise ChatFormatError(f"message {index} is a tool result with no assistant tool call before it")


class ChatRenderer:
    """Renders and tokenizes conversations with one tokenizer (torchtitan `HuggingFaceTokenizer`)."""

    def __init__(self, tokenizer, train_on_prompt: bool = False, thinking: str = "empty_block"):
        if getattr(tokenizer, "_chat_template", None) is None:
            raise ChatFormatError(
                f"the tokenizer in {getattr(tokenizer, 'tokenizer_path', '?')} has no chat template "
                "(tokenizer_config.json 'chat_template' or chat_template.jinja)"
            )
        self._tokenizer = tokenizer
        self._train_on_prompt = train_on_prompt
        self.end_of_turn = end_of_turn_marker(tokenizer.apply_chat_template)
        # data.thinking=empty_block: what every assistant turn without a block opens with ("" : as rendered)
        self.opening = empty_opening(tokenizer.apply_chat_template) if thinking == "empty_block" else ""
        self._renders_tools: bool | None = None

    def render(self, conversation: Conversation) -> str:
        return self._tokenizer.apply_chat_template(conversation.messages, **conversation.template_kwargs())

    def tokens(self, conversation: Conversation, trained_from: int = 0) -> tuple[list[int], list[bool]]:
        """Token ids of the rendered conversation and, per token, whether it is a training target
        (the assistant turns from message `trained_from` on: data=preference trains the response only)."""
        self._check_tools_render(conversation)
        text = self.render(conversation)
        turns = self._turns(conversation, text) if self.opening or not self._train_on_prompt else []
        if self.opening:
            text, turns = self._opened_alike(text, turns)
        spans = [span for index, span in turns if index >= trained_from]
        encoding = self._tokenizer.tokenizer.encode(text)
        ids, offsets = list(encoding.ids), list(encoding.offsets)
        if self._train_on_prompt:
            trained = [True] * len(ids)
        else:
            trained = [any(start < span_end and end > span_start for span_start, span_end in spans)
                       for start, end in offsets]  # fmt: skip
        bos = getattr(self._tokenizer, "bos_id", None)
        if bos is not None and not getattr(self._tokenizer, "hf_adds_bos", False):
            ids, trained = [bos, *ids], [False, *trained]  # as torchtitan's encode(add_bos=True)
        return ids, trained

    def assistant_spans(self, conversation: Conversation, text: str, trained_from: int = 0) -> list[tuple[int, int]]:
        """(start, end) character spans of the assistant turns in `text` (from message
        `trained_from` on), end-of-turn marker included."""
        return [span for index, span in self._turns(conversation, text) if index >= trained_from]

    def _opened_alike(self, text: str, turns: list[tuple[int, tuple[int, int]]]) -> tuple[str, list]:
        """`text` with the empty opening written at the start of each assistant turn that has no
        block, and the turns' spans moved to match (each opening inside its turn's span)."""
        pieces, opened, last, shift = [], [], 0, 0
        for index, (start, end) in turns:
            added = "" if text.startswith(self.opening.split()[0], start) else self.opening
            pieces += [text[last:start], added]
            opened.append((index, (start + shift, end + shift + len(added))))
            last, shift = start, shift + len(added)
        return "".join([*pieces, text[last:]]), opened

    def _turns(self, conversation: Conversation, text: str) -> list[tuple[int, tuple[int, int]]]:
        """(message index, its span) of every assistant turn in `text`."""
        messages, spans = conversation.messages, []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            header = self._tokenizer.apply_chat_template(
                messages[:index], add_generation_prompt=True, **conversation.template_kwargs()
            )
            if not text.startswith(header):
                raise ChatFormatError(
                    "the chat template does not render the turns before an assistant turn as a prefix "
                    "of the conversation, so the assistant tokens cannot be found; use data.train_on_prompt=true "
                    "or a template that does"
                )
            start = len(header)
            marker = text.find(self.end_of_turn, start)
            if marker < 0:
                raise ChatFormatError(f"assistant turn {index}: no end-of-turn marker {self.end_of_turn!r} after it")
            spans.append((index, (start, marker + len(self.end_of_turn))))
        return spans

    def _check_tools_render(self, conversation: Conversation) -> None:
        """Tools or tool calls in the data need a template that writes them: say so, never drop them."""
        if not conversation.tools and not any(m.get("tool_calls") for m in conversation.messages):
            return
        if self._renders_tools is None:
            self._renders_tools = renders_tools(self._tokenizer.apply_chat_template)
        if not self._renders_tools:
            raise ChatFormatError(
                "the data has tools or tool calls, but the tokenizer's chat template does not render them "
                "(they would be dropped from training); use a model dir whose template does, as Qwen3's does"
            )


_PROBE = "PROBE_CONTENT_7f3a"


def end_of_turn_marker(apply_chat_template: Callable[..., str]) -> str:
    """What a template writes right after an assistant message's content ("<|im_end|>").

    `apply_chat_template(messages, **kwargs) -> str`: torchtitan's tokenizer method, or
    Transformers' with `tokenize=False` bound."""
    text = apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}])
    after = text[text.rfind(_PROBE) + len(_PROBE):].lstrip()
    marker = after.split()[0] if after.split() else ""
    if not marker:
        raise ChatFormatError("the chat template writes no end-of-turn marker after an assistant turn, "
                              "so the model could not learn to stop")  # fmt: skip
    return marker


def empty_opening(apply_chat_template: Callable[..., str]) -> str:
    """What a template writes between the assistant header and the text of a final turn without
    reasoning: Qwen3's empty block "<think>\n\n</think>\n\n"; "" for a template without one."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    text, header = apply_chat_template(messages), apply_chat_template(messages[:1], add_generation_prompt=True)
    opening = text[len(header):text.find(_PROBE)] if text.startswith(header) and _PROBE in text else ""
    return opening if opening.strip() else ""


def renders_tools(apply_chat_template: Callable[..., str]) -> bool:
    """Whether a template writes a tool schema's name and an assistant tool call's name."""
    tool, call = "probe_tool_5b1e", "probe_call_9c2d"
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": call, "arguments": {}}}]},
    ]  # fmt: skip
    schema = {"type": "function", "function": {"name": tool, "description": "", "parameters": {"type": "object"}}}
    text = apply_chat_template(messages, tools=[schema])
    return tool in text and call in text
