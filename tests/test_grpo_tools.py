"""Agentic GRPO (`grpo.tools`, `grpo.environment`): tool calls parsed from what the policy wrote,
answered (or failed, counted, never stalling the run), the tool turn appended as the chat template
writes it, only the policy's own tokens trained, rewards handed TRL's message lists, and the cache
a rollout runs on giving a whole-buffer forward's logits after each appended tool turn.

The step's tests run the real GRPOStep on the tiny tokenizer with a scripted stand-in policy: its
next token continues one of a few scripted sequences (a fair coin where they part), so every
figure can be computed by hand from the script the row followed."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torchtitan.components.loss import IGNORE_INDEX

from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_tokens
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.generation.tool_calls import ToolCall, parse_turn
from qwen3_neuron.generation.tools import load_tools
from qwen3_neuron.job.settings import GRPOSettings
from qwen3_neuron.launch.hydra_setup import CONF_DIR
from qwen3_neuron.trainers.grpo import ADVANTAGES, GRPOStep
from qwen3_neuron.rewards import tool_success

SEQ_LEN, MAX_COMPLETION = 512, 120
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
CALL = '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER, DIRECT = "<think>\n\n</think>\n\nThe sum is 5.", "It is 6."
# what the tiny model's template (Qwen3's form: assets.build.CHAT_TEMPLATE) writes after an
# assistant turn that called add, for add's answer 5, up to the next assistant turn
TOOL_TURN = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
CALLED = [{"role": "assistant", "content": "", "reasoning_content": "Add them.",
           "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
          {"role": "tool", "name": "add", "content": "5"},
          {"role": "assistant", "content": "The sum is 5."}]  # fmt: skip
REWARD_CALLS: list[dict] = []


def used_the_tool(prompts, completions, completion_ids, **kwargs):
    """A TRL reward over message lists: 1 when the last message answers 5 after a tool call."""
    REWARD_CALLS.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                         **kwargs})  # fmt: skip
    return [float(any(m.get("tool_calls") for m in c) and c[-1]["content"].endswith("5.")) for c in completions]


class _Scripted(torch.nn.Module):
    """Scores 1 on each token some script continues the row's sequence with, -1 elsewhere (the end
    of turn where none does), times the lm_head's weight of the token (20 to start: the script's
    tokens are sampled). Each forward writes its tokens at their positions (the rows'
    sequences, as a KV cache holds them), so it answers alike one token at a time and whole."""

    _skip_lm_head = False

    def __init__(self, scripts: list[list[int]], end_id: int, vocab: int):
        super().__init__()
        self.following: dict[tuple, set] = {}  # a prefix of a script -> the tokens the scripts write next
        for script in scripts:
            for k in range(1, len(script)):
                self.following.setdefault(tuple(script[:k]), set()).add(script[k])
        self.end_id, self.vocab = end_id, vocab
        self.history = torch.zeros(0, 0, dtype=torch.long)
        self.lm_head = _Scaled(vocab)

    def forward(self, tokens, positions=None, attention_masks=None):
        batch, width = tokens.shape
        positions = torch.arange(width).repeat(batch, 1) if positions is None else positions
        columns = max(int(positions.max()) + 1, self.history.shape[1])
        if self.history.shape[0] != batch or self.history.shape[1] < columns:
            grown = torch.zeros(batch, columns, dtype=torch.long)
            if self.history.shape[0] == batch:
                grown[:, :self.history.shape[1]] = self.history
            self.history = grown
        self.history.scatter_(1, positions, tokens)
        hidden = torch.full((batch, width, self.vocab), -1.0)
        for b, (history, row_positions) in enumerate(zip(self.history.tolist(), positions.tolist())):
            for j, position in enumerate(row_positions):
                hidden[b, j, list(self.following.get(tuple(history[:position + 1]), {self.end_id}))] = 1.0
        return hidden if self._skip_lm_head else self.lm_head(hidden)


class _Scaled(torch.nn.Module):
    """The stand-in's lm_head: each token's score scaled by a weight of its own (20 to start)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((vocab,), 20.0))

    def forward(self, hidden):
        return hidden * self.weight


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.tokenizer.encode(text).ids)


