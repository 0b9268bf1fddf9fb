"""A chat model's generation config stops at the end of its turn.

A base model's `generation_config.json` (Qwen3-Base's too) ends generation at the tokenizer's
EOS (`<|endoftext|>`) only. After chat training the model ends each turn with the template's
end-of-turn marker (`<|im_end|>`) and never writes EOS, so `generate()`, vLLM and every server
would go on to `max_new_tokens`. As Qwen3-Instruct dirs do, a chat export lists both:
`eos_token_id: [<|im_end|> id, <|endoftext|> id]`. The marker is found from the dir's own chat
template (`data.chat_rows.end_of_turn_marker`), not assumed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from qwen3_neuron.data.chat_rows import ChatFormatError, end_of_turn_marker
from qwen3_neuron.errors import ExportError

GENERATION_CONFIG_FILE = "generation_config.json"


def end_of_turn_token(tokenizer) -> tuple[str, int]:
    """(marker, token id) of the chat template's end of turn; ExportError when the template has
    none or the marker is not one token (generation could not stop on it)."""
    if not tokenizer.chat_template:
        raise ExportError(f"{tokenizer.name_or_path}: the tokenizer has no chat template")
    try:
        marker = end_of_turn_marker(partial(tokenizer.apply_chat_template, tokenize=False))
    except ChatFormatError as e:
        raise ExportError(f"{tokenizer.name_or_path}: {e}") from e
    token_id = tokenizer.convert_tokens_to_ids(marker)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ExportError(f"{tokenizer.name_or_path}: the end-of-turn marker {marker!r} is not one token")
    return marker, token_id


def stop_ids(generation_config) -> list[int]:
    eos = generation_config.eos_token_id
    return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]


def stop_at_end_of_turn(model_dir: Path) -> list[int]:
    """Make `model_dir`'s generation config stop at its chat template's end of turn as well as at
    the EOS it already stops at (a config that already does is left as it is); the stop ids."""
    from transformers import AutoTokenizer, GenerationConfig

    _, turn_end = end_of_turn_token(AutoTokenizer.from_pretrained(model_dir))
    generation = GenerationConfig.from_pretrained(model_dir)
    ids = stop_ids(generation)
    if turn_end not in ids:
        generation.eos_token_id = [turn_end, *ids]
        generation.save_pretrained(model_dir)
    return stop_ids(generation)


def chat_stop_problem(model_dir: Path) -> str | None:
    """Why `model_dir` would not end a chat turn in `generate()`, or None when it would."""
    from transformers import AutoTokenizer, GenerationConfig

    try:
        return stop_problem(AutoTokenizer.from_pretrained(model_dir), GenerationConfig.from_pretrained(model_dir))
    except (OSError, ValueError) as e:
        return str(e)


def stop_problem(tokenizer, generation_config) -> str | None:
    """Why a loaded tokenizer and generation config would not end a chat turn, or None."""
    try:
        marker, turn_end = end_of_turn_token(tokenizer)
    except ExportError as e:
        return str(e)
    ids = stop_ids(generation_config)
    if turn_end in ids:
        return None
    return (f"{GENERATION_CONFIG_FILE} stops at {ids or 'nothing'}, not at the chat template's end of turn "
            f"{marker!r} ({turn_end}): replies would not end")  # fmt: skip
