"""One GRPO step split into generation, scoring and training, against an SFT step of the same
trained tokens, same model, on this machine.

Both runs start from the tiny HF Qwen3 dir's weights (model=hf, or `--model native`: torchtitan's
own Qwen3; both generate on a KV cache, eager; checkpointing=from_hf, finetune=full) on one rank
with the same seq_len and batch, so each step trains local_batch_size x seq_len token positions: SFT
on the bundled conversations (data=chat), GRPO on the bundled questions (data=prompts,
`num_generations` completions of up to `max_completion_length` tokens per prompt, rewarded by
examples/my_rewards.digit_share). The two alternate, `--repeats` times, so drift on a shared machine
hits both alike. Per run, the median over steps 2..N of metrics.jsonl:

- GRPO: `generation_seconds` (sampling every completion: one forward of the prompts, then one
  forward of each sampled token on the KV cache), `scoring_seconds` (the reward functions),
  `training_seconds` (torchtitan's train_step on the completions); generation's tokens/s counts the
  completion tokens sampled, training's the positions trained (local_batch_size x seq_len);
- SFT: the step's seconds (positions trained / torchtitan's tokens/s).

Ratios: GRPO's training part / the SFT step (what the loss costs beyond cross-entropy) and the
whole GRPO step / the SFT step, per repeat and of the medians.

    .venv/bin/python -m bench.grpo_step                        # from the repo root: 6 runs
    .venv/bin/python -m bench.grpo_step --model native
    .venv/bin/python -m bench.grpo_step --model hf-real-vocab   # Qwen3's 151,936-token vocabulary
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.dpo_vs_sft import cpu_name
from qwen3_neuron.assets.build import build_real_vocab_model

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, BATCH, STEPS = 128, 8, 6
MODELS = {  # the tiny HF dir's weights, through torchtitan's Transformers backend or into its own Qwen3
    "hf": ("model=hf", "model.hf_model=${assets:tiny_qwen3_dir}", "model.flavor=full"),
    "native": ("model=native", "model.flavor=tiny", "checkpoint.initial_load_path=${assets:tiny_qwen3_dir}"),
    # the tiny body with Qwen3's 151,936-token vocabulary: the lm_head of every sampled token at full size
    "hf-real-vocab": ("model=hf", "model.hf_model=${assets:real_vocab_qwen3_dir}", "model.flavor=full"),
}
SAME_RUN = (
    "checkpointing=from_hf", "finetune=full", "parallelism=fsdp", "device=cpu", "kernels=none", "run.nproc_per_node=1",
    f"training.steps={STEPS}", f"training.seq_len={SEQ_LEN}", f"training.local_batch_size={BATCH}",
    "lr_scheduler.warmup_steps=1", "metrics.enable_tensorboard=false", "hf.first_loss_check=off",
    "data.val_files=null",
)  # fmt: skip
PARTS = ("generation_seconds", "scoring_seconds", "training_seconds")


def launch(args: list[str], run_dir: Path, model: str) -> list[dict]:
    result = subprocess.run([sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *SAME_RUN, *MODELS[model], *args],
                            cwd=REPO, capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(args)}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r and r["step"] > 1]  # step 1 holds the warm-up


def sft(run_dir: Path, model: str) -> dict:
    steps = launch(["data=chat"], run_dir, model)
    seconds = statistics.median(SEQ_LEN * BATCH / r["tokens_per_second"] for r in steps)
    return {"step_seconds": seconds, "tokens_per_second": SEQ_LEN * BATCH / seconds}


def grpo(run_dir: Path, model: str, generations: int, completion_length: int) -> dict:
    steps = launch(["data=prompts", "grpo.rewards=[examples.my_rewards.digit_share]",
                    f"grpo.num_generations={generations}", f"grpo.max_completion_length={completion_length}"],
                   run_dir, model)  # fmt: skip
    part = {name: statistics.median(r[name] for r in steps) for name in PARTS}
    sampled = statistics.median(r["completions/mean_length"] * BATCH / r["generation_seconds"] for r in steps)
    return {**part, "step_seconds": sum(part.values()), "generation_tokens_per_second": sampled,
            "training_tokens_per_second": SEQ_LEN * BATCH / part["training_seconds"],
            "mean_completion_length": statistics.median(r["completions/mean_length"] for r in steps)}  # fmt: skip


def shown(figures: dict) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--model", choices=tuple(MODELS), default="hf")
    args = parser.parse_args()
    if args.model == "hf-real-vocab":
        build_real_vocab_model()
    print(f"CPU: {cpu_name()}; model={args.model}, 1 rank, {BATCH} x {SEQ_LEN} positions trained per step, {STEPS} steps (medians of "
          f"steps 2-{STEPS}); GRPO {args.num_generations} completions per prompt, up to "
          f"{args.max_completion_length} tokens", flush=True)  # fmt: skip
    results: dict[str, list[dict]] = {"sft": [], "grpo": []}
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as scratch:
        for repeat in range(args.repeats):  # interleaved: sft, grpo, sft, grpo, ...
            results["sft"].append(sft(Path(scratch) / f"sft-{repeat}", args.model))
            results["grpo"].append(grpo(Path(scratch) / f"grpo-{repeat}", args.model, args.num_generations,
                                        args.max_completion_length))  # fmt: skip
            s, g = results["sft"][-1], results["grpo"][-1]
            print(f"repeat {repeat + 1}: sft  {shown(s)}\n          grpo {shown(g)}\n          grpo training / sft "
                  f"step {g['training_seconds'] / s['step_seconds']:.3f}, grpo step / sft step "
                  f"{g['step_seconds'] / s['step_seconds']:.3f}", flush=True)  # fmt: skip
    medians = {kind: {name: statistics.median(r[name] for r in runs) for name in runs[0]}
               for kind, runs in results.items()}  # fmt: skip
    s, g = medians["sft"], medians["grpo"]
    print(f"median sft:  {shown(s)}\nmedian grpo: {shown(g)}")
    print(f"medians: grpo training / sft step {g['training_seconds'] / s['step_seconds']:.3f}, grpo step / sft step "
          f"{g['step_seconds'] / s['step_seconds']:.3f}, generation share of the grpo step "
          f"{g['generation_seconds'] / g['step_seconds']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
