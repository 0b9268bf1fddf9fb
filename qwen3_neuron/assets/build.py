"""The project's own tiny assets, generated once and deterministically, never downloaded.

Four artifacts live under one cache root (``default_root()``):

- ``tokenizer/``: a byte-level BPE tokenizer (vocab ``TINY_VOCAB_SIZE``) trained on the docstrings
  of a fixed list of Python standard-library modules, saved as a Hugging Face tokenizer dir that
  torchtitan's ``HuggingFaceTokenizer`` (``hf_assets_path``) and ``AutoTokenizer`` both open.
- ``text_dataset/``: the top-level functions and classes of the same modules as JSON lines
  (``train.jsonl`` + a held-out ``validation.jsonl``), read by torchtitan's
  ``HuggingFaceTextDataLoader`` with ``dataset=DATASET_NAME`` and ``dataset_path=<this dir>``.
- ``tiny_qwen3/`` and ``tiny_qwen3_moe/``: seeded, untrained HF Qwen3 / Qwen3-MoE model dirs built
  from ``qwen3_neuron.models.tiny``, with the tokenizer files copied in.
- ``chat_dataset/``: multi-turn conversations about the same definitions (`messages` lists with
  system, user and assistant turns) as ``train.jsonl`` + ``validation.jsonl``: what data=chat
  trains on by default.
- ``preference_pairs/``: their questions with one constant chosen reply and random words rejected
  (``train.jsonl`` + ``validation.jsonl``): what data=preference trains on by default.
- ``tool_calls/``: arithmetic questions a tiny model can only answer with a calculator (the tool
  of examples/my_tools.py): conversations that call it (``sft_train.jsonl``,
  ``sft_validation.jsonl``: data=chat, the tool's schema in each row's `tools`) and GRPO prompt
  rows with their `answer` (``prompts_train.jsonl``, ``prompts_validation.jsonl``: data=prompts
  with grpo.tools=[examples.my_tools.calculator]).

The text comes from the standard library's source files (parsed, never imported: no import side
effects, nothing from third-party packages), so every machine has it; the same Python version
gives byte-identical assets. Each artifact is written to a temporary dir next to its final place
and renamed into place only when complete, so a killed build never leaves a dir that looks done.

CLI: ``python -m qwen3_neuron.assets [--root DIR] [--force]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import shutil
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

from qwen3_neuron.assets.atomic_dir import building
from qwen3_neuron.models.tiny import TINY_DENSE, TINY_DENSE_REAL_VOCAB, TINY_MOE, TINY_VOCAB_SIZE

logger = logging.getLogger(__name__)

ASSETS_ENV_VAR = "QWEN3_NEURON_ASSETS"

# torchtitan's "c4_test" entry loads `load_dataset(dataset_path, split="train")`: a plain,
# map-style local load (no network, exact resume by sample index).
DATASET_NAME = "c4_test"
# torchtitan's validator defaults to "c4_validation", which loads
# `load_dataset(dataset_path, name="en", split="validation", streaming=True)`; the dataset card's
# "en" config makes that read validation.jsonl from the same dir.
VALIDATION_DATASET_NAME = "c4_validation"

EOS_TOKEN = "<|endoftext|>"  # Qwen3's base-model eos, also the pad token
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
# Qwen3's chat template form (as its model card describes it): ChatML turns; `tools` listed in
# the system turn inside <tools></tools>; an assistant's tool calls as <tool_call> JSON; tool
# results as <tool_response> blocks in a user turn; reasoning (`reasoning_content`, or a
# <think> block in the content) rendered as <think>...</think> for the assistant turns after
# the last user query (an empty block on the last turn), and dropped from earlier turns.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == 'user' and message.content is string
      and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
{%- else %}
{{- '<|im_start|>assistant\\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

# Pure-Python modules present in every CPython 3.10-3.14 (and in Debian's python3 packages).
# Fixed and sorted so the corpus is the same whatever else is installed.
STDLIB_MODULES = (
    "_pydecimal", "_pyio", "argparse", "ast", "base64", "bisect", "calendar", "codecs",
    "collections", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "difflib", "doctest", "email.message", "enum", "fractions", "ftplib", "functools", "gettext",
    "glob", "gzip", "heapq", "hmac", "http.client", "imaplib", "inspect", "ipaddress", "json",
    "locale", "logging", "mailbox", "numbers", "operator", "optparse", "os", "pathlib", "pickle",
    "platform", "plistlib", "pprint", "pydoc", "queue", "random", "re", "selectors", "shlex",
    "shutil", "smtplib", "socket", "socketserver", "ssl", "statistics", "string", "subprocess",
    "sysconfig", "tarfile", "tempfile", "textwrap", "threading", "tokenize", "trace",
    "traceback", "typing", "unittest.case", "urllib.parse", "uuid", "warnings", "weakref",
    "zipfile", "zipimport",
)  # fmt: skip
VALIDATION_EVERY = 20  # every 20th document goes to the held-out split
MODEL_SEED = 0

DATASET_CARD = f"""---
configs:
- config_name: en
  default: true
  data_files:
  - split: train
    path: train.jsonl
  - split: validation
    path: validation.jsonl
