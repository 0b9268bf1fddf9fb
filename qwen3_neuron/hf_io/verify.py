"""Check that an HF model dir loads into Transformers as it is: `python -m qwen3_neuron.hf_io.verify DIR`.

A PEFT adapter dir (finetune=lora's `hf_adapter`, with `adapter_config.json`) is checked too:
`check_adapter_dir` loads it onto its base with `peft.PeftModel.from_pretrained`, compares the
file's keys and shapes with the ones PEFT expects, and, given the merged model (`--merged`, by
default the `hf_export` beside it), that base+adapter logits equal the merged model's on a fixed
batch (float32).

Builds the model from the dir's config.json (`AutoModelForCausalLM.from_config`, or
`AutoModelForSequenceClassification` for a reward model's export), reads every
safetensors file of the dir and loads them with `load_state_dict`, then prints the missing and
unexpected keys and any shape mismatch. Exit code 0: everything matched (a missing `lm_head.weight`
is fine when config.json ties it to the embedding); 1: keys or shapes do not match, or a file
cannot be read; 2: the dir is not a model dir at all.

Transformers stores some models on disk in a different layout from the one in memory (MoE
experts: one Linear per expert on disk, fused 3-D tensors in memory). The expected on-disk keys
are therefore Transformers' own reverse conversion of the model's state dict
(`revert_weight_conversion`, what `save_pretrained` writes), and such models are loaded through
`from_pretrained`, which applies the forward conversion.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_neuron.errors import NotAModelDir
from qwen3_neuron.models.hf.model_dir import CONFIG_FILE, INDEX_FILE

TIED_HEAD = "lm_head.weight"


@dataclass
class Report:
    model_dir: Path
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # "key: file (shape) vs model (shape)"
    tied_head: bool = False  # lm_head.weight absent on disk because config.json ties it
    load_errors: list[str] = field(default_factory=list)
    tokenizer_error: str | None = None
    chat_stop_error: str | None = None  # checked with chat=True: generation must end at a turn's end

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.load_errors or self.tokenizer_error
                    or self.chat_stop_error)  # fmt: skip

    def lines(self) -> list[str]:
        out = [f"model dir: {self.model_dir}"]
        out.append(f"missing keys ({len(self.missing)}): {', '.join(self.missing) or '-'}")
        if self.tied_head:
            out.append(f"  ({TIED_HEAD} is tied to model.embed_tokens.weight by config.json: not needed)")
        out.append(f"unexpected keys ({len(self.unexpected)}): {', '.join(self.unexpected) or '-'}")
        if self.mismatched:
            out.append(f"shape mismatches ({len(self.mismatched)}): " + "; ".join(self.mismatched))
        out.extend(f"load error: {e}" for e in self.load_errors)
        if self.tokenizer_error:
            out.append(f"tokenizer: {self.tokenizer_error}")
        if self.chat_stop_error:
            out.append(f"chat: {self.chat_stop_error}")
        out.append("OK" if self.ok else "FAILED")
        return out


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a dir: those its index names, else every *.safetensors."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    return sorted(model_dir.glob("*.safetensors"))


def disk_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """key -> shape of every tensor in the files, from the headers only."""
    from safetensors import safe_open

    shapes = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def check_model_dir(model_dir: Path, *, load: bool = True, trust_remote_code: bool = False, chat: bool = False) -> Report:
    """Compare the dir's safetensors with the model its config.json describes.

    `load=False` checks keys and shapes only, on the meta device (cheap, for any size).
    `chat=True`: the dir is a chat model, so its generation config must stop at its chat
    template's end of turn.
    """
    import torch
    from transformers import AutoConfig
    from transformers.core_model_loading import revert_weight_conversion

    model_dir = Path(model_dir)
    if not (model_dir / CONFIG_FILE).is_file():
        raise NotAModelDir(f"{model_dir}: no {CONFIG_FILE}")
    files = weight_files(model_dir)
    if not files:
        raise NotAModelDir(f"{model_dir}: no *.safetensors files")
    report = Report(model_dir=model_dir)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    try:
        on_disk = disk_shapes(files)
    except Exception as e:  # a truncated or foreign file: safetensors' errors vary
        report.load_errors.append(f"cannot read safetensors headers: {e}")
        return report

    device = "cpu" if load else "meta"
    with torch.device(device):
        model = auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    in_memory = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in revert_weight_conversion(model, in_memory).items()}
    _compare_keys(report, expected, on_disk)
    if TIED_HEAD in report.missing and _ties_head(config):
        report.missing.remove(TIED_HEAD)
        report.tied_head = True
    if load and report.ok:
        same_layout = set(expected) == set(in_memory)
        report.load_errors = _load(model, model_dir, files, same_layout, trust_remote_code)
    if load:
        report.tokenizer_error = _tokenizer_problem(model_dir)
    if chat:
        from qwen3_neuron.hf_io.generation import chat_stop_problem

        report.chat_stop_error = chat_stop_problem(model_dir)
    return report


def auto_model_class(config):
    """Transformers' auto class of the dir's architecture: a causal LM, or a sequence classifier
    (trainer=reward_model's export)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    architectures = getattr(config, "architectures", None) or []
    scored = any(name.endswith("ForSequenceClassification") for name in architectures)
    return AutoModelForSequenceClassification if scored else AutoModelForCausalLM


def _ties_head(config) -> bool:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False))


