"""Plan-time checks of the data a run will read: before any worker starts, first rows only.

Each source's first `PEEK_ROWS` rows are read as a stream (a 100 GB corpus is opened, never
scanned) and put through what the workers will do to them: the text column must be there, a chat
row must be a conversation the tokenizer's chat template renders with its assistant turns found,
and training.seq_len must leave rows something to train on. One row policy, the workers' too
(`dataset.PackedDataset`): a row that cannot be read as the data kind's row (malformed JSON, no
assistant turn, ...) is skipped and one too long for training.seq_len dropped, each counted with
why; the plan says what the first rows lose and refuses first rows none of which trains, or more
than `data.max_dropped` of which go untrained, naming the count and the first of them. A
validation set must not be empty; torchtitan's Validator must be told how many batches to read.
Rows are named by file and 1-based line (JSON), else by their place in the source.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from torchtitan.trainer import Trainer

from qwen3_neuron.data.chat_rows import ChatFormatError, ChatRenderer, renders_tools, row_conversation
from qwen3_neuron.data.dataset import carved, document_fate, pair_fate, row_margin, scored_pair_fate, untrained_advice
from qwen3_neuron.data.loader import PackedDataLoader
from qwen3_neuron.data.packing import Packer, document, scored_document
from qwen3_neuron.data.preference import pair_tokens, row_pair, row_units, unit_tokens
from qwen3_neuron.data.prompts import prompt_field, prompt_tokens
from qwen3_neuron.data.row_loading import RowError, first_rows, is_validation_row
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import ConfigError

PEEK_ROWS = 64
CARVE_PEEK_ROWS = 4096  # read at most, for PEEK_ROWS rows on each side of a data.val_fraction carve
NAMED_ROWS = 3  # untrained first rows a refusal names
# torchtitan's registered data sets that live on the Hub (text_datasets.DATASETS): data=c4
HUB_REGISTERED = {"c4": "allenai/c4", "c4_validation": "allenai/c4"}
Sides = dict[str, tuple[list[tuple[dict | RowError, str]], bool]]  # role -> (its first rows, whether all of them)


def _check_hub_cache(repo_id: str, key: str) -> None:
    """Runs are offline: a Hub data set must be in the local HF cache already."""
    from huggingface_hub.constants import HF_HUB_CACHE

    folder = Path(HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    if not folder.is_dir():
        raise ConfigError(
            f"{key}: {repo_id} is not in the local HF cache ({HF_HUB_CACHE}) and runs are offline. "
            f"Download it once with network: `hf download {repo_id} --repo-type dataset`"
        )


def check_data(
    config: Trainer.Config, world_size: int, completion_tokens: int = 0, warn: Callable[[str], None] = print,
    rewards=None, samples_taken: int = 0,
) -> None:  # fmt: skip
    """Raise ConfigError on a data section the workers could not train on. data=prompts:
    `completion_tokens` is the room each prompt must leave in training.seq_len
    (grpo.max_completion_length), and `rewards` (`rewards.calls.Rewards`) checks the
    columns its functions read against the first rows'. `warn` gets what the first rows showed
    that the user should know (rows dropped at this seq_len; with `samples_taken`, the samples the
    run's steps take, all ranks together (data=prompts: prompts), whether the rows go round)."""
    loader = config.dataloader
    if getattr(loader, "dataset", None) in HUB_REGISTERED and not loader.dataset_path:
        _check_hub_cache(HUB_REGISTERED[loader.dataset], f"dataloader.dataset={loader.dataset}")
    if not isinstance(loader, PackedDataLoader.Config):
        return
    tokenizer = _tokenizer(config)
    _check_vocab(tokenizer, config)
    keys = ["data"] if len(loader.sources) == 1 else [f"data.sources[{i}]" for i in range(len(loader.sources))]
    for key, source in zip(keys, loader.sources):
        if source.max_dropped is not None and not 0 <= source.max_dropped < 1:
            raise ConfigError(f"{key}.max_dropped={source.max_dropped}: a share of the rows read, in [0, 1) "
                              "(0.1: a tenth), or null for no limit")  # fmt: skip
        taken = samples_taken if len(loader.sources) == 1 else 0  # data=mix: shares of unknown size
        sides = _first_rows(source, f"{key}.files")
        if source.format == "prompts":
            rows = _check_prompts(source, tokenizer, config.training.seq_len, completion_tokens, key=key, warn=warn,
                                  taken=taken, sides=sides)  # fmt: skip
            if rewards is not None:
                rewards.check_columns({name for row in rows for name in row} - {prompt_field(source)}, source.name())
        else:
            _check_source(source, sides, key, f"{key}.files", tokenizer, config.training.seq_len, warn, taken)
        if source.val_fraction:
            _check_carve(sides, source, world_size)
    validator = config.validator
    if validator.enable and isinstance(validator.dataloader, PackedDataLoader.Config):
        if validator.steps == -1:
            raise ConfigError(
                "validator.steps=-1 reads the whole validation set, and ranks holding different numbers "
                "of samples then wait for each other forever; set validator.steps=N (batches per validation)"
            )
        if validator.dataloader.sources is not loader.sources and not any(s.val_fraction for s in loader.sources):
            for source in validator.dataloader.sources:
                sides = _first_rows(source, "data.val_files", role="validation")
                if source.format == "prompts":
                    _check_prompts(source, tokenizer, config.training.seq_len, completion_tokens, "data.val_files",
                                   warn=warn, sides=sides)  # fmt: skip
                else:
                    _check_source(source, sides, "data", "data.val_files", tokenizer, config.training.seq_len, warn)
                placed, whole = sides["validation"]
                if whole and len(placed) < world_size:
                    raise ConfigError(f"data.val_files: {len(placed)} rows for {world_size} ranks; "
                                      "each rank needs at least one")  # fmt: skip


def _tokenizer(config: Trainer.Config):
    try:
        return config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    except Exception as e:
        raise ConfigError(f"hf_assets_path={config.hf_assets_path}: cannot open its tokenizer ({e})") from e


def _check_vocab(tokenizer, config: Trainer.Config) -> None:
    vocab = getattr(config.model_spec.model, "vocab_size", None)
    if vocab and tokenizer.get_vocab_size() > vocab:
        raise ConfigError(
            f"hf_assets_path={config.hf_assets_path}: its tokenizer has {tokenizer.get_vocab_size()} tokens, "
            f"more than the model's vocabulary ({vocab}); use the model's own tokenizer"
        )


def _check_source(
    source: DataSource, sides: Sides, key: str, files_key: str, tokenizer, seq_len: int, warn, taken: int = 0
) -> None:
    where = source.hf_dataset or files_key
    placed = [row for side, _ in sides.values() for row in side]
    if not placed:
        raise ConfigError(f"{where}: no rows in {source.name()}")
    rows = [row for row, _ in placed if not isinstance(row, RowError)]  # malformed ones: skipped, counted below
    present = {name for row in rows for name in row}  # rows as data sets ship them: not every row has every key
    columns = ", ".join(sorted(present))
    if not rows:  # not one row to look for columns in: the refusal names why each is unreadable
        _check_sides(source, key, sides, None, seq_len, warn)
    if source.format == "text":
        if source.text_field not in present:
            raise ConfigError(f"{key}.text_field={source.text_field} is not a column of {source.name()}; "
                              f"its columns: {columns}")  # fmt: skip
        def text_fate(row):
            text = row.get(source.text_field)
            if not isinstance(text, str):
                raise ChatFormatError(f"{key}.text_field={source.text_field}: expected a string, got {text!r:.40}")
            tokens = tokenizer.encode(text, add_bos=True, add_eos=True)
            return document_fate(tokens, [True] * len(tokens), seq_len, source.overlong)

        _check_sides(source, key, sides, text_fate, seq_len, warn, taken)
        return
    pairs = source.format in ("preference", "kto")
    instruction = () if pairs else ("prompt_field", "response_field")  # preference: prompt optional
    for field_key in instruction:
        name = getattr(source, field_key)
        if name and name not in present:
            raise ConfigError(f"{key}.{field_key}={name} is not a column of {source.name()}; its columns: {columns}")
    if source.format == "kto":
        if source.label_field not in present and not {source.chosen_field, source.rejected_field} & present:
            raise ConfigError(
                f"{key}.label_field={source.label_field} is not a column of {source.name()}, nor are "
                f"{key}.chosen_field={source.chosen_field} and {key}.rejected_field={source.rejected_field}: "
                f"trainer=kto reads unpaired rows (prompt, completion, label) or pairs; its columns: {columns}"
            )
    elif source.format == "preference":
        for field_key in ("chosen_field", "rejected_field"):
            name = getattr(source, field_key)
            if name not in present:
                raise ConfigError(f"{key}.{field_key}={name} is not a column of {source.name()}; its columns: {columns}")
    elif not (source.prompt_field or source.response_field) and source.messages_field not in present:
        hint = (f"ShareGPT rows: set {key}.messages_field=conversations" if "conversations" in present
                else f"instruction rows: set {key}.prompt_field and {key}.response_field")  # fmt: skip
        raise ConfigError(
            f"{key}.messages_field={source.messages_field} is not a column of {source.name()}; its columns: "
            f"{columns} ({hint})"
        )
    try:
        renderer = ChatRenderer(tokenizer, source.train_on_prompt, source.thinking)
    except ChatFormatError as e:
        raise ConfigError(f"data.kind={source.format}: {e}; use a model dir or hf_assets_path whose tokenizer has one") from e
    if source.format == "preference":
        def fate(row):
            pair = row_pair(row, source)
            _check_pair(renderer, pair, seq_len, key)
            if source.scored_pairs:  # trainer=reward_model: pairs whole, a margin a number (as the workers take them)
                row_margin(row)
                return scored_pair_fate([scored_document(tokens) for tokens, _ in pair_tokens(renderer, pair)], seq_len)
            return pair_fate([document(*tokens) for tokens in pair_tokens(renderer, pair)], seq_len, source.overlong)
    elif source.format == "kto":
        def fate(row):  # each unit with its own completion where its KL estimate's mismatched one will be
            fates = []
            for unit in row_units(row, source):
                tokens, trained = unit_tokens(renderer, unit, unit.completion)
                _check_prompt_room(tokens, trained, seq_len, key, "a KTO unit (the completion, and the mismatched "
                                   "one of its KL estimate, each after the prompt)")  # fmt: skip
                fates.append(pair_fate([document(tokens, trained)] * 2, seq_len, source.overlong))
            fitted = [docs for docs, _, _ in fates if docs] or None  # what the packer gets of the row: its units
            _, what, why = next((f for f in fates if f[1]), fates[0])
            return fitted, what, why
    else:
        def fate(row):
            return document_fate(*renderer.tokens(row_conversation(row, source)), seq_len, source.overlong)
    _check_sides(source, key, sides, fate, seq_len, warn, taken)


def _first_rows(source: DataSource, files_key: str, role: str = "train") -> Sides:
    """The first PEEK_ROWS rows of each side of the source's data.val_fraction carve ("train" and
    "validation", as the workers' loaders read them), each with whether it is all of that side's
    rows; a source without a carve is all `role`. A carve reads on (CARVE_PEEK_ROWS at most) until
    both sides have PEEK_ROWS rows: every 20th row of a file is 3 of its first 64."""
    fraction = source.val_fraction
    wanted = PEEK_ROWS + 1 if not fraction else min(math.ceil((PEEK_ROWS + 1) / min(fraction, 1 - fraction)),
                                                     max(CARVE_PEEK_ROWS, PEEK_ROWS + 1))  # fmt: skip
    placed = first_rows(source, wanted, files_key)
    whole = len(placed) < wanted  # one more row than either side needs was looked for
    if not fraction:
        return {role: (placed[:PEEK_ROWS], whole)}
    sides: dict[str, list] = {"train": [], "validation": []}
    for index, row in enumerate(placed):
        sides["validation" if is_validation_row(index, fraction) else "train"].append(row)
    return {side: (rows[:PEEK_ROWS], whole and len(rows) <= PEEK_ROWS) for side, rows in sides.items()}


def _check_sides(source: DataSource, key: str, sides: Sides, fate, seq_len: int, warn, taken: int = 0) -> None:
    """`_check_fates` of each side's first rows (one without rows is the carve's to check)."""
    for role, (placed, whole) in sides.items():
        if placed:
            _check_fates(source, key, placed, whole, fate, seq_len, warn, taken if role == "train" else 0, role)


def _check_fates(source: DataSource, key: str, placed: list[tuple[dict | RowError, str]], whole: bool, fate,
                 seq_len: int, warn, taken: int = 0, role: str = "train") -> None:  # fmt: skip
    """Each first row as the workers will take it at `seq_len` (`fate(row)`: `document_fate`'s
    answer, or ChatFormatError), under the workers' row policy: a row that cannot be read as the
    data kind's row is skipped, one too long dropped, each counted with why; said, and refused
    when none of the rows is left or more than data.max_dropped of them are not. The rows of
    each `role` ("train", "validation") are held to it on their own, as each loader holds its
    own. `taken`: the samples the run's steps take (`_say_passes`)."""
    fates: dict[str, list[str]] = {"truncated": [], "dropped": [], "split": [], "skipped": []}
    lost: list[str] = []  # dropped or skipped, in row order
    kept = []  # what the packer gets of each row kept
    for row, where in placed:
        fitted = None
        if isinstance(row, RowError):
            what, said = "skipped", str(row)  # it names where
        else:
            try:
                fitted, what, why = fate(row)
            except ChatFormatError as e:
                what, why = "skipped", str(e)
            said = f"{where}: {why}"
        if fitted is not None:
            kept.append(fitted)
        if what:
            fates[what].append(said)
        if what in ("dropped", "skipped"):
            lost.append(said)
    read, truncated = len(placed), len(fates["truncated"])
    dropped, skipped = len(fates["dropped"]), len(fates["skipped"])
    validation = role == "validation"
    rows = f"validation rows of {source.name()}{carved(source)}" if validation else f"rows of {source.name()}"
    first = f"the {read} {rows}" if whole else f"the first {read} {rows}"
    trained, train = ("validated on", "validate on") if validation else ("trained", "train on")
    named = "; ".join(lost[:NAMED_ROWS])
    counted = (f"{dropped} dropped (too long for training.seq_len={seq_len}), {skipped} skipped (cannot be read as "
               f"rows of data.kind={source.format})")  # fmt: skip
    if not skipped and dropped == read:
        raise ConfigError(
            f"training.seq_len={seq_len}: none of {first} keeps a token to {train}; the first: "
            f"{fates['dropped'][0]}. Raise training.seq_len"
            + ("" if source.overlong == "truncate" else f" or set {key}.overlong=truncate")
        )
    if len(lost) == read:
        raise ConfigError(f"none of {first} can be {trained}: {counted}; the first: {named}. Fix those rows, "
                          "or name the data's columns and format (data.* keys)")  # fmt: skip
    limit = source.max_dropped
    if limit is not None and len(lost) / read > limit:
        raise ConfigError(
            f"{len(lost)} of {first} would not be {trained} ({100 * len(lost) / read:.0f} %, more than "
            f"{key}.max_dropped={limit}): {counted}; the first: {named}. {untrained_advice(dropped, skipped, key)}"
        )
    if lost:  # truncation is the documented default: the end-of-run lines count it
        said = "; ".join((lost + fates["truncated"])[:2])
        warn(f"[qwen3-neuron] data: of {first} at training.seq_len {seq_len}, {truncated} would be truncated, "
             f"{dropped} dropped and {skipped} skipped (e.g. {said}); the run counts them as it goes, against "
             f"{key}.max_dropped={limit}")  # fmt: skip
    if taken:
        _say_passes(source, len(placed), whole, kept, seq_len, taken, warn)


def _say_passes(source: DataSource, read: int, whole: bool, kept: list, seq_len: int, taken: int, warn) -> None:
    """How far the run's steps go into the rows, from the first rows alone (never a scan): the
    samples the first rows make, packed as the workers pack them; when they are all the rows,
    how many passes over them the steps take (the data goes round), else the rows the steps read."""
    if source.format == "prompts":
        samples = len(kept)  # a prompt a sample
    else:
        flow = source.format == "text" and source.overlong == "split"
        packer = Packer(seq_len, 0, "flow" if flow else source.packing, source.pack_buffer)
        add = packer.add_together if source.format == "preference" else lambda doc: packer.add(*doc)
        if source.format == "kto":
            add = lambda units: [sample for docs in units for sample in packer.add_together(docs)]  # noqa: E731
        samples = sum(len(add(doc)) for doc in kept)
        samples += len(packer.flush())
    if not samples:
        return
    unit = "prompts" if source.format == "prompts" else "samples"
    if whole:  # every training row of the source read (a validation carve's are not among them)
        if taken > samples:
            training = " training" if source.val_fraction else ""
            warn(f"[qwen3-neuron] data: the data goes round: the run's steps take {taken:,} {unit}, and the {read}"
                 f"{training} row{'s' * (read != 1)} of {source.name()} make about {samples:.0f}: about "
                 f"{taken / samples:.2f} passes over them (each pass reshuffled)")  # fmt: skip
        return
    warn(f"[qwen3-neuron] data: the run's steps take {taken:,} {unit}, about {taken * read / samples:,.0f} rows at the "
         f"first {read} rows' {read / samples:.2f} rows a sample; the plan reads the first rows only, so whether "
         f"{source.name()} goes round is said at the end of the run")  # fmt: skip


def _check_prompts(
    source: DataSource, tokenizer, seq_len: int, completion_tokens: int, files_key: str = "data.files",
    key: str = "data", warn: Callable[[str], None] = print, taken: int = 0, sides: Sides | None = None,
) -> list[dict]:
    """data=prompts: the prompt column there, and each first prompt leaving room for a completion
    (`sides`: the first rows, `_first_rows`; None: read here)."""
    where = source.hf_dataset or files_key
    sides = sides or _first_rows(source, files_key)
    placed = [row for side, _ in sides.values() for row in side]
    if not placed:
        raise ConfigError(f"{where}: no rows in {source.name()}")
    field = prompt_field(source)
    rows = [row for row, _ in placed if not isinstance(row, RowError)]
    present = {name for row in rows for name in row}
    if rows and field not in present:
        raise ConfigError(f"data.prompt_field={field} is not a column of {source.name()}; its columns: "
                          f"{', '.join(sorted(present))}")  # fmt: skip

    if source.tools:  # GRPO's tools reach the model through the chat template
        _check_tool_prompts(rows, field, tokenizer, source.name())
    for row, place in placed:  # a prompt that leaves no room for the completion: a setting to change
        try:
            length = len(prompt_tokens(tokenizer, row, source)) if not isinstance(row, RowError) else 0
        except ChatFormatError:
            continue  # skipped, and counted, below
        if length + completion_tokens > seq_len:
            raise ConfigError(
                f"{place}: the prompt is {length} tokens, and grpo.max_completion_length="
                f"{completion_tokens} more must fit in training.seq_len={seq_len}: raise training.seq_len to at "
                f"least {length + completion_tokens} or lower grpo.max_completion_length."
            )
    def fate(row):
        return prompt_tokens(tokenizer, row, source), None, ""

    _check_sides(source, key, sides, fate, seq_len, warn, taken)
    return rows


def _check_tool_prompts(rows: list[dict], field: str, tokenizer, name: str) -> None:
    """grpo.tools / grpo.environment: the tools' schemas are rendered by the chat template, so the
    prompts are message lists and the template writes tools and tool calls."""
    strings = [row for row in rows if isinstance(row.get(field), str)]
    if strings:
        raise ConfigError(f"grpo.tools: the prompts of {name} are strings (e.g. {strings[0][field]!r:.60}); the tools "
                          "reach the model through the chat template, which renders message lists: write each "
                          'prompt as [{"role": "user", "content": "..."}].')  # fmt: skip
    if not renders_tools(tokenizer.apply_chat_template):
        raise ConfigError("grpo.tools: the tokenizer's chat template does not render tools or tool calls, so "
                          "the model would never see them; use a model dir whose template does, as Qwen3's "
                          "does.")  # fmt: skip


def _check_pair(renderer: ChatRenderer, pair, seq_len: int, key: str) -> None:
    """Both sequences of a pair share one sample, each starting with the prompt: a prompt that
    takes half of seq_len leaves a response no token."""
    (chosen, trained), _ = pair_tokens(renderer, pair)
    _check_prompt_room(chosen, trained, seq_len, key,
                       "a pair (the chosen and the rejected response, each after the prompt)")  # fmt: skip


def _check_prompt_room(tokens: list[int], trained: list[bool], seq_len: int, key: str, what: str) -> None:
    prompt = trained.index(True) if True in trained else len(tokens)
    if 2 * prompt >= seq_len:
        raise ChatFormatError(
            f"its prompt is {prompt} tokens, and {what} shares one training.seq_len={seq_len} sample: raise "
            f"training.seq_len above {2 * prompt} or leave such rows out ({key}.overlong=drop does not help a "
            "prompt that long)"
        )


def _check_carve(sides: Sides, source: DataSource, world_size: int) -> None:
    """When the first rows are all the validation rows, the carve's size is known: it must feed every rank."""
    validation, whole = sides["validation"]
    if whole and len(validation) < world_size:
        raise ConfigError(
            f"data.val_fraction={source.val_fraction}: the validation set it carves out of {source.name()} has "
            f"{len(validation)} row{'s' * (len(validation) != 1)}, fewer than the {world_size} ranks that each read "
            "a share; raise data.val_fraction or set data.val_files"
        )
