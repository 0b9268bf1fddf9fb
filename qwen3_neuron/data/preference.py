"""A preference row -> its chosen and rejected conversations, and the tokens of each (data=preference).

Rows come in the shapes preference data sets ship (TRL's):
- conversational, explicit prompt: `prompt` a message list, `chosen` / `rejected` lists of the
  assistant messages that answer it;
- conversational, implicit prompt: `chosen` / `rejected` whole conversations sharing every message
  before their last assistant turn(s) (the shared prefix is the prompt);
- standard: `prompt`, `chosen`, `rejected` strings (a user turn and an assistant turn each).
The column names are `data.prompt_field`, `data.chosen_field`, `data.rejected_field`.

Both conversations are rendered with the tokenizer's own chat template and masked as data=chat
masks them (`ChatRenderer`), but only the response is trained: its assistant turns, each with its
end-of-turn marker, never the assistant turns of the prompt.

trainer=kto reads units instead (`row_units`): TRL's unpaired rows, `prompt`, `completion` and a
boolean `label` (true: desirable; `data.completion_field`, `data.label_field`), and pairs too, each
one desirable unit (the chosen response) and one undesirable (the rejected one), as TRL's
`unpair_preference_dataset` splits them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from qwen3_neuron.data.chat_rows import (
    ChatFormatError,
    ChatRenderer,
    Conversation,
    check_messages,
    row_conversation,
    row_tools,
)


@dataclass
class Pair:
    chosen: Conversation
    rejected: Conversation
    prompt_length: int  # messages of the prompt: the turns after them are the response


def row_pair(row: Mapping[str, Any], source) -> Pair:
    """The pair in `row`, read with `source`'s field names; checked: both responses there, an
    assistant turn in each, different from each other."""
    fields = {"prompt": source.prompt_field, "chosen": source.chosen_field, "rejected": source.rejected_field}
    for side in ("chosen", "rejected"):
        if row.get(fields[side]) in (None, "", []):
            raise ChatFormatError(f"data.{side}_field={fields[side]}: the row has no {side} response "
                                  f"(its columns: {', '.join(sorted(row))})")  # fmt: skip
    prompt = row.get(fields["prompt"]) if fields["prompt"] else None
    if prompt in (None, "", []):
        prompt_messages, chosen, rejected = _implicit_prompt(row[fields["chosen"]], row[fields["rejected"]], source)
    else:
        prompt_messages = _messages(prompt, "user", f"data.prompt_field={fields['prompt']}", source)
        chosen = _messages(row[fields["chosen"]], "assistant", f"data.chosen_field={fields['chosen']}", source)
        rejected = _messages(row[fields["rejected"]], "assistant", f"data.rejected_field={fields['rejected']}", source)
    if chosen == rejected:
        raise ChatFormatError("the chosen and the rejected response are the same: the pair teaches nothing")
    conversations = []
    for side, response in (("chosen", chosen), ("rejected", rejected)):
        if not any(m["role"] == "assistant" for m in response):
            raise ChatFormatError(f"the {side} response has no assistant turn")
        messages = [*prompt_messages, *response]
        check_messages(messages)
        conversations.append(Conversation(messages, row_tools(row, source.tools_field)))
    return Pair(*conversations, prompt_length=len(prompt_messages))


@dataclass
class Unit:
    """trainer=kto: one prompt, one completion and whether it is desirable."""

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    tools: list[Any] | None
    desirable: bool


def row_units(row: Mapping[str, Any], source) -> list[Unit]:
    """The KTO units of `row`: one of an unpaired row (its label column there), two of a pair."""
    label_field, completion_field = source.label_field, source.completion_field
    if label_field not in row:
        if row.get(source.chosen_field) in (None, "", []) and row.get(source.rejected_field) in (None, "", []):
            raise ChatFormatError(f"data.label_field={label_field}: the row has no label (true: desirable, false: "
                                  f"undesirable), and no {source.chosen_field} / {source.rejected_field} pair to "
                                  f"read instead (its columns: {', '.join(sorted(row))})")  # fmt: skip
        pair = row_pair(row, source)
        prompt = pair.chosen.messages[: pair.prompt_length]
        return [Unit(prompt, side.messages[pair.prompt_length :], side.tools, desirable)
                for side, desirable in ((pair.chosen, True), (pair.rejected, False))]  # fmt: skip
    label = row[label_field]
    if not isinstance(label, bool):
        raise ChatFormatError(f"data.label_field={label_field}: the label is {label!r:.40}, not true (desirable) or "
                              "false (undesirable)")  # fmt: skip
    prompt, completion = row.get(source.prompt_field or "prompt"), row.get(completion_field)
    if prompt in (None, "", []):
        raise ChatFormatError(f"data.prompt_field={source.prompt_field}: the row has no prompt (its columns: "
                              f"{', '.join(sorted(row))})")  # fmt: skip
    if completion in (None, "", []):
        raise ChatFormatError(f"data.completion_field={completion_field}: the row has no completion (its columns: "
                              f"{', '.join(sorted(row))})")  # fmt: skip
    prompt = _messages(prompt, "user", f"data.prompt_field={source.prompt_field}", source)
    completion = _messages(completion, "assistant", f"data.completion_field={completion_field}", source)
    if not any(m["role"] == "assistant" for m in completion):
        raise ChatFormatError("the completion has no assistant turn")
    check_messages([*prompt, *completion])
    return [Unit(prompt, completion, row_tools(row, source.tools_field), label)]


def unit_tokens(renderer: ChatRenderer, unit: Unit, completion: list[dict[str, Any]]) -> tuple[list[int], list[bool]]:
    """(tokens, trained) of the unit's prompt followed by `completion` (its own, or the mismatched
    one of KTO's KL estimate): the completion trained."""
    return renderer.tokens(Conversation([*unit.prompt, *completion], unit.tools), trained_from=len(unit.prompt))


def pair_tokens(renderer: ChatRenderer, pair: Pair) -> tuple[tuple[list[int], list[bool]], tuple[list[int], list[bool]]]:
    """(tokens, trained) of the chosen and of the rejected conversation: the responses trained."""
    return (renderer.tokens(pair.chosen, trained_from=pair.prompt_length),
            renderer.tokens(pair.rejected, trained_from=pair.prompt_length))  # fmt: skip


def _messages(value: Any, role: str, key: str, source) -> list[dict[str, Any]]:
    """A string (one `role` turn) or a message list, read as data=chat reads messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, Sequence):
        raise ChatFormatError(f"{key}: expected a string or a list of messages, got {type(value).__name__}")
    chat_source = _as_chat(source, "_listed")
    return row_conversation({"_listed": list(value)}, chat_source, check=False).messages  # no tools column here


def _implicit_prompt(chosen: Any, rejected: Any, source) -> tuple[list, list, list]:
    """Whole conversations: the prompt is every message they share up to the last user turn."""
    key = f"data.chosen_field={source.chosen_field} / data.rejected_field={source.rejected_field}"
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise ChatFormatError(f"{key}: string responses need a prompt column (data.prompt_field={source.prompt_field})")
    chosen = _messages(chosen, "assistant", key, source)
    rejected = _messages(rejected, "assistant", key, source)
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant":  # the response starts after the prompt's last turn
        shared -= 1
    if shared == 0:
        raise ChatFormatError(f"{key}: the chosen and rejected conversations share no prompt, and no "
                              f"data.prompt_field column names one")  # fmt: skip
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _as_chat(source, messages_field: str):
    """`source` read as data=chat reads a message list (its role map, reasoning choice)."""
    return replace(source, format="chat", messages_field=messages_field, prompt_field=None, response_field=None)