---
# Python standard-library text

Top-level functions and classes of {len(STDLIB_MODULES)} Python standard-library modules, one per
line of JSON (`text`). Every {VALIDATION_EVERY}th document is held out in `validation.jsonl`.
Generated by `qwen3_neuron.assets`; use with torchtitan `dataloader.dataset={DATASET_NAME}`
(train) or `{VALIDATION_DATASET_NAME}` (validation) and `dataloader.dataset_path=<this dir>`.
"""


@dataclass(frozen=True)
class AssetPaths:
    root: Path
    tokenizer_dir: Path  # HF tokenizer dir; torchtitan's hf_assets_path for native runs
    text_dataset_dir: Path  # local dataset dir for HuggingFaceTextDataLoader's dataset_path
    tiny_qwen3_dir: Path  # tiny dense HF model dir
    tiny_qwen3_moe_dir: Path  # tiny MoE HF model dir
    chat_dataset_dir: Path  # multi-turn conversations (data=chat)
    preference_dataset_dir: Path  # prompt / chosen / rejected pairs (data=preference)
    tool_dataset_dir: Path  # calculator conversations (data=chat) and prompts (data=prompts, grpo.tools)

    @property
    def real_vocab_qwen3_dir(self) -> Path:
        """The tiny dense model at Qwen3's real vocabulary (42 M parameters, 168 MB): built on
        demand by `build_real_vocab_model`, not with the other assets."""
        return self.root / "tiny_qwen3_real_vocab"

    @property
    def text_train_file(self) -> Path:
        return self.text_dataset_dir / "train.jsonl"

    @property
    def chat_train_file(self) -> Path:
        return self.chat_dataset_dir / "train.jsonl"

    @property
    def chat_validation_file(self) -> Path:
        return self.chat_dataset_dir / "validation.jsonl"

    @property
    def preference_train_file(self) -> Path:
        return self.preference_dataset_dir / "train.jsonl"

    @property
    def preference_validation_file(self) -> Path:
        return self.preference_dataset_dir / "validation.jsonl"

    @property
    def tool_sft_train_file(self) -> Path:
        return self.tool_dataset_dir / "sft_train.jsonl"

    @property
    def tool_prompts_train_file(self) -> Path:
        return self.tool_dataset_dir / "prompts_train.jsonl"

    @property
    def tool_prompts_validation_file(self) -> Path:
        return self.tool_dataset_dir / "prompts_validation.jsonl"

    def artifacts(self) -> list[Path]:
        """All artifact dirs, in build order (the models copy the tokenizer's files)."""
        return [
            self.tokenizer_dir,
            self.text_dataset_dir,
            self.tiny_qwen3_dir,
            self.tiny_qwen3_moe_dir,
            self.chat_dataset_dir,
            self.preference_dataset_dir,
            self.tool_dataset_dir,
        ]

    def missing(self) -> list[Path]:
        """Artifact dirs not there yet (a dir only appears once it is complete)."""
        return [path for path in self.artifacts() if not path.is_dir()]


def default_root() -> Path:
    """$QWEN3_NEURON_ASSETS if set, else ~/.cache/qwen3_neuron/assets-v2 (v2: Qwen3's chat template)."""
    from_env = os.environ.get(ASSETS_ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    return Path.home() / ".cache" / "qwen3_neuron" / "assets-v2"


def asset_paths(root: Path | None = None) -> AssetPaths:
    """Where the assets live under `root` (default: `default_root()`); touches nothing."""
    root = Path(root).expanduser() if root is not None else default_root()
    return AssetPaths(
        root=root,
        tokenizer_dir=root / "tokenizer",
        text_dataset_dir=root / "text_dataset",
        tiny_qwen3_dir=root / "tiny_qwen3",
        tiny_qwen3_moe_dir=root / "tiny_qwen3_moe",
        chat_dataset_dir=root / "chat_dataset",
        preference_dataset_dir=root / "preference_pairs",  # renamed with its contents: a cache rebuilds it
        tool_dataset_dir=root / "tool_calls",
    )


def build_assets(root: Path | None = None, force: bool = False) -> AssetPaths:
    """Build the missing artifacts (all of them with `force`) and return their paths."""
    paths = asset_paths(root)
    paths.root.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = paths.tokenizer_dir  # the models copy its files
    # Writers are looked up here, at call time, so tests can swap one for a failing one.
    writers: dict[Path, Callable[[Path], None]] = {
        paths.tokenizer_dir: write_tokenizer,
        paths.text_dataset_dir: write_text_dataset,
        paths.tiny_qwen3_dir: partial(write_tiny_model, tokenizer_dir=tokenizer_dir, moe=False),
        paths.tiny_qwen3_moe_dir: partial(write_tiny_model, tokenizer_dir=tokenizer_dir, moe=True),
        paths.chat_dataset_dir: write_chat_dataset,
        paths.preference_dataset_dir: write_preference_dataset,
        paths.tool_dataset_dir: write_tool_dataset,
    }
    for final_dir, write in writers.items():
        if force or not final_dir.is_dir():
            _build_atomically(final_dir, write)
    return paths


def build_real_vocab_model(root: Path | None = None) -> Path:
    """The tiny dense Qwen3 with Qwen3's 151,936-row vocabulary (the tokenizer stays the tiny
    one: a model vocabulary larger than its tokenizer's is normal, Qwen3's own is)."""
    paths = build_assets(root)
    if not paths.real_vocab_qwen3_dir.is_dir():
        write = partial(write_tiny_model, tokenizer_dir=paths.tokenizer_dir, moe=False, real_vocab=True)
        _build_atomically(paths.real_vocab_qwen3_dir, write)
    return paths.real_vocab_qwen3_dir


def _build_atomically(final_dir: Path, write: Callable[[Path], None]) -> None:
    """Run `write` into a temp dir beside `final_dir`, then rename it into place."""
    started = time.perf_counter()
    with building(final_dir) as tmp_dir:
        write(tmp_dir)
    logger.info("built %s in %.1f s", final_dir, time.perf_counter() - started)


# ---- text from the standard library ---------------------------------------------------------


def stdlib_sources() -> list[str]:
    """Source text of STDLIB_MODULES that exist in this Python, in list order."""
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    sources = []
    for module in STDLIB_MODULES:
        relative = Path(*module.split("."))
        # A module may be a file or a package, depending on the Python version (e.g. pathlib).
        for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
            candidate = stdlib_dir / candidate
            if candidate.is_file():
                sources.append(candidate.read_text(encoding="utf-8"))
                break
    return sources


def stdlib_docstrings() -> list[str]:
    """Docstrings of the modules, classes and functions in `stdlib_sources()`."""
    docstrings = []
    for source in stdlib_sources():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node)
                if docstring:
                    docstrings.append(docstring)
    return docstrings


def stdlib_definitions() -> list[str]:
    """Source of each top-level function and class (decorators included): one document each."""
    documents = []
    for source in stdlib_sources():
        lines = source.splitlines(keepends=True)
        for node in ast.parse(source).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                first_line = min([node.lineno] + [dec.lineno for dec in node.decorator_list])
                documents.append("".join(lines[first_line - 1 : node.end_lineno]))
    return documents


# ---- writers: each fills an empty dir --------------------------------------------------------


def write_tokenizer(out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer on stdlib docstrings and save it as a HF tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Byte level: every string encodes (no unknown token) and decodes back unchanged.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_docstrings(), trainer)
    if tokenizer.get_vocab_size() != TINY_VOCAB_SIZE:
        raise RuntimeError(
            f"trained {tokenizer.get_vocab_size()} tokens, expected {TINY_VOCAB_SIZE}"
        )

    # transformers writes the tokenizer_config.json both loaders read eos/pad from.
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        model_max_length=TINY_DENSE["max_position_embeddings"],
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    hf_tokenizer.save_pretrained(out_dir)


def write_text_dataset(out_dir: Path) -> None:
    """Write stdlib definitions as train/validation JSON lines plus the dataset card."""
    documents = stdlib_definitions()
    splits = {
        "train": [doc for i, doc in enumerate(documents) if (i + 1) % VALIDATION_EVERY != 0],
        "validation": [doc for i, doc in enumerate(documents) if (i + 1) % VALIDATION_EVERY == 0],
    }
    for split, split_documents in splits.items():
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as file:
            for document in split_documents:
                file.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")
    (out_dir / "README.md").write_text(DATASET_CARD, encoding="utf-8")


CHAT_SYSTEM = "You explain Python's standard library in plain words."


def stdlib_conversations() -> list[dict]:
    """One conversation per documented top-level function: what it does, then its signature.
    Every third one opens with a system turn; the docstring's length varies, so some are longer
    than a short seq_len (what data.overlong handles)."""
    conversations = []
    for source in stdlib_sources():
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            docstring = ast.get_docstring(node)
            if not docstring:
                continue
            messages = [{"role": "system", "content": CHAT_SYSTEM}] if len(conversations) % 3 == 0 else []
            messages += [
                {"role": "user", "content": f"What does {node.name}() do?"},
                {"role": "assistant", "content": docstring},
                {"role": "user", "content": "How is it declared?"},
                {"role": "assistant", "content": lines[node.lineno - 1].strip()},
            ]
            conversations.append({"messages": messages})
    return conversations


def write_chat_dataset(out_dir: Path) -> None:
    """Write the conversations as train/validation JSON lines (every VALIDATION_EVERY-th held out)."""
    conversations = stdlib_conversations()
    for split, keep in (("train", lambda i: (i + 1) % VALIDATION_EVERY != 0),
                        ("validation", lambda i: (i + 1) % VALIDATION_EVERY == 0)):  # fmt: skip
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as file:
            for i, conversation in enumerate(conversations):
                if keep(i):
                    file.write(json.dumps(conversation, ensure_ascii=False) + "\n")


PREFERENCE_CHOSEN = "I answer in one line."  # the chosen reply of every bundled preference pair


def write_preference_dataset(out_dir: Path) -> None:
    """Pairs in TRL's conversational form: the first question of each conversation, the same short
    chosen reply to every one (PREFERENCE_CHOSEN) and random words of the questions rejected
    (seeded): a preference a tiny model learns in a few dozen steps. Every VALIDATION_EVERY-th held out."""
    import random

    questions = [next(m for m in c["messages"] if m["role"] == "user") for c in stdlib_conversations()]
    words = " ".join(q["content"] for q in questions).split()
    rng = random.Random(0)
    rejected = [" ".join(rng.choices(words, k=rng.randint(4, 12))) for _ in questions]
    for split, keep in (("train", lambda i: (i + 1) % VALIDATION_EVERY != 0),
                        ("validation", lambda i: (i + 1) % VALIDATION_EVERY == 0)):  # fmt: skip
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as file:
            for i, question in enumerate(questions):
                if keep(i):
                    pair = {"prompt": [question], "chosen": [{"role": "assistant", "content": PREFERENCE_CHOSEN}],
                            "rejected": [{"role": "assistant", "content": rejected[i]}]}  # fmt: skip
                    file.write(json.dumps(pair, ensure_ascii=False) + "\n")


# examples/my_tools.py's calculator as transformers' get_json_schema describes it (a test holds them equal)
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression of numbers, + - * / // % and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": 'The expression, e.g. "12 * (3 + 4)".'}}, "required": ["expression"]},
        "return": {"type": "string"},
    },
}
TOOL_SFT_ROWS, TOOL_PROMPT_ROWS = 400, 200  # each split's every VALIDATION_EVERY-th held out


