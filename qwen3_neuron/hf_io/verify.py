"""Check that an HF model dir loads into Transformers as it is: `python -m qwen3_neuron.hf_io.verify DIR`.

Builds the model from the dir's config.json (`AutoModelForCausalLM.from_config`), reads every
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

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.load_errors or self.tokenizer_error)

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


def check_model_dir(model_dir: Path, *, load: bool = True, trust_remote_code: bool = False) -> Report:
    """Compare the dir's safetensors with the model its config.json describes.

    `load=False` checks keys and shapes only, on the meta device (cheap, for any size).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
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
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    in_memory = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in revert_weight_conversion(model, in_memory).items()}
    report.missing = sorted(set(expected) - set(on_disk))
    report.unexpected = sorted(set(on_disk) - set(expected))
    report.mismatched = [
        f"{key}: file {on_disk[key]} vs model {expected[key]}"
        for key in sorted(set(expected) & set(on_disk))
        if on_disk[key] != expected[key]
    ]
    if TIED_HEAD in report.missing and _ties_head(config):
        report.missing.remove(TIED_HEAD)
        report.tied_head = True
    if load and report.ok:
        same_layout = set(expected) == set(in_memory)
        report.load_errors = _load(model, model_dir, files, same_layout, trust_remote_code)
    if load:
        report.tokenizer_error = _tokenizer_problem(model_dir)
    return report


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
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_neuron.hf_io.verify", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--trust-remote-code", action="store_true", help="passed to Transformers")
    args = parser.parse_args(argv)
    try:
        report = check_model_dir(args.model_dir, trust_remote_code=args.trust_remote_code)
    except (NotAModelDir, OSError, ValueError) as e:
        print(f"not a loadable model dir: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
