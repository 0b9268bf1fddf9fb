"""Where rows come from: local files or a data set in the local HF cache, through `datasets`.

- `data.files`: a path, a glob or a list of them. The extension picks `datasets`' own builder:
  .parquet, .csv, .arrow, .txt -> text (`data.txt_sample_by`: one row per blank-line-separated
  paragraph by default, or per file, or per line). A directory written by `Dataset.save_to_disk`
  is opened with `load_from_disk`. JSON (.jsonl, or a .json array) is read with the standard
  library instead: `datasets`' JSON reader fixes its columns from the first rows (a `tools` key
  that only some rows carry stops it) and names a malformed row by its byte offset in a chunk.
  Each JSON row travels through `datasets` as its text with its file and line, and becomes the
  object the file holds when it is read (`read_row`): keys absent stay absent, and a malformed
  row is named by its file and 1-based line.
- `data.hf_dataset` (+ `hf_config`, `split`): a Hub id read from the local cache only; runs stay
  offline, and a missing one stops with the command that downloads it.

Rows are read map-style (exact resume by row index; the Arrow cache of local files goes to the
run dir's `data_cache/`, never the user's HF cache) or streamed (`data.streaming=true`, for
corpora larger than memory). Either way `datasets.distributed.split_dataset_by_node` gives each
data-parallel rank its own shard, and a validation carve (`val_fraction`) is taken before that,
by row index, so train and validation never share a row.

`first_rows` reads the first rows only (streamed, with a throw-away cache dir): what the plan
checks, without scanning a corpus.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwen3_neuron.errors import ConfigError

# a JSON row in `datasets`: its text, its file, and where in the file ("line 7", or "item 3" of an array)
JSON_TEXT, JSON_FILE, JSON_AT = "json_text", "json_file", "json_at"
# a map-style row of the other formats: its 0-based place in the source (its files in order)
SOURCE_ROW = "__source_row"

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text", ".arrow": "arrow"}
SAVED_DIR_FILES = ("dataset_info.json", "dataset_dict.json", "state.json")  # what save_to_disk writes


def resolve_files(spec: str | list[str] | None, key: str = "data.files") -> list[str]:
    """Every file `spec` names, in order (globs sorted), checked to exist; or one save_to_disk dir."""
    patterns = [spec] if isinstance(spec, str) else list(spec or [])
    if not patterns:
        raise ConfigError(f"{key} is empty: give a path, a glob or a list of them (or data.hf_dataset)")
    files: list[str] = []
    for pattern in patterns:
        path = os.path.expanduser(str(pattern))
        if glob.has_magic(path):
            matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p) or is_saved_dir(p))
            if not matches:
                raise ConfigError(f"{key}: '{pattern}' matches no file")
            files += matches
        elif os.path.isdir(path):
            if not is_saved_dir(path):
                raise ConfigError(
                    f"{key}: '{pattern}' is a directory but not one written by datasets' save_to_disk; "
                    f"name its files with a glob, e.g. '{pattern.rstrip('/')}/*.jsonl'"
                )
            files.append(path)
        elif not os.path.exists(path):
            raise ConfigError(f"{key}: '{pattern}' does not exist")
        else:
            files.append(path)
    _builder_of(files, key)  # one known format for all of them
    return [os.path.abspath(f) for f in files]


def is_saved_dir(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, n)) for n in SAVED_DIR_FILES)


def _builder_of(files: list[str], key: str) -> str:
    """'json', 'parquet', ... for `load_dataset`, or 'saved' for a save_to_disk dir."""
    kinds = set()
    for f in files:
        if is_saved_dir(f):
            kinds.add("saved")
            continue
        suffix = Path(f).suffix.lower()
        if suffix not in BUILDERS:
            raise ConfigError(
                f"{key}: '{f}' has extension '{suffix}'; readable: {', '.join(BUILDERS)} "
                "or a directory written by save_to_disk"
            )
        kinds.add(BUILDERS[suffix])
    if len(kinds) > 1:
        raise ConfigError(f"{key}: mixes formats ({', '.join(sorted(kinds))}); one source reads one format "
                          "(data=mix takes several sources)")
    if "saved" in kinds and len(files) > 1:
        raise ConfigError(f"{key}: a save_to_disk directory is a whole data set; give one")
    return kinds.pop()


def load_rows(source, *, streaming: bool, cache_dir: str | None) -> Any:
    """The source's rows: a `datasets.Dataset` (map-style) or `IterableDataset` (streaming).
    Map-style rows `datasets` reads itself carry their place in the source (`SOURCE_ROW`), so a
    skipped row is named by it, not by its place in a rank's share."""
    import datasets

    rows = _load_rows(source, streaming, cache_dir)
    if isinstance(rows, datasets.Dataset) and JSON_TEXT not in rows.column_names:
        import numpy as np

        rows = rows.add_column(SOURCE_ROW, np.arange(len(rows)))  # in memory: 8 bytes a row, no cache written
    return rows


