"""GRPO's step around its formulas (`trainers.grpo`): which completions form a group, where a
completion ends, which tokens train, how the rewards are weighted, how often it generates, and by
what the loss is divided, on one rank and on two.

The policy is a stand-in whose next token is set by the current one (a table), with a fair coin
between two tokens after each prompt: some completions end at <|im_end|>, others run to
`max_completion_length`, and every figure the step reports can be computed by hand from what it
sampled. Its GRPOStep is the real one, wired as GRPOTrainer wires it into a stand-in trainer that runs
torchtitan's microbatch loop.
"""

from __future__ import annotations

import json
import os
import math
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from qwen3_neuron.data.prompts import PROMPT, ROW
from qwen3_neuron.trainers.grpo import ADVANTAGES, OLD_LOGPS, GRPOStep
from qwen3_neuron.job.settings import GRPOSettings
from qwen3_neuron.launch.hydra_setup import CONF_DIR

END, PAD, VOCAB, SEQ_LEN, MAX_COMPLETION = 9, 0, 16, 8, 4
# after a prompt's last token, a coin between two tokens; then the table: 2 and 7 end the turn,
# 3 ends it one token later, 6 repeats itself to max_completion_length (clipped)
PROMPTS = {"two": ([11, 1], 1, (2, 3)), "seven": ([12, 13, 5], 5, (6, 7))}  # name: ids, last token, coin
NEXT = {2: END, 3: 4, 4: END, 6: 6, 7: END, END: PAD, PAD: PAD}
ANSWERS = {"two": "2", "seven": "7"}
WEIGHTS = [1.0, 0.5]
CALLS: list[dict] = []  # every call of `first_is_answer`: what the step handed it


def first_is_answer(prompts, completions, completion_ids, answer, **kwargs):
    """1 when the completion's first token is the row's answer: a reward that depends on the prompt."""
    CALLS.append({"prompts": list(prompts), "completions": list(completions),
                  "completion_ids": [list(ids) for ids in completion_ids], "answer": list(answer)})  # fmt: skip
    return [float(text.split()[0] == expected) for text, expected in zip(completions, answer)]


def shortness(completion_ids, **kwargs):
    return [-len(ids) / 4 for ids in completion_ids]


class _Chains(torch.nn.Module):
    """logits[next] = 50 where the table (or the coin) says, -50 elsewhere; hidden states out when asked."""

    _skip_lm_head = False

    def __init__(self):
        super().__init__()
        table = torch.full((VOCAB, VOCAB), -50.0)
        for token, following in NEXT.items():
            table[token, following] = 50.0
        for _, last, coin in PROMPTS.values():
            table[last, list(coin)] = 50.0
        self.embeddings = torch.nn.Embedding(VOCAB, VOCAB, _weight=table)
        self.lm_head = torch.nn.Linear(VOCAB, VOCAB, bias=False)
        torch.nn.init.eye_(self.lm_head.weight)

    def forward(self, ids, **kwargs):
        hidden = self.embeddings(ids)
        return hidden if self._skip_lm_head else self.lm_head(hidden)


def _prompt_batches(names: list[str]):
    """The dataloader's batches: each a `local_batch_size` of prompt samples, as data=prompts makes them."""
    while True:
        ids = torch.full((len(names), SEQ_LEN), PAD)
        for row, name in enumerate(names):
            ids[row, :len(PROMPTS[name][0])] = torch.tensor(PROMPTS[name][0])
        rows = [json.dumps({"prompt": name, "answer": ANSWERS[name]}) for name in names]
        lengths = torch.tensor([len(PROMPTS[name][0]) for name in names])
        yield {"input": ids, PROMPT: lengths, ROW: rows}, torch.full_like(ids, -100)