def _world(assets, tools=("agentic_tools.add",), environment=None, **grpo):
    """The tokenizer, the prompts' source (with the tools' schemas), the settings and the prompt's ids."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tiny_qwen3_dir))
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "trainer" / "grpo.yaml"))["grpo"]  # the YAML's
    settings = GRPOSettings(**{**defaults, "rewards": [f"{__name__}.used_the_tool"], "tools": list(tools),
                               "environment": environment, "num_generations": 4,
                               "max_completion_length": MAX_COMPLETION, **grpo})  # fmt: skip
    schemas = load_tools(settings.tools, environment, settings.tool_timeout_s).schemas
    source = DataSource(format="prompts", files="unused", prompt_field="prompt", tools=schemas)
    return tokenizer, source, settings


def _scripts(tokenizer, prompt: list[int]) -> dict[str, list[int]]:
    """The sequences the stand-in may write: a call of add, its answer appended, the final answer;
    or a direct answer. Each turn ends with <|im_end|>."""
    end = tokenizer.tokenizer.token_to_id("<|im_end|>")
    called = prompt + _encode(tokenizer, CALL) + [end] + _encode(tokenizer, TOOL_TURN) + _encode(tokenizer, ANSWER)
    return {"called": called + [end], "direct": prompt + _encode(tokenizer, DIRECT) + [end]}


def _trainer(tokenizer, source, model):
    """What GRPOStep reads of torchtitan's trainer; `train_step` runs torchtitan's microbatch loop."""
    trainer = SimpleNamespace(
        model_parts=[model], device=torch.device("cpu"), step=1, gradient_accumulation_steps=2, tokenizer=tokenizer,
        dataloader=SimpleNamespace(packed_datasets=[SimpleNamespace(source=source)]),
        config=SimpleNamespace(training=SimpleNamespace(local_batch_size=4), compile=SimpleNamespace(enable=False),
                               model_spec=SimpleNamespace(name="qwen3")),
        parallel_dims=SimpleNamespace(dp_enabled=False, tp=1),
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


def _install(trainer, settings, lora: bool = True) -> GRPOStep:
    step = GRPOStep(trainer, settings, 3, lora, trainer.train_step)
    step.register()
    trainer.forward_backward_step = step.forward_backward_step
    return step


def _prompt_batches(tokenizer, source, rows: list[dict]):
    while True:
        ids = torch.full((len(rows), SEQ_LEN), tokenizer.eos_id)
        lengths = []
        for b, row in enumerate(rows):
            tokens = prompt_tokens(tokenizer, row, source)
            ids[b, :len(tokens)] = torch.tensor(tokens)
            lengths.append(len(tokens))
        yield {"input": ids, PROMPT: torch.tensor(lengths), ROW: [json.dumps(row) for row in rows]}, ids


def _followed(ids: list[int], scripts: dict[str, list[int]]) -> str:
    return next(name for name, script in scripts.items() if ids[:len(script)] == script)


def _rolled(assets, **grpo):
    """A GRPO step's generation of 8 completions (2 prompts x 4) by the scripted policy."""
    tokenizer, source, settings = _world(assets, **grpo)
    prompt = prompt_tokens(tokenizer, {"prompt": QUESTION}, source)
    scripts = _scripts(tokenizer, prompt)
    model = _Scripted(list(scripts.values()), tokenizer.tokenizer.token_to_id("<|im_end|>"), 2048)
    trainer = _trainer(tokenizer, source, model)
    step = _install(trainer, settings, lora=not settings.beta)
    REWARD_CALLS.clear()
    batches = _prompt_batches(tokenizer, source, [{"prompt": QUESTION, "answer": "5"}] * 2)
    step.train_step(batches)
    return step, trainer, scripts, len(prompt), batches


