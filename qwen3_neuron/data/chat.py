"""A chat row -> messages -> tokens, with the tokens that carry a loss marked.

The conversation is rendered with the tokenizer's own chat template (torchtitan's
`BaseTokenizer.apply_chat_template`, the model dir's template), tokenized once, and each token is
marked trained when its text lies in an assistant turn: the turn's content and its end-of-turn
marker (`<|im_end|>` for Qwen3's ChatML), every assistant turn, never the prompt or the role
header. The "\\n" the template writes after the marker is not trained: generation stops at the
marker and never emits it.

Where an assistant turn starts: the rendering of the messages before it with
`add_generation_prompt=True` ends there, and must be a prefix of the whole rendering (a template
for which it is not cannot be masked, and says so). Where it ends: the first end-of-turn marker
after its start. The marker is found once per tokenizer from a probe conversation, not assumed;
turns are not found by re-rendering each prefix as a whole conversation, which Qwen3's own
template renders differently (its last assistant turn gets a `<think>` block).

Token ids come from the underlying `tokenizers.Tokenizer` with character offsets, so a span
boundary inside a BPE merge cannot shift the labels; a token is trained when its characters
overlap an assistant span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KNOWN_ROLES = ("system", "user", "assistant", "tool")


class ChatFormatError(ValueError):
    """A row that is not a conversation this module can train on; the message says why."""


def row_messages(
    row: Mapping[str, Any], messages_field: str, prompt_field: str | None, response_field: str | None
) -> list[dict[str, str]]:
    """The conversation in `row`: its `messages_field` list, or a user prompt and an assistant
    response from `prompt_field` / `response_field`. Checked: roles known, one assistant turn."""
    if prompt_field or response_field:
        for key, name in (("data.prompt_field", prompt_field), ("data.response_field", response_field)):
            if not name:
                raise ChatFormatError(f"{key} is not set: data.prompt_field and data.response_field go together")
            if not isinstance(row.get(name), str):
                raise ChatFormatError(f"{key}={name}: expected a string, got {type(row.get(name)).__name__}")
        messages = [
            {"role": "user", "content": row[prompt_field]},
            {"role": "assistant", "content": row[response_field]},
        ]
    else:
        messages = row.get(messages_field)
        if not isinstance(messages, Sequence) or isinstance(messages, str):
            raise ChatFormatError(
                f"data.messages_field={messages_field}: expected a list of {{role, content}}, "
                f"got {type(messages).__name__}"
            )
        messages = [_message(m, messages_field, i) for i, m in enumerate(messages)]
    check_messages(messages)
    return messages


def _message(message: Any, field: str, index: int) -> dict[str, str]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ChatFormatError(f"{field}[{index}]: expected {{role, content}}, got {message!r:.80}")
    content = message.get("content")
    if not isinstance(content, str):
        raise ChatFormatError(f"{field}[{index}] ({message['role']}): content must be a string, got {content!r:.80}")
    return {"role": message["role"], "content": content}


def check_messages(messages: list[dict[str, str]]) -> None:
    unknown = sorted({m["role"] for m in messages} - set(KNOWN_ROLES))
    if unknown:
        raise ChatFormatError(f"unknown role {', '.join(map(repr, unknown))}; roles are {', '.join(KNOWN_ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ChatFormatError("no assistant turn: nothing to train on (roles: "
                              f"{', '.join(m['role'] for m in messages) or 'none'})")


class ChatRenderer:
    """Renders and tokenizes conversations with one tokenizer (torchtitan `HuggingFaceTokenizer`)."""

    def __init__(self, tokenizer, train_on_prompt: bool = False):
        if getattr(tokenizer, "_chat_template", None) is None:
            raise ChatFormatError(
                f"the tokenizer in {getattr(tokenizer, 'tokenizer_path', '?')} has no chat template "
                "(tokenizer_config.json 'chat_template' or chat_template.jinja)"
            )
        self._tokenizer = tokenizer
        self._train_on_prompt = train_on_prompt
        self.end_of_turn = _end_of_turn_marker(tokenizer)

    def render(self, messages: list[dict[str, str]]) -> str:
        return self._tokenizer.apply_chat_template(messages)

    def tokens(self, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
        """Token ids of the rendered conversation and, per token, whether it is a training target."""
        text = self.render(messages)
        spans = [] if self._train_on_prompt else self.assistant_spans(messages, text)
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

    def assistant_spans(self, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
        """(start, end) character spans of the assistant turns in `text`, end-of-turn marker included."""
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            header = self._tokenizer.apply_chat_template(messages[:index], add_generation_prompt=True)
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
            spans.append((start, marker + len(self.end_of_turn)))
        return spans


def _end_of_turn_marker(tokenizer) -> str:
    """What the template writes right after an assistant message's content ("<|im_end|>")."""
    content = "PROBE_CONTENT_7f3a"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    )
    after = text[text.rfind(content) + len(content):].lstrip()
    marker = after.split()[0] if after.split() else ""
    if not marker:
        raise ChatFormatError("the chat template writes no end-of-turn marker after an assistant turn, "
                              "so the model could not learn to stop")
    return marker