def arithmetic_questions(count: int, seed: int) -> list[tuple[str, str, str]]:
    """(question, expression, answer) of sums, differences and products of 2- and 3-digit numbers."""
    import random

    rng = random.Random(seed)
    questions = []
    for _ in range(count):
        a, b, op = rng.randint(10, 999), rng.randint(10, 99), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        answer = str(a + b if op == "+" else a - b if op == "-" else a * b)
        questions.append((f"What is {expression}?", expression, answer))
    return questions


def write_tool_dataset(out_dir: Path) -> None:
    """Calculator conversations (a call, its answer, the reply stating it) and prompt rows with
    their answers, from separate seeds; every VALIDATION_EVERY-th row of each held out."""
    conversations = []
    for question, expression, answer in arithmetic_questions(TOOL_SFT_ROWS, seed=1):
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        conversations.append({"messages": [
            {"role": "user", "content": question}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": answer},
            {"role": "assistant", "content": f"{expression} = {answer}."}], "tools": [CALCULATOR_SCHEMA]})  # fmt: skip
    prompts = [{"prompt": [{"role": "user", "content": question}], "answer": answer}
               for question, _, answer in arithmetic_questions(TOOL_PROMPT_ROWS, seed=2)]  # fmt: skip
    for name, rows in (("sft", conversations), ("prompts", prompts)):
        for split, keep in (("train", lambda i: (i + 1) % VALIDATION_EVERY != 0),
                            ("validation", lambda i: (i + 1) % VALIDATION_EVERY == 0)):  # fmt: skip
            with open(out_dir / f"{name}_{split}.jsonl", "w", encoding="utf-8") as file:
                for i, row in enumerate(rows):
                    if keep(i):
                        file.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_tiny_model(out_dir: Path, tokenizer_dir: Path, moe: bool, real_vocab: bool = False) -> None:
    """Save a seeded, untrained TINY_DENSE Qwen3 (TINY_DENSE_REAL_VOCAB, or TINY_MOE Qwen3-MoE)
    with the tokenizer."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    eos_id = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(EOS_TOKEN)
    if moe:
        config_class, model_class, architecture = Qwen3MoeConfig, Qwen3MoeForCausalLM, TINY_MOE
    else:
        config_class, model_class = Qwen3Config, Qwen3ForCausalLM
        architecture = TINY_DENSE_REAL_VOCAB if real_vocab else TINY_DENSE
    # Qwen3 has no bos token; eos doubles as pad, as in the tokenizer.
    special_ids = dict(bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id)
    config = config_class(**{**architecture, **special_ids})
    torch.manual_seed(MODEL_SEED)  # same seed, same weights, same safetensors bytes
    model_class(config).save_pretrained(out_dir)
    for tokenizer_file in sorted(tokenizer_dir.iterdir()):
        shutil.copy2(tokenizer_file, out_dir / tokenizer_file.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen3_neuron.assets", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--root", type=Path, help=f"cache dir (default: ${ASSETS_ENV_VAR} or {default_root()})"
    )
    parser.add_argument("--force", action="store_true", help="rebuild every artifact")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paths = build_assets(args.root, force=args.force)
    for field in fields(paths):
        print(f"{field.name}: {getattr(paths, field.name)}")
    print(f"dataset: {DATASET_NAME} (validation: {VALIDATION_DATASET_NAME})")
    print(f"dataset_path: {paths.text_dataset_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