def test_a_tool_turn_is_appended_as_the_template_writes_it_and_only_the_policys_tokens_train(assets):
    """Each row follows its script: a call of add, add's answer appended as the template writes a tool
    turn, the final answer; or a direct answer. The buffer holds exactly that (the sampled ids as
    sampled), the labels are the policy's own tokens (IGNORE on the prompt, the tool turn and the
    padding), the reward gets TRL's message lists, and the tools' metrics count what happened."""
    step, _, scripts, prompt_length, _ = _rolled(assets)
    tokenizer = step.tokenizer
    end = step.end_id
    call, answer, turn = (_encode(tokenizer, t) for t in (CALL, ANSWER, TOOL_TURN))
    followed = []
    for input_dict, labels in step._generation.microbatches:
        for ids, row_labels in zip(input_dict["input"].tolist(), labels.tolist()):
            name = _followed(ids, scripts)
            followed.append(name)
            script = scripts[name]
            assert ids[len(script):] == [tokenizer.eos_id] * (len(ids) - len(script))  # nothing after it
            # the label of position j is token j + 1, where the policy sampled it
            own = ([*call, end, *[None] * len(turn), *answer, end] if name == "called" else
                   [*_encode(tokenizer, DIRECT), end])  # fmt: skip
            expected = [IGNORE_INDEX] * (prompt_length - 1) + [IGNORE_INDEX if t is None else t for t in own]
            assert row_labels == expected + [IGNORE_INDEX] * (len(row_labels) - len(expected))
    assert set(followed) == {"called", "direct"}, followed  # the coin gave both
    (call_record,) = REWARD_CALLS
    assert call_record["completions"] == [CALLED if name == "called" else
                                          [{"role": "assistant", "content": DIRECT}] for name in followed]  # fmt: skip
    assert call_record["prompts"] == [QUESTION] * 8 and call_record["answer"] == ["5"] * 8
    # TRL's completion_ids: every token after the prompt, the tool turn's too
    assert call_record["completion_ids"] == [scripts[name][prompt_length:] for name in followed]
    metrics = step.step_metrics()
    calls = followed.count("called")
    assert metrics["grpo/tools/call_frequency"] == calls / 8
    assert metrics["grpo/tools/failure_frequency"] == 0.0
    assert metrics["grpo/tools/calls/add"] == calls and metrics["grpo/tools/turns_per_completion"] == (8 + calls) / 8
    lengths = [len(call) + len(answer) + 2 if name == "called" else len(_encode(tokenizer, DIRECT)) + 1
               for name in followed]  # fmt: skip
    assert metrics["grpo/completions/mean_length"] == sum(lengths) / 8  # the policy's tokens only
    assert step._generation.tokens == sum(lengths) and metrics["grpo/completions/clipped_ratio"] == 0.0
    assert metrics["grpo/reward"] == calls / 8


@pytest.mark.parametrize("limit", ["budget", "rounds"])
def test_max_completion_length_and_the_rounds_of_calls_end_a_rollout(assets, limit):
    """budget: grpo.max_completion_length=80 leaves the call's turn (59 tokens) no room for add's turn
    (30) and a token of the model's: the rollout ends at the call, counted as clipped, its tool
    message left out (TRL's rollback). rounds: grpo.max_tool_calling_iterations=1 runs one round; the
    second call ends the rollout, not run, not clipped."""
    tokenizer, source, settings = _world(assets, max_completion_length=80 if limit == "budget" else 200,
                                         max_tool_calling_iterations=1)  # fmt: skip
    end = tokenizer.tokenizer.token_to_id("<|im_end|>")
    prompt = prompt_tokens(tokenizer, {"prompt": QUESTION}, source)
    call, turn = _encode(tokenizer, CALL) + [end], _encode(tokenizer, TOOL_TURN)
    script = prompt + call + turn + call + turn + _encode(tokenizer, ANSWER) + [end]  # calls add twice
    step = _install(_trainer(tokenizer, source, _Scripted([script], end, 2048)), settings)
    REWARD_CALLS.clear()
    step.train_step(_prompt_batches(tokenizer, source, [{"prompt": QUESTION, "answer": "5"}] * 2))
    kept = prompt + call if limit == "budget" else prompt + call + turn + call
    for input_dict, _ in step._generation.microbatches:
        for ids in input_dict["input"].tolist():
            assert ids == kept + [tokenizer.eos_id] * (len(ids) - len(kept))
    assert REWARD_CALLS[0]["completions"] == [CALLED[:1] if limit == "budget" else [*CALLED[:2], CALLED[0]]] * 8
    metrics = step.step_metrics()
    assert metrics["grpo/completions/clipped_ratio"] == (1.0 if limit == "budget" else 0.0)
    assert metrics["grpo/tools/calls"] == 8  # the budget's call was made, its answer did not fit
    assert metrics["grpo/completions/mean_length"] == len(call) * (1 if limit == "budget" else 2)


