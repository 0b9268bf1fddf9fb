"""What one data source is and how its rows become documents: the `data` section's per-source
keys, in one place for the settings (`job.settings.DataSettings`, the launcher's parse) and the
loader (`DataSource`, one per source in every rank). Imports nothing heavy: the launcher reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class SourceFields:
    files: str | list[str] | None = None
    """A path, a glob or a list of them: .jsonl .json .parquet .csv .arrow .txt, or one directory
    written by datasets' save_to_disk. All of one format."""

    hf_dataset: str | None = None
    """A Hub data set id, read from the local HF cache only (runs are offline)."""

    hf_config: str | None = None
    """The Hub data set's config name (its subset), if it has several."""

    split: str = "train"
    """The split of `hf_dataset` (or of a save_to_disk DatasetDict)."""

    text_field: str = "text"
    """data=text: the column holding each document's text."""

    txt_sample_by: Literal["paragraph", "document", "line"] = "paragraph"
    """.txt files: one row per blank-line-separated paragraph, per whole file, or per line."""

    messages_field: str = "messages"
    """data=chat: the column holding the conversation: OpenAI/HF messages ({role, content}:
    system, user, assistant, tool; assistant `tool_calls` and `reasoning_content`, and whatever
    else a message carries, go to the chat template as they are) or ShareGPT {from, value}
    (`conversations`)."""

    role_map: dict[str, str] | None = None
    """data=chat, ShareGPT rows: speaker -> role (system, user, assistant, tool, or tool_call: an
    assistant turn whose value is the call's JSON). Default: human/gpt/system/function_call/
    observation as ShareGPT names them."""

    tools_field: str | None = "tools"
    """data=chat: the row's tool schemas (a list, or a JSON string of one), handed to the chat
    template as `tools`; absent or empty: no tools."""

    reasoning: Literal["keep", "drop"] = "keep"
    """data=chat: keep an assistant turn's reasoning (`reasoning_content` or a <think> block in
    its content) where the template renders it, and train it; drop: train answers without it."""

    thinking: Literal["empty_block", "as_rendered"] = "empty_block"
    """data=chat|preference, a template with reasoning blocks (Qwen3's `<think>`): how assistant
    turns open. empty_block: each turn the template writes without a block gets the empty one it
    writes for a final turn without reasoning (`<think>\n\n</think>\n\n`), trained with the turn, as
    LLaMA-Factory's enable_thinking does by default: every turn of a multi-turn row teaches the
    opening the model then writes after `<|im_start|>assistant\n`. as_rendered: the turns as the
    template writes them (Qwen3's: the last turn with a block, earlier ones without, so a multi-turn
    row teaches two openings). A template without such a block renders alike either way."""

    prompt_field: str | None = None
    """data=chat with instruction rows: the prompt column (a user turn); with `response_field`.
    data=preference: the prompt column (a string, or a message list); null or an empty value:
    `chosen` and `rejected` are whole conversations sharing the prompt."""

    chosen_field: str = "chosen"
    """data=preference: the preferred response (a string, or a list of assistant messages, or
    a whole conversation)."""

    rejected_field: str = "rejected"
    """data=preference: the dispreferred response, in the same form as the chosen one."""

    completion_field: str = "completion"
    """data=preference with trainer=kto, unpaired rows: the completion (a string, or a list of
    assistant messages) that `label_field` judges."""

    label_field: str = "label"
    """data=preference with trainer=kto: the column marking an unpaired row's completion desirable
    (true) or undesirable (false); a row without it is read as a pair (one of each)."""

    response_field: str | None = None
    """data=chat with instruction rows: the response column (the assistant turn)."""

    input_field: str | None = "input"
    """data=chat with instruction rows: a column joined to the prompt after a blank line when it
    is filled (Alpaca's `input`)."""

    system_field: str | None = None
    """data=chat with instruction rows: a column holding a system turn for the row, if any."""

    train_on_prompt: bool = False
    """data=chat: true puts a loss on every token, not only on the assistant turns."""

    overlong: Literal["truncate", "drop", "split"] = "truncate"
    """A document longer than training.seq_len: truncate (keep its first seq_len tokens), drop
    it, or split it into seq_len windows (text only: a conversation cut in two loses its
    context). data=preference: a pair (both its sequences) longer than seq_len; truncate cuts
    the longer sequence first, each keeping at least half of seq_len. Every case is counted in
    the log and summary.json (data_stats)."""

    packing: Literal["best_fit", "greedy", "none"] = "best_fit"
    """How whole documents (chat; text with overlong truncate|drop) fill training.seq_len samples:
    best_fit: best-fit decreasing over `pack_buffer` waiting documents (what does not fit waits
    for a later sample); greedy: in order, a sample that cannot take the next document is padded;
    none: one document per sample. Text with overlong=split runs documents on across samples
    instead (no padding). summary.json's packing_efficiency: the share of tokens not padding."""

    pack_buffer: int = 64
    """packing=best_fit: how many documents wait to be placed; each rank holds that many (in its
    checkpoints too). 64 packs bench/packing.py's long-tailed chat set as well as 256 does."""

    max_dropped: float | None = None
    """The largest share of a rank's rows that may go untrained (dropped as too long for
    training.seq_len, or skipped as unreadable) before the run stops with the first of them
    named; null: never stop. Above 1 % the end-of-run lines warn either way. A launch's value is
    conf/config.yaml's (0.1), written there once; a source built in code has no limit unless given one."""

    val_fraction: float = 0.0
    """0 < f < 1: carve every (1/f)-th row of the training source(s) out for validation,
    deterministically; turns on torchtitan's Validator. Exclusive with val_files."""


@dataclass(kw_only=True)
class DataSource(SourceFields):
    """One source of rows (data=text|chat: the `data` section; data=mix: one of `data.sources`)."""

    format: Literal["text", "chat", "preference", "kto", "prompts"] = "text"
    """How a row becomes a document: a text column, a conversation, or a pair of them (a chosen
    and a rejected response to one prompt: two documents placed in one sample); kto: data=preference
    as trainer=kto reads it, units of a prompt and a labelled completion, each placed with the same
    prompt and another unit's completion (its KL estimate's); prompts: a prompt to generate from."""

    weight: float = 1.0
    """data=mix: this source's share of the samples, against the other sources' weights."""

    tools: list[dict] | None = None
    """data=prompts: the schemas of GRPO's tools (`grpo.tools`, `grpo.environment`'s methods), which
    every prompt is rendered with besides its row's own; set from the grpo section, not a data key."""
    scored_pairs: bool = False
    """data=preference for trainer=reward_model (set from the trainer, no data key): each sequence
    whole, its score read at its last token, and the row's `margin` column (TRL's) carried."""

    def name(self) -> str:
        return self.hf_dataset or (self.files if isinstance(self.files, str) else ",".join(self.files or []))