def _trainer(parallel_dims=None):
    """What GRPOStep reads of torchtitan's trainer; `train_step` runs torchtitan's microbatch loop."""
    trainer = SimpleNamespace(
        model_parts=[_Chains()], device=torch.device("cpu"), step=1, gradient_accumulation_steps=2,
        tokenizer=SimpleNamespace(tokenizer=SimpleNamespace(token_to_id={"<|im_end|>": END}.get), eos_id=PAD,
                                  decode=lambda ids: " ".join(map(str, ids))),
        dataloader=SimpleNamespace(packed_datasets=[SimpleNamespace(source=SimpleNamespace(prompt_field="prompt"))]),
        config=SimpleNamespace(training=SimpleNamespace(local_batch_size=4), compile=SimpleNamespace(enable=False),
                               model_spec=SimpleNamespace(name="qwen3")),
        parallel_dims=parallel_dims or SimpleNamespace(dp_enabled=False, tp=1),
        metrics_processor=SimpleNamespace(ntokens_since_last_log=0, data_loading_times=[]),
        checkpointer=SimpleNamespace(states={}), train_context=nullcontext, losses=[],
        post_dataloading_process=lambda input_dict, labels: (input_dict["input"], labels, {}),
    )  # fmt: skip

    def train_step(microbatches):
        for input_dict, labels in microbatches:
            trainer.losses.append(trainer.forward_backward_step(input_dict=input_dict, labels=labels,
                                                                global_valid_tokens=None))  # fmt: skip

    trainer.train_step = train_step
    return trainer


def install(trainer, grpo: GRPOSettings, seed: int, lora: bool) -> GRPOStep:
    """The step as `GRPOTrainer` wires it: torchtitan's microbatch loop runs its forward_backward_step."""
    step = GRPOStep(trainer, grpo, seed, lora, trainer.train_step)
    step.register()
    trainer.forward_backward_step = step.forward_backward_step
    return step


def _settings(**changes) -> GRPOSettings:
    """trainer=grpo's section as its YAML writes it (conf/trainer/grpo.yaml), with these rewards and sizes."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "trainer" / "grpo.yaml"))["grpo"]
    return GRPOSettings(**{**defaults, "rewards": [f"{__name__}.first_is_answer", f"{__name__}.shortness"],
                           "reward_weights": WEIGHTS, "num_generations": 4, "max_completion_length": MAX_COMPLETION,
                           **changes})  # fmt: skip


def _by_hand(prompt_names: list[str], completions: list[list[int]]) -> dict:
    """The step's figures from its completions (in the order sampled): lengths, clipped share,
    and advantages with the rewards weighted and each prompt's completions as one group."""
    lengths = [c.index(END) + 1 if END in c else len(c) for c in completions]
    totals = [WEIGHTS[0] * float(c[0] == int(ANSWERS[p])) + WEIGHTS[1] * -n / 4
              for p, c, n in zip(prompt_names, completions, lengths)]  # fmt: skip
    advantages = []
    for name, total in zip(prompt_names, totals):
        group = [t for p, t in zip(prompt_names, totals) if p == name]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((t - mean) ** 2 for t in group) / (len(group) - 1))  # TRL's: n - 1
        advantages.append((total - mean) / (std + 1e-4))
    return {"lengths": lengths, "clipped": sum(END not in c for c in completions) / len(completions),
            "advantages": advantages, "reward": sum(totals) / len(totals)}


def _completions(microbatches) -> tuple[list[str], list[list[int]]]:
    """Per completion in the microbatches: its prompt's name and its sampled tokens (up to MAX_COMPLETION)."""
    names, completions = [], []
    for input_dict, _ in microbatches:
        for ids in input_dict["input"].tolist():
            name = next(n for n, (prompt, _, _) in PROMPTS.items() if ids[:len(prompt)] == prompt)
            names.append(name)
            completions.append(ids[len(PROMPTS[name][0]):][:MAX_COMPLETION])
    return names, completions