def _by_hand_loss(step, model, scripts, prompt_length, old_weight, loss_type):
    """The step's loss and token sums from the formulas (`trainers.grpo_loss`), with the mask of the
    scripts' own tokens made here; old and reference log-probabilities from `old_weight`."""
    from qwen3_neuron.models.logprobs import model_token_logps
    from qwen3_neuron.trainers.grpo_loss import batch_loss, token_metric_sums, token_terms

    tokenizer, end = step.tokenizer, step.end_id
    own = {"called": [1] * len(_encode(tokenizer, CALL)) + [1] + [0] * len(_encode(tokenizer, TOOL_TURN))
                     + [1] * len(_encode(tokenizer, ANSWER)) + [1],
           "direct": [1] * (len(_encode(tokenizer, DIRECT)) + 1)}  # fmt: skip
    loss, sums, tokens = 0.0, 0.0, 0
    pieces = []
    for input_dict, _ in step._generation.microbatches:
        ids = input_dict["input"]
        labels = torch.full_like(ids, IGNORE_INDEX)
        for b, row in enumerate(ids.tolist()):
            for k, trained in enumerate(own[_followed(row, scripts)]):
                if trained:
                    labels[b, prompt_length - 1 + k] = row[prompt_length + k]
        tokens += int((labels != IGNORE_INDEX).sum())
        pieces.append((ids, labels, input_dict[ADVANTAGES]))
    for ids, labels, advantages in pieces:
        with torch.no_grad():
            logps = model_token_logps(model, ids, labels, {})
            new = model.lm_head.weight.detach().clone()
            model.lm_head.weight.copy_(old_weight)
            old = model_token_logps(model, ids, labels, {})
            model.lm_head.weight.copy_(new)
        terms = token_terms(logps, old, advantages, labels != IGNORE_INDEX, beta=step.grpo.beta, reference_logps=old)
        loss += float(batch_loss(terms, loss_type, completions=8.0, tokens=float(tokens),
                                 max_completion_length=MAX_COMPLETION))  # fmt: skip
        sums = sums + token_metric_sums(terms)
    return loss, sums


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_tool_tokens_are_out_of_the_loss_the_ratios_the_kl_and_the_token_counts(assets, loss_type):
    """A second step on the same completions (num_iterations=2) after the weights moved (each
    token's own way, and far: the policy no longer sure of its script): every token's ratio and KL
    differ, so a tool token in the mask would change the loss, the clipped shares, the KL and the
    count of tokens that normalises the loss."""
    step, trainer, scripts, prompt_length, batches = _rolled(assets, num_iterations=2, beta=0.04,
                                                             loss_type=loss_type)  # fmt: skip
    model = trainer.model_parts[0]
    old_weight = model.lm_head.weight.detach().clone()
    with torch.no_grad():
        model.lm_head.weight.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(0))
    trainer.losses.clear()
    trainer.step = 2
    step.train_step(batches)
    loss, sums = _by_hand_loss(step, model, scripts, prompt_length, old_weight, loss_type)
    assert float(sum(trainer.losses)) == pytest.approx(loss, rel=1e-5)
    torch.testing.assert_close(step._sums, sums, rtol=1e-5, atol=1e-6)
    assert step._sums[0] == step._generation.tokens  # the tokens the loss is normalised by
    assert step._sums[1] + step._sums[2] > 0 and step._sums[4] > 0  # tokens clipped, a KL: the ratios moved


def test_an_environment_per_rollout_answers_its_calls_and_owns_a_reward(assets):
    """grpo.environment: each rollout's own instance, reset with its row (its text appended to the
    prompt's last message, which the policy then reads), its methods the tools; the rewards get the
    instances as `environments`, and its get_reward() is a reward of weight 1 named after the class."""
    tokenizer, source, settings = _world(assets, tools=(), environment="agentic_tools.Counter")
    end = tokenizer.tokenizer.token_to_id("<|im_end|>")
    row = {"prompt": QUESTION, "start": 3}
    reset = [{"role": "user", "content": QUESTION[0]["content"] + " (the count starts at 3)"}]
    prompt = prompt_tokens(tokenizer, {"prompt": reset}, source)
    call = '<tool_call>\n{"name": "increment", "arguments": {"by": 4}}\n</tool_call>'
    turn = TOOL_TURN.replace("\n5\n", "\n7\n")
    script = prompt + _encode(tokenizer, call) + [end] + _encode(tokenizer, turn) + _encode(tokenizer, "Seven.") + [end]
    trainer = _trainer(tokenizer, source, _Scripted([script], end, 2048))
    step = _install(trainer, settings)
    REWARD_CALLS.clear()
    step.train_step(_prompt_batches(tokenizer, source, [row] * 2))
    for input_dict, _ in step._generation.microbatches:
        assert all(ids[:len(script)] == script for ids in input_dict["input"].tolist())
    (record,) = REWARD_CALLS
    assert record["prompts"] == [reset] * 8 and record["start"] == [3] * 8
    assert [e.count for e in record["environments"]] == [7] * 8 and len(set(map(id, record["environments"]))) == 8
    assert record["completions"][0][1] == {"role": "tool", "name": "increment", "content": "7"}
    metrics = step.step_metrics()
    assert (metrics["grpo/rewards/Counter/mean"], step.rewards.weights) == (7.0, [1.0, 1.0])
    assert metrics["grpo/tools/calls/increment"] == 8