def _load_rows(source, streaming: bool, cache_dir: str | None) -> Any:
    import datasets

    if source.hf_dataset:
        return _load_hub(source, streaming, cache_dir)
    files = resolve_files(source.files)
    builder = _builder_of(files, "data.files")
    if builder == "saved":
        rows = datasets.load_from_disk(files[0])
        if isinstance(rows, datasets.DatasetDict):
            if source.split not in rows:
                raise ConfigError(f"data.split={source.split}: {files[0]} has splits {', '.join(rows)}")
            rows = rows[source.split]
        return rows.to_iterable_dataset() if streaming else rows
    if builder == "json":
        return _load_json(files, streaming, cache_dir)
    kwargs = {"sample_by": source.txt_sample_by} if builder == "text" else {}
    return datasets.load_dataset(
        builder, data_files=files, split="train", streaming=streaming, cache_dir=cache_dir, **kwargs
    )


class RowError(ValueError):
    """A row that cannot be read as the object it should be; the message says where and why."""


def read_row(example: dict[str, Any], source_name: str) -> tuple[dict[str, Any], str | None]:
    """The row `datasets` handed out, as the data set ships it, and where it is: in its file
    ("/data/chats.jsonl line 7"), or in the source ("row 35 of notes.parquet", 1-based, map-style);
    None for a streamed row of the formats `datasets` reads itself."""
    if JSON_TEXT not in example:
        row = dict(example)
        place = row.pop(SOURCE_ROW, None)
        return row, None if place is None else f"row {place + 1} of {source_name}"
    where = f"{example[JSON_FILE]} {example[JSON_AT]}"
    return parse_json_row(example[JSON_TEXT], where), where