def test_a_groups_completions_answer_one_prompt_end_at_im_end_and_train_to_it():
    """A step's completions come in groups of `num_generations` for one prompt each; a finished
    completion ends with <|im_end|>, counted in its length and trained as its last label; the
    clipped share is the completions without it; advantages compare a group's weighted rewards."""
    CALLS.clear()
    step = install(_trainer(), _settings(), seed=3, lora=False)
    step.train_step(_prompt_batches(["two", "seven", "two", "seven"]))
    microbatches = step._generation.microbatches
    names, completions = _completions(microbatches)
    assert names == ["two"] * 4 + ["seven"] * 4  # the loader's first two prompts, each a group of 4
    assert [call["prompts"] for call in CALLS] == [["two"] * 4 + ["seven"] * 4]
    expected = _by_hand(names, completions)
    finished = [END in c for c in completions]
    assert any(finished) and not all(finished), completions  # the coin gave both kinds
    labels = torch.cat([labels for _, labels in microbatches])
    for row, (name, n) in enumerate(zip(names, expected["lengths"])):
        start = len(PROMPTS[name][0]) - 1  # the label at position j is token j + 1
        trained = labels[row].tolist()
        assert trained[start:start + n] == completions[row][:n]
        assert all(label == -100 for j, label in enumerate(trained) if not start <= j < start + n)
        assert CALLS[0]["completion_ids"][row] == completions[row][:n]
        # the text without the end of turn, as TRL decodes it; the row's own columns beside it
        assert CALLS[0]["completions"][row] == " ".join(str(t) for t in completions[row][:n] if t != END)
        assert CALLS[0]["answer"][row] == ANSWERS[name]
    metrics = step.step_metrics()
    assert metrics["grpo/completions/clipped_ratio"] == expected["clipped"]
    assert metrics["grpo/completions/mean_length"] == sum(expected["lengths"]) / 8
    assert metrics["grpo/reward"] == pytest.approx(expected["reward"], abs=1e-6)
    advantages = torch.cat([input_dict[ADVANTAGES] for input_dict, _ in microbatches])
    torch.testing.assert_close(advantages, torch.tensor(expected["advantages"]), atol=1e-5, rtol=1e-5)
    assert metrics["grpo/frac_reward_zero_std"] == 0.0