# ---- parsing and running the calls ------------------------------------------------------------


def test_tool_calls_are_parsed_as_trls_qwen3_parser_reads_them(assets):
    """Well-formed turns: the message TRL's parse_response (transformers' parser, TRL's Qwen3 response
    template) makes of them. A block that is not a call: left out of tool_calls, and said why."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import parse_response, qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(assets.tiny_qwen3_dir)
    tokenizer.response_template = qwen3_template
    for text in (CALL, ANSWER, DIRECT, 'Two calls.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
                 '</tool_call>\n<tool_call>\n{"name": "raises", "arguments": {"text": "x"}}\n</tool_call>'):
        ids = tokenizer(text + "<|im_end|>")["input_ids"]
        expected = parse_response(tokenizer, ids, prefix="<|im_start|>assistant\n")
        message, calls = parse_turn(text)
        assert message == expected
        assert [c.name for c in calls] == [c["function"]["name"] for c in expected.get("tool_calls", [])]
    message, calls = parse_turn('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>\n'
                                '<tool_call>["add"]</tool_call><tool_call>\n{"name": "add", "arguments": 3}'
                                '</tool_call><tool_call>\n{"name": "add"')  # fmt: skip
    assert message == {"role": "assistant", "content": ""}
    assert [c.error for c in calls] == [
        'the tool call is not JSON (Expecting property name enclosed in double quotes at character 37): '
        '{"name": "add", "arguments": {"a": 1,}}',
        'a tool call is {"name": ..., "arguments": {...}}, got ["add"]',
        "the arguments of add are not a JSON object: 3",
        "the last <tool_call> block has no </tool_call>"]  # fmt: skip


def test_each_failure_comes_back_as_a_tool_message_counted_and_a_hung_tool_costs_its_timeout_only(tmp_path):
    """Malformed, unknown, wrong arguments, a raise, a timeout: each a tool message saying so, and
    its kind. A tool that never answers holds the round its timeout (the other calls answered meanwhile),
    and its process is gone after it: no thread of the tools in this process, none of theirs left."""
    pids = tmp_path / "pids"
    os.environ["AGENTIC_TOOLS_PIDS"] = str(pids)
    try:
        tools = load_tools(["agentic_tools.add", "agentic_tools.sleeps_forever", "agentic_tools.raises"],
                           "agentic_tools.Counter", 1.0)  # fmt: skip
        counter = tools.new_environment()
        counter.reset(start=3)
        calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("", None, "the tool call is not JSON"),
                 ToolCall("subtract", {"a": 1}), ToolCall("add", {"a": 2}), ToolCall("raises", {"text": "no"}),
                 ToolCall("sleeps_forever", {"seconds": 1}), ToolCall("increment", {"by": 4})]  # fmt: skip
        started = time.monotonic()
        results = tools.run([(call, counter) for call in calls])
        took = time.monotonic() - started
        pid = int(pids.read_text())
    finally:
        del os.environ["AGENTIC_TOOLS_PIDS"]
    assert [(r.name, r.failure) for r in results] == [
        ("add", None), ("", "malformed"), ("subtract", "unknown"), ("add", "arguments"), ("raises", "raised"),
        ("sleeps_forever", "timeout"), ("increment", None)]  # fmt: skip
    assert [r.content for r in results] == [
        "5", "{'error': 'the tool call is not JSON'}",
        "{'error': \"unknown tool 'subtract'; the tools are add, sleeps_forever, raises, increment\"}",
        "{'error': \"wrong arguments for add: missing a required argument: 'b'\"}",
        "{'error': 'raises raised ValueError: no'}",
        "{'error': 'sleeps_forever gave no answer within grpo.tool_timeout_s=1 s and was stopped'}", "7"]  # fmt: skip
    assert counter.count == 7 and 1.0 <= took < 1.5, took
    # the shipped reward for calls that answered, on the messages a completion holds
    turns = [{"role": "assistant", "content": "", "tool_calls": []}, *(r.message() for r in results)]
    assert tool_success([turns, turns[:2], turns[:1], [turns[0], turns[1], turns[3]]]) == [2 / 7, 1.0, 0.0, 0.5]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, and reaped
    assert not [t for t in threading.enumerate() if t.name.startswith("grpo-tool")]
    assert tools.run([(ToolCall("add", {"a": 1, "b": 1}), None)])[0].content == "2"  # a fresh process
    tools.close()


def test_a_tool_the_model_cannot_be_told_about_is_refused_naming_it():
    """(A tool without a docstring: the plan's test below.)"""
    with pytest.raises(ConfigError, match=r"^grpo.tools\[1\]: agentic_tools.untyped cannot be described to the model: "
                                          "Argument a is missing a type hint in function untyped. A tool's schema"):
        load_tools(["agentic_tools.add", "agentic_tools.untyped"], None, 10)
    with pytest.raises(ConfigError, match=r"^grpo.environment: agentic_tools.add must be a class with a reset"):
        load_tools([], "agentic_tools.add", 10)


# ---- the cache after a tool turn ---------------------------------------------------------------

CACHE_SEQ, CACHE_PROMPTS = 256, [5, 14, 9, 30]  # test_grpo.SEQ_LEN: the model=hf policy is built for it
# per forward after the prompts', the tokens written for each row first: decodes, a tool turn
# appended (7 tokens; 41, more than one compiled piece of 32) while a row waits (0) and one goes on
FED = [(1, 1, 1, 1), (1, 1, 1, 1), (7, 41, 0, 1), (1, 1, 1, 1), (1, 0, 1, 1)]


def _rolled_logits(model, model_kind: str, static):
    """Each forward's next-token scores [B, vocab], the position each row last fed (-1: none), and
    the buffer; `static`: on a static cache (True: a new one; or that StaticCache)."""
    from qwen3_neuron.generation.kv_cache import StaticCache
    from qwen3_neuron.generation.rollout import row_forwards

    generator = torch.Generator().manual_seed(5)
    prompt_lengths = torch.tensor(CACHE_PROMPTS)
    ids = torch.randint(1, 2000, (len(CACHE_PROMPTS), CACHE_SEQ), generator=generator)
    ids = ids.masked_fill(torch.arange(CACHE_SEQ) >= prompt_lengths.unsqueeze(1), 0)
    cache = static if isinstance(static, StaticCache) else StaticCache(None) if static else None
    length, fed, out = prompt_lengths.clone(), prompt_lengths.clone(), []
    with torch.no_grad(), row_forwards(model, model_kind == "hf", ids, prompt_lengths, cache, 64) as (prefill, feed):
        out.append((prefill(), prompt_lengths - 1))
        for counts in FED:
            for b, count in enumerate(counts):
                ids[b, length[b]:length[b] + count] = torch.randint(1, 2000, (count,), generator=generator)
                length[b] += count
            out.append((feed(fed, length), torch.where(length > fed, length - 1, -1)))
            fed = length.clone()
    return out, ids


def _assert_whole_buffers(model, model_kind: str, out, ids) -> None:
    """At every forward each row that fed has the scores a whole-buffer forward has at its last
    token. Float32 throughout: the paths differ in the order of their sums only, each sum's
    rounding bounded by 2^-24 times its terms, relative to the logits."""
    from test_grpo import _sampler
    from test_grpo_generation import _summed

    from qwen3_neuron.models.logprobs import hidden_states_out

    inputs = _sampler(1, True, model=model, hf_backend=model_kind == "hf").model_inputs(ids)
    with torch.no_grad(), hidden_states_out(model):
        whole = model.lm_head(model(ids, **inputs)).float()  # [B, S, vocab]: causal, so the buffer as it ends
    tolerance = 2**-24 * max(_summed(model_kind), CACHE_SEQ) * float(whole.abs().max())
    compared = 0
    for scores, positions in out:
        for b, position in enumerate(positions.tolist()):
            if position >= 0:
                torch.testing.assert_close(scores[b], whole[b, position], atol=tolerance, rtol=0)
                compared += 1
    assert compared == 4 + 4 * len(FED) - 2 and whole.std() > 0.1  # every row that fed; the logits not degenerate


@pytest.mark.numerics
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("model_kind", ["native", "hf"])
def test_after_a_tool_turn_the_cache_has_the_whole_buffers_logits_at_every_token(assets, model_kind, static):
    """Rows feed different widths (a decode, a tool turn appended, nothing while they wait), each at
    its own positions (the static cache's in APPEND_WIDTH pieces, run eagerly): at every forward each
    row that fed gets the scores of a whole-buffer forward at its last token."""
    from test_grpo import _tiny_policy

    model = _tiny_policy(assets, model_kind)
    _assert_whole_buffers(model, model_kind, *_rolled_logits(model, model_kind, static))


def test_compiled_blocks_append_tool_turns_with_one_more_graph_compiled_once(assets):
    """torchtitan's compiled blocks (aot_eager, fullgraph): a rollout's forwards take the prompts'
    graph, the decode's and one for tool turns, APPEND_WIDTH columns at a time, each compiled once
    over two generations (nothing recompiles), with the whole buffer's logits."""
    from test_grpo import _tiny_policy
    from test_grpo_generation import _frames

    from qwen3_neuron.generation.kv_cache import StaticCache

    model = _tiny_policy(assets, "native")
    for block in model.layers.values():
        block.compile(backend="aot_eager", fullgraph=True)
    graphs = {"_prefill_128", "_decode", "_append_32"}  # the longest prompt (30) takes the 128-wide forward
    before = _frames(graphs)
    cache = StaticCache("aot_eager")
    for _ in range(2):  # the same buffers, positions and masks as tensors: nothing to recompile
        out, ids = _rolled_logits(model, "native", cache)
    assert sorted(_frames(graphs)[len(before):]) == sorted(graphs)
    _assert_whole_buffers(model, "native", out, ids)


# ---- the plan ---------------------------------------------------------------------------------

TOOL_RUN = ("experiment=cpu_qwen3_tiny_grpo", "grpo.tools=[examples.my_tools.calculator]",
            "grpo.rewards=[qwen3_neuron.rewards.exact_answer]", "training.seq_len=384")  # fmt: skip


def test_the_plan_renders_the_tools_into_every_prompt_and_the_dry_run_names_them(assets, tmp_path):
    """The bundled calculator prompts with grpo.tools: each prompt carries the calculator's schema
    (transformers' get_json_schema of examples/my_tools.py's function, as the bundled SFT rows
    carry it); the dry run says what may be called and shows the schema; Neuron's static-shapes
    line counts the tool turns' graph."""
    from conftest import compose_job, plan_of
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from transformers.utils import get_json_schema

    from examples.my_tools import calculator
    from qwen3_neuron.assets.build import CALCULATOR_SCHEMA
    from qwen3_neuron.job.checks.static_shapes import _check_batches
    from qwen3_neuron.launch.run_job import tool_lines

    plan = plan_of(compose_job(*TOOL_RUN, f"data.files={assets.tool_prompts_train_file}"), tmp_path / "run")
    source = plan.trainer_config.dataloader.sources[0]
    assert source.tools == [get_json_schema(calculator)] == [CALCULATOR_SCHEMA]
    sft_row = json.loads(assets.tool_sft_train_file.read_text().splitlines()[0])
    assert sft_row["tools"] == source.tools  # what SFT taught is what GRPO's prompts say
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets.tiny_qwen3_dir))
    row = json.loads(assets.tool_prompts_train_file.read_text().splitlines()[0])
    assert tokenizer.decode(prompt_tokens(tokenizer, row, source), skip_special_tokens=False) == \
        tokenizer.apply_chat_template(row["prompt"], tools=[CALCULATOR_SCHEMA], add_generation_prompt=True)
    assert tool_lines(plan.trainer_config, plan.settings) == [
        "tools: calculator, at most 4 rounds of calls a completion (grpo.max_tool_calling_iterations), 10 s a "
        "call (grpo.tool_timeout_s); every prompt carries their schemas:",
        f"tool schema: {json.dumps(CALCULATOR_SCHEMA)}"]  # fmt: skip
    assert _check_batches(plan.trainer_config, "").endswith(
        "each new token's (8 x 1) and each tool turn's (8 x 32, as many as it takes), 5 more graphs, each compiled "
        "once")