def _load(model, model_dir: Path, files: list[Path], same_layout: bool, trust_remote_code: bool) -> list[str]:
    """Load the values; return problems (empty when every tensor went in)."""
    from safetensors.torch import load_file

    if same_layout:
        state = {}
        for path in files:
            state.update(load_file(path))
        result = model.load_state_dict(state, strict=False)
        tied = _ties_head(model.config)
        missing = [k for k in result.missing_keys if not (k == TIED_HEAD and tied)]
        problems = [f"load_state_dict missing {missing}"] if missing else []
        if result.unexpected_keys:
            problems.append(f"load_state_dict unexpected {result.unexpected_keys}")
        return problems
    _, info = auto_model_class(model.config).from_pretrained(
        model_dir, output_loading_info=True, trust_remote_code=trust_remote_code
    )
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        values = [v for v in info.get(kind, ()) if not (kind == "missing_keys" and v == TIED_HEAD)]
        if values:
            problems.append(f"from_pretrained {kind}: {sorted(map(str, values))}")
    return problems


def _tokenizer_problem(model_dir: Path) -> str | None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # missing files, bad JSON: Transformers raises many kinds
        return f"AutoTokenizer.from_pretrained fails: {type(e).__name__}: {e}"
    return None


ADAPTER_CONFIG_FILE = "adapter_config.json"  # PEFT's name (peft.utils.CONFIG_NAME)
MERGED_BESIDE = "hf_export"  # where finetune=lora puts the merged model, beside hf_adapter
LOGITS_ATOL = 1e-4  # float32: W x + s B (A x) vs (W + s B A) x differ by rounding only


@dataclass
class AdapterReport:
    adapter_dir: Path
    base_dir: Path
    merged_dir: Path | None = None
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    max_logit_difference: float | None = None  # base+adapter vs merged, on `fixed_batch`
    atol: float = LOGITS_ATOL

    @property
    def ok(self) -> bool:
        close = self.max_logit_difference is None or self.max_logit_difference <= self.atol
        return close and not (self.missing or self.unexpected or self.mismatched)

    def lines(self) -> list[str]:
        out = [f"adapter dir: {self.adapter_dir} (base: {self.base_dir})"]
        out.append(f"missing keys ({len(self.missing)}): {', '.join(self.missing) or '-'}")
        out.append(f"unexpected keys ({len(self.unexpected)}): {', '.join(self.unexpected) or '-'}")
        if self.mismatched:
            out.append(f"shape mismatches ({len(self.mismatched)}): " + "; ".join(self.mismatched))
        if self.merged_dir is None:
            out.append("merged model: none given, logits not compared")
        else:
            out.append(
                f"base+adapter vs merged {self.merged_dir}: max |logit difference| "
                f"{self.max_logit_difference:.3g} (atol {self.atol:g})"
            )
        out.append("OK" if self.ok else "FAILED")
        return out