def test_sampling_stops_once_every_completion_of_the_batch_has_ended(monkeypatch):
    """Completions that all end before max_completion_length cost one forward per token of the
    longest, as generate() stops: none for the padding after it."""
    trainer = _trainer()
    model, forwards = trainer.model_parts[0], []
    forward = model.forward

    def counted(ids, **kwargs):
        forwards.append(ids.shape)
        return forward(ids, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    step = install(trainer, _settings(), seed=3, lora=False)
    step.train_step(_prompt_batches(["two"] * 4))
    microbatches = step._generation.microbatches  # each a batch sampled together, then trained
    longest = [max(c.index(END) + 1 for c in _completions([microbatch])[1]) for microbatch in microbatches]
    assert max(longest) < MAX_COMPLETION  # "two": 2 or 3 tokens, <|im_end|> the last
    assert len(forwards) == sum(longest) + len(microbatches)  # the prompts' forward gives the first token


def test_completions_train_on_their_longest_prompt_and_completion_not_the_whole_buffer(monkeypatch):
    """Eager, a batch of completions in 24-column buffers trains on the columns its longest prompt
    + completion fills (7, rounded up to 8), as TRL trains each batch at its longest: the padding
    after it costs no training; the labels there were all ignored anyway."""
    import test_grpo_wiring

    monkeypatch.setattr(test_grpo_wiring, "SEQ_LEN", 24)
    step = install(_trainer(), _settings(), seed=3, lora=False)
    step.train_step(_prompt_batches(["two", "seven"]))
    names, completions = _completions(step._generation.microbatches)
    ends = [len(PROMPTS[name][0]) + (c.index(END) + 1 if END in c else len(c)) for name, c in zip(names, completions)]
    assert max(ends) == 7
    assert [tuple(d["input"].shape) for d, _ in step._generation.microbatches] == [(4, 8), (4, 8)]
    assert [tuple(labels.shape) for _, labels in step._generation.microbatches] == [(4, 8), (4, 8)]


def test_num_iterations_trains_on_one_generation_that_many_steps(monkeypatch):
    """grpo.num_iterations=2: the second step trains on the first's completions (no new sampling,
    no new rewards), with the sampling policy's log-probabilities kept for the ratio; both sides
    of the ratio at grpo.temperature, the distribution the completions came from."""
    from qwen3_neuron.trainers import grpo as grpo_module

    temperatures = []
    logps_of = grpo_module.model_token_logps
    def recorded(*args, **kwargs):
        temperatures.append(kwargs["temperature"])
        return logps_of(*args, **kwargs)

    monkeypatch.setattr(grpo_module, "model_token_logps", recorded)
    CALLS.clear()
    trainer = _trainer()
    step = install(trainer, _settings(num_iterations=2, temperature=0.7), seed=3, lora=False)
    batches = _prompt_batches(["two", "seven", "two", "seven"])
    step.train_step(batches)
    first = step._generation
    assert all(input_dict[OLD_LOGPS] is not None for input_dict, _ in first.microbatches)
    assert temperatures == [0.7] * 2 * len(first.microbatches)  # the kept log-probabilities, then the step's
    trainer.step = 2
    step.train_step(batches)
    assert step._generation is first and len(CALLS) == 1
    trainer.step = 3
    step.train_step(batches)  # a new generation, from the prompts still in hand
    assert len(CALLS) == 2 and CALLS[1]["prompts"] == ["two"] * 4 + ["seven"] * 4


def _rank(rank: int, port: int, loss_type: str, out_dir: str, same_prompts: bool = False) -> None:
    """One of two data-parallel ranks (gloo): a GRPO step on its own prompts (or both ranks on the
    same), what it trained recorded."""
    import os

    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("batch",))
    trainer = _trainer(SimpleNamespace(dp_enabled=True, tp=1, get_mesh=lambda name: mesh))
    step = install(trainer, _settings(loss_type=loss_type), seed=3, lora=False)
    prompts = [["two", "seven"], ["seven", "two"]][0 if same_prompts else rank]
    step.train_step(_prompt_batches(prompts * 2))
    names, completions = _completions(step._generation.microbatches)
    advantages = torch.cat([input_dict[ADVANTAGES] for input_dict, _ in step._generation.microbatches]).tolist()
    record = {"names": names, "completions": completions, "advantages": advantages,
              "loss": float(sum(trainer.losses)), "reward": step.step_metrics()["grpo/reward"],
              "divisors": [step._generation.completions, step._generation.tokens]}  # fmt: skip
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_two_ranks_divide_the_loss_by_the_global_batch(tmp_path, loss_type):
    """On two data-parallel ranks each rank's loss is its completions' share of the global
    batch's: its token losses over every rank's completion tokens (dapo) or its completions'
    mean token losses over every rank's completions (grpo); each rank trains its own completions'
    advantages; the reward is the global batch's mean."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.start_processes(_rank, args=(port, loss_type, str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [r["names"] for r in ranks] == [["two"] * 4 + ["seven"] * 4, ["seven"] * 4 + ["two"] * 4]
    by_hand = [_by_hand(r["names"], r["completions"]) for r in ranks]  # groups never span ranks
    tokens = sum(sum(h["lengths"]) for h in by_hand)
    assert [r["divisors"] for r in ranks] == [[16, tokens]] * 2  # the global batch's completions and tokens
    # ratio 1 (one iteration, no KL): each completion token's loss is minus its advantage
    for rank, hand in zip(ranks, by_hand):
        assert rank["advantages"] == pytest.approx(hand["advantages"], abs=1e-5)
        if loss_type == "dapo":
            expected = sum(-a * n for a, n in zip(hand["advantages"], hand["lengths"])) / tokens
        else:  # a group's advantages sum to about 0: the divisors above hold this one
            expected = sum(-a for a in hand["advantages"]) / 16
        assert rank["loss"] == pytest.approx(expected, abs=1e-6)
        assert rank["reward"] == pytest.approx((by_hand[0]["reward"] + by_hand[1]["reward"]) / 2, abs=1e-6)


def test_each_data_parallel_rank_samples_its_own_stream(tmp_path):
    """Two ranks given the same prompts at the same step sample different completions: each rank's
    generator is its own (seeded by the seed, the step and the rank), so the ranks' groups are not
    copies of each other."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.start_processes(_rank, args=(port, "dapo", str(tmp_path), True), nprocs=2,
                                          start_method="fork")  # fmt: skip
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["names"] == ranks[1]["names"]
    assert ranks[0]["completions"] != ranks[1]["completions"]