@pytest.mark.parametrize("overrides, said", [
    (("grpo.tools=[agentic_tools.undocumented]",),
     "grpo.tools[0]: agentic_tools.undocumented cannot be described to the model: Cannot generate JSON schema for "
     "undocumented because it has no docstring. A tool's schema comes from its type hints and docstring "
     "(transformers' get_json_schema, as TRL's): a type hint on each argument, and a docstring with a description "
     "and an `Args:` line per argument."),
    (("grpo.max_tool_calling_iterations=0",),
     "grpo.max_tool_calling_iterations=0: the rounds of tool calls a completion may make, at least 1 with grpo.tools "
     "or grpo.environment (e.g. 4)."),
    (("grpo.environment=agentic_tools.Counter", "grpo.rewards=[agentic_tools.answered]"),
     "grpo.rewards[0]: agentic_tools.answered takes neither `environments` nor **kwargs, and with grpo.environment "
     "every reward is handed each rollout's environment as TRL hands it: add **kwargs to its parameters."),
    (("grpo.rewards=[agentic_tools.counted]",),
     "grpo.rewards[0]: agentic_tools.counted reads `environments`, which only a run with "
     "grpo.environment=module.Class has: set it, or choose another reward."),
    (("data.files={strings}",),
     "grpo.tools: the prompts of {strings} are strings (e.g. 'What is 2 + 3?'); the tools reach the model through "
     'the chat template, which renders message lists: write each prompt as [{{"role": "user", "content": "..."}}].'),
])  # fmt: skip
def test_tool_settings_a_run_could_not_use_are_refused_at_plan_time(assets, tmp_path, overrides, said):
    """Each a ConfigError of one sentence at plan time, naming the key and what would do."""
    from conftest import compose_job, plan_of

    strings = tmp_path / "strings.jsonl"
    strings.write_text(json.dumps({"prompt": "What is 2 + 3?", "answer": "5"}) + "\n")
    overrides = [o.format(strings=strings) for o in overrides]
    with pytest.raises(ConfigError) as refused:
        plan_of(compose_job(*TOOL_RUN, f"data.files={assets.tool_prompts_train_file}", *overrides), tmp_path / "run")
    assert str(refused.value) == said.format(strings=strings)


