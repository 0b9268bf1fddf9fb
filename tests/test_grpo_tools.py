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
from torchtitan.components.loss import IGNORE_INDEX

from qwen3_neuron.data.prompts import PROMPT, ROW, prompt_tokens
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.generation.tool_calls import ToolCall, parse_turn
from qwen3_neuron.generation.tools import load_tools
from qwen3_neuron.job.settings import GRPOSettings
from qwen3_neuron.trainers.grpo import ADVANTAGES, GRPOStep

SEQ_LEN, MAX_COMPLETION = 448, 120
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
CALL = '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER, DIRECT = "<think>\n\n</think>\n\nThe sum is 5.", "It is 6."
# what the tiny model's template (Qwen3's form: assets.build.CHAT_TEMPLATE) writes after an
# assistant turn that called add, for add's answer 5, up to the next assistant turn
TOOL_TURN = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
CALLED = [{"role": "assistant", "content": "", "reasoning_content": "Add them.",
           "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
          {"role": "tool", "name": "add", "content": "5"}, {"role": "assistant", "content": "The sum is 5."}]  # fmt: skip
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
    settings = GRPOSettings(rewards=[f"{__name__}.used_the_tool"], tools=list(tools), environment=environment,
                            num_generations=4, max_completion_length=MAX_COMPLETION, **grpo)  # fmt: skip
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
        parallel_dims=SimpleNamespace(dp_enabled=False),
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
            assert ids[len(script):] == [tokenizer.eos_id] * (SEQ_LEN - len(script))  # nothing after it
            # the label of position j is token j + 1, where the policy sampled it
            own = ([*call, end, *[None] * len(turn), *answer, end] if name == "called" else
                   [*_encode(tokenizer, DIRECT), end])  # fmt: skip
            expected = [IGNORE_INDEX] * (prompt_length - 1) + [IGNORE_INDEX if t is None else t for t in own]
            assert row_labels == expected + [IGNORE_INDEX] * (SEQ_LEN - len(expected))
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
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, and reaped
    assert not [t for t in threading.enumerate() if t.name.startswith("grpo-tool")]
    assert tools.run([(ToolCall("add", {"a": 1, "b": 1}), None)])[0].content == "2"  # a fresh process
    tools.close()


def test_a_tool_the_model_cannot_be_told_about_is_refused_naming_it():
    with pytest.raises(ConfigError) as refused:
        load_tools(["agentic_tools.undocumented"], None, 10)
    assert str(refused.value).startswith("grpo.tools[0]: agentic_tools.undocumented cannot be described to the model: "
                                         "Cannot generate JSON schema for undocumented because it has no docstring!")
    with pytest.raises(ConfigError, match=r"^grpo.tools\[1\]: agentic_tools.untyped cannot be described to the model: "
                                          "Argument a is missing a type hint in function untyped. A tool's schema"):
        load_tools(["agentic_tools.add", "agentic_tools.untyped"], None, 10)
    with pytest.raises(ConfigError, match=r"^grpo.environment: agentic_tools.add must be a class with a reset"):
        load_tools([], "agentic_tools.add", 10)