# ---- a user's reward module, as a new user brings one ----------------------------------------

USER_REWARDS = '''\
def always_one(completions, **kwargs):
    return [1.0 for _ in completions]


def needs_an_answer(completions, **kwargs):
    return [float(kwargs["answer"][0] in c) for c in completions]
'''
GRPO_RUN = ("experiment=cpu_qwen3_tiny_grpo", "run.nproc_per_node=1", "checkpointing=[from_hf,periodic]",
            "checkpoint.interval=2", "training.steps=2", "metrics.enable_tensorboard=false")  # fmt: skip


@pytest.mark.integration
def test_a_run_without_signal_says_so_and_resumes_from_another_shell_with_its_reward_module(tmp_path, assets):
    """A reward module on PYTHONPATH, as the docs say; every completion scores 1, so no step has a
    learning signal: the console says so at step 1 and summary.json counts the steps. The run,
    extended from another directory in a shell without that PYTHONPATH, imports the same module."""
    import subprocess
    import sys

    from conftest import REPO, launch

    module_dir = tmp_path / "my_rewards_dir"
    module_dir.mkdir()
    (module_dir / "user_rewards.py").write_text(USER_REWARDS)
    run_dir = tmp_path / "run"
    first = launch(run_dir, *GRPO_RUN, "grpo.rewards=[user_rewards.always_one]", env={"PYTHONPATH": str(module_dir)})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    said = [line for line in first.stdout.splitlines() if "no learning signal" in line]
    assert said[0].startswith("[qwen3-neuron]  no learning signal at step 1: every group's completions scored alike")
    assert json.loads((run_dir / "summary.json").read_text())["no_signal_steps"] == 2
    assert any(line.startswith("[qwen3-neuron]  step 2/2  reward 1.000  ") for line in first.stdout.splitlines())

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    resumed = subprocess.run([sys.executable, str(REPO / "launch.py"), f"run.resume={run_dir}", "training.steps=3"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["no_signal_steps"]) == ("completed", 3, 3)
    assert list(elsewhere.iterdir()) == []  # nothing written where the resume was typed


@pytest.mark.integration
def test_a_reward_that_raises_is_said_once_at_the_users_own_line(tmp_path, assets):
    """The user's reward raises: the console says so once, as the user's mistake (exit code 2), at
    the line of their file that raised, with no frame of the project's; summary.json keeps it."""
    from conftest import launch

    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    run_dir = tmp_path / "run"
    result = launch(run_dir, *GRPO_RUN, "training.steps=1", "checkpointing=from_hf",
                    "grpo.rewards=[user_rewards.needs_an_answer]", env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    console = result.stdout + result.stderr
    said = (f"Reward error: reward user_rewards.needs_an_answer raised KeyError: 'answer' at {tmp_path}/user_rewards.py, "
            "line 6: return [float(kwargs[\"answer\"][0] in c) for c in completions] on completion 0 (prompt ")
    assert result.returncode == 2 and console.count(said) == 1, console[-3000:]
    assert 'File "' not in console  # no traceback: train.log keeps it
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error"].startswith(said)) == ("failed", True)