def test_the_tools_figures_reach_the_summary_the_end_of_run_lines_and_the_live_line(tmp_path):
    """metrics.jsonl's tools/* of each step (as GRPOStep logs them, grpo/ stripped): summary.json
    keeps the first and last call frequency, the last step's failure share and turns, and the run's
    totals; the end-of-run lines and the live line say them."""
    import io

    from test_sweeps import write_records

    from qwen3_neuron.launch.progress import Progress
    from qwen3_neuron.report.summary import summarize, summary_lines

    steps = [{"step": s, "loss": 0.1, "reward": 0.2 * s, "completions/mean_length": 30.0,
              "completions/clipped_ratio": 0.0, "frac_reward_zero_std": 0.0, "tools/call_frequency": frequency,
              "tools/failure_frequency": failed, "tools/turns_per_completion": 1 + frequency, "tools/run_calls": calls,
              "tools/run_failures": failures, "tools/run_timeouts": timeouts}
             for s, frequency, failed, calls, failures, timeouts in ((1, 0.25, 0.5, 2, 1, 1),
                                                                      (2, 1.5, 0.25, 14, 4, 2))]  # fmt: skip
    write_records(tmp_path, steps)
    summary = summarize(tmp_path, "completed", 1.0)
    assert {k: v for k, v in summary.items() if "tool" in k} == {
        "first_tool_call_frequency": 0.25, "tool_call_frequency": 1.5, "tool_failure_frequency": 0.25,
        "tool_turns_per_completion": 2.5, "tool_calls": 14, "tool_failures": 4, "tool_timeouts": 2}  # fmt: skip
    assert ("grpo tools: 0.25 -> 1.50 calls per completion, 25% of the last step's failed, 2.50 turns per "
            "completion; the run made 14 calls, 4 failed, 2 of them past grpo.tool_timeout_s") in summary_lines(summary)
    out = io.StringIO()
    progress = Progress(tmp_path / "metrics.jsonl", total_steps=2, stream=out)
    progress._poll()
    progress.stop()
    assert "step 2/2  reward 0.400  tools 1.50 (25% failed)" in out.getvalue().splitlines()[-1]