def parse_json_row(text: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise RowError(f"{where}: not JSON ({e.msg.removesuffix(' at')} at column {e.colno}): {text!r:.80}") from None
    if not isinstance(row, dict):
        raise RowError(f"{where}: a row must be a JSON object {{...}}, got {type(row).__name__}: {text.strip()!r:.80}")
    return row


def _parsed_or_error(text: str, where: str) -> dict[str, Any] | RowError:
    try:
        return parse_json_row(text, where)
    except RowError as e:
        return e


def json_rows(path: str) -> Iterator[tuple[str, str]]:
    """(text, where in the file) of each row of a JSON lines file, blank lines skipped, or of
    each item of a file holding one JSON array."""
    with open(path, encoding="utf-8-sig") as f:
        head = f.read(4096)
        if head.lstrip().startswith("["):  # one array: read whole, as any JSON reader must
            try:
                items = json.loads(head + f.read())
            except json.JSONDecodeError as e:
                raise RowError(f"{path} line {e.lineno}: not JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
            for number, item in enumerate(items, 1):
                yield json.dumps(item), f"item {number}"
            return
        f.seek(0)
        for number, line in enumerate(f, 1):
            if line.strip():
                yield line.rstrip("\r\n"), f"line {number}"


def _json_examples(files: list[tuple[str, int, int]]) -> Iterator[dict[str, str]]:
    for path, _size, _mtime in files:  # size and mtime key datasets' cache: a changed file is read again
        for text, at in json_rows(path):
            yield {JSON_TEXT: text, JSON_FILE: path, JSON_AT: at}


def _load_json(files: list[str], streaming: bool, cache_dir: str | None) -> Any:
    """JSON rows, map-style (an Arrow cache in `cache_dir`) or streamed, one shard per file."""
    import datasets

    stamped = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files]
    features = datasets.Features({name: datasets.Value("string") for name in (JSON_TEXT, JSON_FILE, JSON_AT)})
    if streaming:
        return datasets.IterableDataset.from_generator(_json_examples, features=features, gen_kwargs={"files": stamped})
    return datasets.Dataset.from_generator(
        _json_examples, features=features, gen_kwargs={"files": stamped}, cache_dir=cache_dir
    )


def _load_hub(source, streaming: bool, cache_dir: str | None) -> Any:
    """A Hub data set from this machine only: the snapshot `hf download` left in the hub cache
    (read as a local dir of data files: `datasets` offline cannot resolve a Hub id from it), else
    what an earlier online `load_dataset` cached; neither: the command that downloads it."""
    import datasets
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(source.hf_dataset, repo_type="dataset", local_files_only=True)
    except (LocalEntryNotFoundError, ValueError):  # not in the hub cache (or not an id): maybe datasets' cache
        path = None
    try:
        if path is not None:
            return datasets.load_dataset(
                path, source.hf_config, split=source.split, streaming=streaming, cache_dir=cache_dir
            )
        return datasets.load_dataset(source.hf_dataset, source.hf_config, split=source.split, streaming=streaming)
    except Exception as e:  # offline and not cached: ConnectionError / FileNotFoundError / ValueError
        where = f" (found in the hub cache at {path}, but: {type(e).__name__}: {str(e)[:300]})" if path else ""
        raise ConfigError(
            f"data.hf_dataset={source.hf_dataset} (config {source.hf_config}, split {source.split}) cannot be "
            f"read from the local HF cache{where}; runs are offline. Download it once with network: "
            f"`hf download {source.hf_dataset} --repo-type dataset`"
        ) from e


def first_rows(source, n: int, files_key: str = "data.files") -> list[tuple[dict[str, Any] | RowError, str]]:
    """The first `n` rows of the source and where each is ("/data/chats.jsonl line 7", "row 3 of
    notes.parquet"), read as a stream (the files are opened, never scanned). A malformed JSON row
    is its `RowError` in place of the row: the plan counts it as the workers do (skipped)."""
    if not source.hf_dataset:
        files = resolve_files(source.files, files_key)
        empty = [f for f in files if os.path.isfile(f) and os.path.getsize(f) == 0]
        if empty:
            raise ConfigError(f"{files_key}: '{empty[0]}' is empty (no rows)")
        if _builder_of(files, files_key) == "json":
            try:
                texts = ((text, f"{path} {at}") for path in files for text, at in json_rows(path))
                placed = list(itertools.islice(texts, n))
            except RowError as e:  # a JSON array that does not parse: not one row of it can be read
                raise ConfigError(str(e)) from None
            return [(_parsed_or_error(text, where), where) for text, where in placed]
    with tempfile.TemporaryDirectory(prefix="qwen3-neuron-peek-") as scratch:  # datasets' lock files
        try:
            rows = load_rows(source, streaming=True, cache_dir=scratch)
            return [(dict(row), f"row {i} of {source.name()}") for i, row in enumerate(itertools.islice(iter(rows), n), 1)]
        except ConfigError:
            raise
        except StopIteration:
            return []
        except Exception as e:
            where = source.hf_dataset or source.files
            raise ConfigError(f"data: cannot read the first rows of {where}: {type(e).__name__}: {e}") from e


def is_validation_row(index: int, fraction: float) -> bool:
    """Row `index` belongs to the validation carve: every (1/fraction)-th row, spread evenly."""
    return int((index + 1) * fraction) > int(index * fraction)


def carve(rows, fraction: float, role: str):
    """The `role` side ('train' | 'validation') of a deterministic `fraction` carve of `rows`."""
    if not fraction:
        return rows
    want = role == "validation"
    import datasets

    if isinstance(rows, datasets.Dataset):
        import numpy as np

        index = np.arange(len(rows))
        is_val = np.floor((index + 1) * fraction) > np.floor(index * fraction)
        return rows.select(np.flatnonzero(is_val == want))
    return rows.filter(lambda _, i: is_validation_row(i, fraction) == want, with_indices=True)


def shard(rows, rank: int, world_size: int):
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(rows, rank=rank, world_size=world_size)