def fixed_batch(vocab_size: int):
    """Token ids every check uses: 2 x 16, seeded."""
    import torch

    return torch.randint(0, vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))


def check_adapter_dir(
    adapter_dir: Path, base_dir: Path | None = None, merged_dir: Path | None = None, atol: float = LOGITS_ATOL
) -> AdapterReport:
    """Load the adapter onto its base (adapter_config.json's `base_model_name_or_path` unless
    `base_dir`), compare keys and shapes with PEFT's, then logits with `merged_dir`'s model."""
    import torch
    from peft import PeftConfig, PeftModel
    from peft.utils import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / ADAPTER_CONFIG_FILE).is_file():
        raise NotAModelDir(f"{adapter_dir}: no {ADAPTER_CONFIG_FILE}")
    peft_config = PeftConfig.from_pretrained(str(adapter_dir))
    base = base_dir or peft_config.base_model_name_or_path
    if not base:
        raise NotAModelDir(f"{adapter_dir}: {ADAPTER_CONFIG_FILE} names no base model; pass --base DIR")
    report = AdapterReport(adapter_dir=adapter_dir, base_dir=Path(base), merged_dir=merged_dir, atol=atol)
    if peft_config.task_type == "SEQ_CLS":  # trainer=reward_model's: a score head over the base
        auto, kwargs = AutoModelForSequenceClassification, {"num_labels": 1}
    else:
        auto, kwargs = AutoModelForCausalLM, {}
    model = PeftModel.from_pretrained(auto.from_pretrained(base, dtype=torch.float32, **kwargs), str(adapter_dir))
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    on_disk = disk_shapes(sorted(adapter_dir.glob("*.safetensors")))
    _compare_keys(report, expected, on_disk)
    if merged_dir is not None:
        merged = auto.from_pretrained(merged_dir, dtype=torch.float32)
        ids = fixed_batch(merged.config.get_text_config().vocab_size)
        with torch.no_grad():
            difference = (model(ids).logits - merged(ids).logits).abs().max()
        report.max_logit_difference = float(difference)
    return report


def _compare_keys(report, expected: dict[str, tuple], on_disk: dict[str, tuple]) -> None:
    """Fill `report.missing`, `.unexpected` and `.mismatched` (shapes) from two key -> shape maps."""
    report.missing = sorted(set(expected) - set(on_disk))
    report.unexpected = sorted(set(on_disk) - set(expected))
    report.mismatched = [
        f"{key}: file {on_disk[key]} vs model {expected[key]}"
        for key in sorted(set(expected) & set(on_disk))
        if on_disk[key] != expected[key]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_neuron.hf_io.verify", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an HF model dir, or a PEFT adapter dir")
    parser.add_argument("--trust-remote-code", action="store_true", help="passed to Transformers")
    parser.add_argument(
        "--chat", action="store_true", help="a chat model: generation must stop at its chat template's end of turn"
    )
    parser.add_argument("--base", type=Path, help="adapter dir: its base model (default: adapter_config.json's)")
    parser.add_argument(
        "--merged", type=Path, help=f"adapter dir: the merged model (default: {MERGED_BESIDE} beside it)"
    )
    parser.add_argument("--atol", type=float, default=LOGITS_ATOL, help="adapter dir: logit tolerance")
    args = parser.parse_args(argv)
    _quiet_libraries()
    try:
        if (args.model_dir / ADAPTER_CONFIG_FILE).is_file():
            beside = args.model_dir.parent / MERGED_BESIDE
            merged = args.merged or (beside if (beside / CONFIG_FILE).is_file() else None)
            report = check_adapter_dir(args.model_dir, args.base, merged, args.atol)
        else:
            report = check_model_dir(args.model_dir, trust_remote_code=args.trust_remote_code, chat=args.chat)
    except (NotAModelDir, OSError, ValueError) as e:
        print(f"not a loadable model dir: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _quiet_libraries() -> None:
    """The report is the output: no loading progress bars, and not the deprecation PEFT's loading
    triggers inside Transformers (a user can do nothing about it)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


if __name__ == "__main__":
    raise SystemExit(main())
