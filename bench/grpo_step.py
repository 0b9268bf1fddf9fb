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

`--mode compiled`: GRPO's generation eager (the KV cache as wide as the prompts) against compiled
(`compile.enable=true`: the static KV cache, its graphs compiled in step 1), seq_len 256 and 64-token
completions, the generation seconds per step (median of steps 2..N) per repeat and their ratio,
and the compiled run's graphs and recompiles (summary.json). `--mode trl`: GRPO steps/s against
TRL 1.16's `GRPOTrainer` (Transformers' `generate`, no vLLM) on matched work: the tiny HF dir's
weights, the bundled questions, digit_share, 8 completions of up to 32 tokens for one prompt a
step, bf16 mixed, loss dapo, beta 0; one process and one thread on both sides
(OMP_NUM_THREADS=1); each side's generation (sampling and scoring) and training seconds per step.
`--mode trl-tools`: the same against `GRPOTrainer(tools=[calculator])` on the bundled calculator
prompts (tool_calls/prompts_train.jsonl, their schema in every prompt), rewarded by
`rewards.exact_answer`, 8 completions of up to 64 tokens (the tool turns counted in, TRL's rule),
up to 4 rounds of calls; `--policy DIR` the HF dir both start from (default: the dir `--model`
names, the tiny one for native; the tiny dir calls no tool: give an SFT export on the bundled tool
conversations, as below), each side's calls per completion printed beside its times.

    .venv/bin/python -m bench.grpo_step                        # from the repo root: 6 runs
    .venv/bin/python -m bench.grpo_step --model native
    .venv/bin/python -m bench.grpo_step --model hf-real-vocab   # Qwen3's 151,936-token vocabulary
    .venv/bin/python -m bench.grpo_step --mode compiled
    .venv/bin/python -m bench.grpo_step --mode trl
    .venv/bin/python -m bench.grpo_step --mode trl --model hf-real-vocab   # both sides at Qwen3's vocabulary
    .venv/bin/python launch.py experiment=cpu_qwen3_tiny_sft 'data.files=${assets:tool_sft_train_file}' \
        training.seq_len=512 training.steps=150 optimizer.lr=5e-3 hydra.run.dir=outputs/tool_sft
    .venv/bin/python -m bench.grpo_step --mode trl-tools --policy outputs/tool_sft/hf_export
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
TRL_SEQ_LEN = 72  # --mode trl: the longest bundled question's 33 tokens + 32 completion tokens, rounded up to 8
TOOLS_COMPLETION = 64  # --mode trl-tools: a call, its answer and a reply
TOOLS_SEQ_LEN = 392  # the calculator prompts' 323-325 tokens (the schema in the system turn) + 64, rounded up to 8


def launch(args: list[str], run_dir: Path, model: str, env: dict | None = None) -> list[dict]:
    given = {arg.partition("=")[0] for arg in args}  # `args` may set a key of SAME_RUN anew (training.seq_len)
    same = [arg for arg in SAME_RUN if arg.partition("=")[0] not in given]
    result = subprocess.run([sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *same, *MODELS[model], *args],
                            cwd=REPO, capture_output=True, text=True, env=env)  # fmt: skip
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


def generation(run_dir: Path, model: str, compiled: bool) -> dict:
    """Generation seconds per step, seq_len 256 and 64-token completions, eager or compiled."""
    steps = launch(["data=prompts", "grpo.rewards=[examples.my_rewards.digit_share]", "grpo.num_generations=4",
                    "grpo.max_completion_length=64", "training.seq_len=256", f"compile.enable={str(compiled).lower()}"],
                   run_dir, model, ONE_THREAD)  # fmt: skip
    figures = {"generation_seconds": statistics.median(r["generation_seconds"] for r in steps),
               "mean_completion_length": statistics.median(r["completions/mean_length"] for r in steps)}  # fmt: skip
    if compiled:
        record = json.loads((run_dir / "summary.json").read_text())["compiled"]
        figures |= {"graphs": record["graphs"], "recompiles": record["recompiles"]}
    return figures


def ours_against_trl(run_dir: Path, model: str, policy: Path | None = None, tools: bool = False) -> dict:
    """Our GRPO step on TRL's matched work (8 completions, one prompt a step), at the seq_len that
    holds the longest prompt and a completion: TRL trains each batch at its own longest prompt +
    completion. `policy`: the HF dir to start from instead of `model`'s; `tools`: the calculator
    run (--mode trl-tools)."""
    if not tools:
        work = ["grpo.rewards=[examples.my_rewards.digit_share]", "grpo.max_completion_length=32",
                f"training.seq_len={TRL_SEQ_LEN}"]  # fmt: skip
    else:
        work = ["data.files=${assets:tool_prompts_train_file}", "grpo.tools=[examples.my_tools.calculator]",
                "grpo.rewards=[qwen3_neuron.rewards.exact_answer]", f"grpo.max_completion_length={TOOLS_COMPLETION}",
                f"training.seq_len={TOOLS_SEQ_LEN}"]  # fmt: skip
    if policy is not None:
        work.append(f"model.hf_model={policy}")
    steps = launch(["data=prompts", "grpo.num_generations=8", *work], run_dir, model, ONE_THREAD)
    generation = statistics.median(r["generation_seconds"] + r["scoring_seconds"] for r in steps)
    training = statistics.median(r["training_seconds"] for r in steps)
    figures = {"step_seconds": generation + training, "generation_seconds": generation, "training_seconds": training,
               "mean_completion_length": statistics.median(r["completions/mean_length"] for r in steps)}  # fmt: skip
    if tools:
        figures["tool_calls_per_completion"] = statistics.mean(r["tools/call_frequency"] for r in steps)
    return figures


TRL_RUN = r"""
import json, statistics, sys, time
import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from examples.my_rewards import digit_share
from examples.my_tools import calculator
from qwen3_neuron.rewards import exact_answer

torch.set_num_threads(1)
model_dir, rows_file, out_dir, steps, tools = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "tools"
rows = [json.loads(line) for line in open(rows_file)]
dataset = Dataset.from_list([{"prompt": row["prompt"], **({"answer": row["answer"]} if tools else {})} for row in rows])
work = dict(max_completion_length=64, max_tool_calling_iterations=4) if tools else dict(max_completion_length=32)
args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=8, num_generations=8, **work,
                  max_steps=steps, learning_rate=5e-3, lr_scheduler_type="constant", bf16=True, use_cpu=True,
                  report_to=[], logging_steps=1, save_strategy="no", loss_type="dapo", beta=0.0, seed=0,
                  dataloader_num_workers=0)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
if tools:  # the tiny dir's template is Qwen3's form, not its bytes, by which TRL picks its parser and training template
    from trl.chat_template_utils import qwen3_chat_template
    tokenizer.chat_template = qwen3_chat_template
trainer = GRPOTrainer(model=model_dir, reward_funcs=[exact_answer if tools else digit_share], args=args,
                      train_dataset=dataset, processing_class=tokenizer, tools=[calculator] if tools else None)
generation, steps_seconds = [], []
generate = trainer._generate_and_score_completions
def timed(*a, **k):
    start = time.perf_counter(); out = generate(*a, **k); generation.append(time.perf_counter() - start); return out
trainer._generate_and_score_completions = timed
class Steps(TrainerCallback):
    def on_step_begin(self, *a, **k): self.start = time.perf_counter()
    def on_step_end(self, *a, **k): steps_seconds.append(time.perf_counter() - self.start)
trainer.add_callback(Steps())
trainer.train()
calls = [logs["tools/call_frequency"] for logs in trainer.state.log_history if "tools/call_frequency" in logs]
lengths = [logs["completions/mean_length"] for logs in trainer.state.log_history if "completions/mean_length" in logs]
print(json.dumps({"steps": steps_seconds, "generation": generation, "calls": calls, "lengths": lengths}))
"""


def trl(run_dir: Path, model_dir: Path, rows_file: Path, tools: bool = False) -> dict:
    """TRL's GRPOTrainer on the same work, one process and one thread; steps 2..N."""
    result = subprocess.run([sys.executable, "-c", TRL_RUN, str(model_dir), str(rows_file), str(run_dir), str(STEPS),
                             "tools" if tools else "no-tools"], cwd=REPO, capture_output=True, text=True,
                            env={**ONE_THREAD, "PYTHONPATH": str(REPO)})  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    timings = json.loads(result.stdout.strip().splitlines()[-1])
    steps, generations = timings["steps"][1:], timings["generation"][1:]
    step, generation_ = statistics.median(steps), statistics.median(generations)
    figures = {"step_seconds": step, "generation_seconds": generation_, "training_seconds": step - generation_,
               "mean_completion_length": statistics.median(timings["lengths"][1:])}  # fmt: skip
    if tools:
        figures["tool_calls_per_completion"] = statistics.mean(timings["calls"][1:])
    return figures


def compiled_mode(args) -> None:
    print(f"CPU: {cpu_name()}; model={args.model}, 1 rank, one thread, {BATCH} completions a batch (4 per "
          f"prompt) of up to 64 tokens at seq_len 256; generation seconds a step, medians of steps 2-{STEPS}", flush=True)  # fmt: skip
    ratios = []
    with tempfile.TemporaryDirectory(prefix="grpo-generation-") as scratch:
        for repeat in range(args.repeats):  # interleaved: eager, compiled, eager, compiled, ...
            eager = generation(Path(scratch) / f"eager-{repeat}", args.model, compiled=False)
            compiled = generation(Path(scratch) / f"compiled-{repeat}", args.model, compiled=True)
            ratios.append(compiled["generation_seconds"] / eager["generation_seconds"])
            print(f"repeat {repeat + 1}: eager (KV cache) {shown(eager)}\n          compiled (static KV cache) "
                  f"{shown(compiled)}\n          compiled / eager generation {ratios[-1]:.3f}", flush=True)  # fmt: skip
    print(f"median compiled / eager generation: {statistics.median(ratios):.3f}")


def trl_mode(args) -> None:
    from qwen3_neuron.assets.build import asset_paths

    assets = asset_paths()
    tools = args.mode == "trl-tools"
    # both sides start from the weights --model names (native: the tiny dir's, which TRL loads as HF)
    default_policy = build_real_vocab_model() if args.model == "hf-real-vocab" else assets.tiny_qwen3_dir
    given = Path(args.policy) if args.policy else None  # ours: model.hf_model only when given
    policy = given or default_policy
    work = (f"the calculator prompts with the tool, from {policy}, 8 completions of up to {TOOLS_COMPLETION} tokens "
            f"(ours at seq_len {TOOLS_SEQ_LEN})" if tools else
            f"8 completions of up to 32 tokens (ours at seq_len {TRL_SEQ_LEN})")  # fmt: skip
    print(f"CPU: {cpu_name()}; model={args.model}, 1 process, one thread, bf16 mixed; GRPO on {work} for one prompt "
          f"a step; medians of steps 2-{STEPS}", flush=True)  # fmt: skip
    rows = assets.tool_prompts_train_file if tools else assets.preference_train_file
    ratios = []
    with tempfile.TemporaryDirectory(prefix="grpo-trl-") as scratch:
        for repeat in range(args.repeats):  # interleaved: ours, TRL, ours, TRL, ...
            ours = ours_against_trl(Path(scratch) / f"ours-{repeat}", args.model, given, tools)
            theirs = trl(Path(scratch) / f"trl-{repeat}", policy, rows, tools)
            ratios.append(theirs["step_seconds"] / ours["step_seconds"])
            print(f"repeat {repeat + 1}: ours {shown(ours)}\n          TRL  {shown(theirs)}\n          steps/s "
                  f"ours / TRL {ratios[-1]:.3f}", flush=True)  # fmt: skip
    print(f"median steps/s ours / TRL: {statistics.median(ratios):.3f}")


def shown(figures: dict) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--model", choices=tuple(MODELS), default="hf")
    parser.add_argument("--mode", choices=("sft", "compiled", "trl", "trl-tools"), default="sft")
    parser.add_argument("--policy", help="--mode trl / trl-tools: the HF dir both sides start from")
    args = parser.parse_args()
    if args.policy and (args.mode not in ("trl", "trl-tools") or args.model == "native"):
        parser.error("--policy is an HF dir for --mode trl or trl-tools with --model hf or hf-real-vocab")
    if args.model == "hf-real-vocab":  # built on demand, not with the other assets; every mode can take it
        build_real_vocab_model()
    if args.mode != "sft":
        return compiled_mode(args) if args.mode == "compiled" else trl_mode(args)  # trl and trl-tools
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
