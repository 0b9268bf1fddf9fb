"""A reward model as a GRPO reward: an entry of `grpo.rewards` that is a directory.

The dir is a sequence-classification model with one label (trainer=reward_model's `hf_export`,
or any `AutoModelForSequenceClassification` dir), scored as TRL's GRPOTrainer scores a model among
its `reward_funcs`: loaded with `AutoModelForSequenceClassification.from_pretrained(dir,
num_labels=1)`, in eval mode, frozen; each completion after its prompt as the reward model's chat
template renders them (a string prompt: the two texts joined), tokenized without special tokens,
padded on the right; the reward is the model's logit, which Transformers reads at the last token
that is not padding. Each rank scores its own completions, `BATCH` at a time, on its device, and
`grpo.reward_weights` mixes the scores with the other rewards' as any function's.

Checked before anything starts (`check_reward_model`, in the plan): the dir is such a model
(config.json's architecture and label count), and its tokenizer is the policy's (the same vocabulary:
a reward model trained on another tokenizer reads the same text differently from the one it was
trained to judge). The weights are loaded at the first call, in the workers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from qwen3_neuron.errors import ConfigError

BATCH = 16  # completions scored in one forward
CONFIG_FILE = "config.json"


class RewardModel:
    """A sequence-classification model dir, called as TRL calls a reward function."""

    def __init__(self, path: Path, key: str, device=None):
        self.path, self.key, self.device = Path(path), key, device or "cpu"
        self.__name__ = str(path)
        _check_is_reward_model(self.path, key)
        self._model = self._tokenizer = None

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        import torch

        model, tokenizer = self._loaded()
        if isinstance(prompts[0], str):
            texts = [p + c for p, c in zip(prompts, completions)]
        else:
            texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        scores = []
        for start in range(0, len(texts), BATCH):
            inputs = tokenizer(text=texts[start:start + BATCH], return_tensors="pt", padding=True, padding_side="right",
                               add_special_tokens=False).to(self.device)  # fmt: skip
            with torch.inference_mode():
                scores += model(**inputs).logits[:, 0].float().tolist()
        return scores

    def parameter_bytes(self) -> int:
        """The weights' bytes as loaded (their stored dtypes), from the safetensors headers."""
        from safetensors import safe_open

        total = 0
        for path in self.path.glob("*.safetensors"):
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_slice(name)
                    total += math.prod(tensor.get_shape()) * _DTYPE_BYTES.get(tensor.get_dtype(), 4)
        return total

    def _loaded(self):
        if self._model is None:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.path)
            if tokenizer.pad_token_id is None:  # TRL's choice
                tokenizer.pad_token = tokenizer.eos_token
            model = AutoModelForSequenceClassification.from_pretrained(self.path, num_labels=1, dtype="auto")
            model.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # where its score is read
            self._model = model.to(self.device).eval().requires_grad_(False)
            self._tokenizer = tokenizer
        return self._model, self._tokenizer


def check_reward_model(reward: RewardModel, policy_tokenizer_dir: str) -> None:
    """The plan's check: the reward model reads text with the policy's tokenizer."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(reward.path).get_vocab()
    ours = AutoTokenizer.from_pretrained(policy_tokenizer_dir).get_vocab()
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()))
        raise ConfigError(
            f"{reward.key}: {reward.path}'s tokenizer differs from the policy's ({policy_tokenizer_dir}): "
            f"{len(theirs)} vs {len(ours)} tokens, {len(differ)} token-id pairs not shared (e.g. {differ[0]!r}); "
            "a reward model must be trained on the policy's tokenizer (trainer=reward_model from the same model)."
        )


def _check_is_reward_model(path: Path, key: str) -> None:
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        peft = (path / "adapter_config.json").is_file()
        adapter = " (a PEFT adapter: name the merged model dir, hf_export, instead)" if peft else ""
        raise ConfigError(f"{key}: {path} is a directory without {CONFIG_FILE}, so no sequence-classification "
                          f"model{adapter}; a reward model dir is a trainer=reward_model run's hf_export.")  # fmt: skip
    config = json.loads(config_file.read_text(encoding="utf-8"))
    architectures = config.get("architectures") or []
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)  # Transformers' default: 2
    if not any(name.endswith("ForSequenceClassification") for name in architectures) or labels != 1:
        raise ConfigError(f"{key}: {path} is no sequence-classification model with one label (its config.json: "
                          f"architectures {architectures}, {labels} labels); a reward model dir is a "
                          "trainer=reward_model run's hf_export (Qwen3ForSequenceClassification, "
                          "num_labels 1).")  # fmt: skip


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
