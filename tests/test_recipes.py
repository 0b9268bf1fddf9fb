"""The bundled recipes that learn, run as their docs give them. Minutes each: `make test-recipes`
runs them (CI does, after `make test`), `make test` leaves them out."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl, trained

from qwen3_neuron.generation.tool_calls import parse_turn
from qwen3_neuron.generation.tools import load_tools


def _mean(records: list[dict], figure) -> float:
    return sum(figure(r) for r in records) / len(records)


@pytest.mark.integration
@pytest.mark.recipe
def test_the_tool_recipe_raises_the_share_of_calls_that_answer_and_its_export_calls_the_tool(tmp_path, assets):
    """docs/reinforcement-learning.md's recipe: SFT on the bundled calculator conversations, then
    GRPO with the calculator in the rollout. Over its 40 steps the reward (the share of calls that
    answered) and TRL's tool success (1 - tools/failure_frequency) rise by at least 0.1 from the
    first ten steps to the last ten (measured: 0.53 -> 0.77 and 0.59 -> 0.80), the policy still
    calling; the export, in `transformers`, calls the calculator on held-out questions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema

    from examples.my_tools import calculator

    sft = trained(tmp_path / "tool_sft", "experiment=tool_recipe_sft")
    grpo = trained(tmp_path / "tool_grpo", "experiment=tool_recipe_grpo", f"model.hf_model={sft / 'hf_export'}")
    records = [r for r in read_jsonl(grpo / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in records] == list(range(1, 41))
    first, last = records[:10], records[-10:]
    reward, success = (lambda r: r["reward"]), (lambda r: 1 - r["tools/failure_frequency"])
    print(f"reward {_mean(first, reward):.3f} -> {_mean(last, reward):.3f}, "
          f"tool success {_mean(first, success):.3f} -> {_mean(last, success):.3f}")  # fmt: skip
    assert _mean(last, reward) >= _mean(first, reward) + 0.1
    assert _mean(last, success) >= _mean(first, success) + 0.1
    assert _mean(last, lambda r: r["tools/call_frequency"]) >= 0.9  # better calls, not fewer
    summary = json.loads((grpo / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reward"] == records[-1]["reward"]

    export = grpo / "hf_export"
    tokenizer, model = AutoTokenizer.from_pretrained(export), AutoModelForCausalLM.from_pretrained(export)
    rows = [json.loads(line) for line in assets.tool_prompts_validation_file.read_text().splitlines()]
    first_calls = []
    for row in rows:
        inputs = tokenizer.apply_chat_template(row["prompt"], tools=[get_json_schema(calculator)],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)  # fmt: skip
        output = model.generate(**inputs, max_new_tokens=64, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        _, calls = parse_turn(tokenizer.decode(output, skip_special_tokens=True))
        assert calls, tokenizer.decode(output)  # a call on every question
        first_calls.append(calls[0])
    tools = load_tools(["examples.my_tools.calculator"], None, 10.0)  # as the run and the chat command run it
    try:
        answers = tools.run([(call, None) for call in first_calls])
    finally:
        tools.close()
    assert sum(answer.failure is None for answer in answers) >= 0.8 * len(rows), [a.content for a in answers]
