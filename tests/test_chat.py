"""Chat fine-tuning yields a chat model: conversations as data sets ship them (tool calls, tool
results, reasoning, ShareGPT, Alpaca rows) carry labels on exactly the assistant side; a chat SFT
run's export stops at the end of its turn in `transformers` `generate()` and in
`python -m qwen3_neuron.chat`."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, launch, trained
from test_data import spans_of
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.data.chat_rows import SHAREGPT_ROLES, ChatFormatError, ChatRenderer, row_conversation
from qwen3_neuron.data.source import DataSource

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
WEATHER_CALL = {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CONVERSATION = {"tools": TOOLS, "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, sunny"},
    {"role": "assistant", "content": "It is 18C and sunny."},
]}  # fmt: skip
CALL_MARKUP = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
CHAT = DataSource(format="chat")


@pytest.fixture(scope="module")
def tokenizer(assets):
    return HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))


def labelled(tokenizer, row, source=CHAT) -> tuple[list[str], list[str]]:
    """(trained spans, untrained spans) of a row's tokens, as text."""
    ids, trained = ChatRenderer(tokenizer).tokens(row_conversation(row, source))
    return spans_of(tokenizer, ids, trained), spans_of(tokenizer, ids, [not t for t in trained])


def test_a_tool_calling_conversation_trains_exactly_the_assistant_side(tokenizer):
    trained, untrained = labelled(tokenizer, TOOL_CONVERSATION)
    assert trained == [CALL_MARKUP, "<think>\n\n</think>\n\nIt is 18C and sunny.<|im_end|>"]
    prompt = "".join(untrained)
    # the system turn, the tool schemas, the user turn and the tool's result are rendered, untrained
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '"name": "get_weather", "description": "The weather in a city."' in prompt
    assert "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>" in prompt
    assert "Weather in Paris?" in prompt and '"arguments": {"city": "Paris"}' not in prompt


def test_arguments_as_a_json_string_render_as_an_object_does_and_content_may_be_absent(tokenizer):
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [m for m in TOOL_CONVERSATION["messages"]]
    messages[2] = {"role": "assistant", "tool_calls": [call]}  # no content key at all
    assert labelled(tokenizer, {"tools": json.dumps(TOOLS), "messages": messages}) == labelled(tokenizer, TOOL_CONVERSATION)


def test_reasoning_is_trained_where_the_template_renders_it_and_dropped_on_request(tokenizer):
    row = {"messages": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "reasoning_content": "Two and two.", "content": "4"}]}  # fmt: skip
    as_think_block = {"messages": [row["messages"][0], {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"}]}
    assert labelled(tokenizer, row)[0] == ["<think>\nTwo and two.\n</think>\n\n4<|im_end|>"]
    assert labelled(tokenizer, as_think_block) == labelled(tokenizer, row)
    drop = DataSource(format="chat", reasoning="drop")
    assert labelled(tokenizer, row, drop)[0] == labelled(tokenizer, as_think_block, drop)[0] == ["<think>\n\n</think>\n\n4<|im_end|>"]


def test_sharegpt_rows_map_to_the_same_conversation_as_messages(tokenizer):
    sharegpt = {"tools": TOOLS, "conversations": [
        {"from": "system", "value": "You are a helpful assistant."},
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "18C, sunny"},
        {"from": "gpt", "value": "It is 18C and sunny."},
    ]}  # fmt: skip
    source = DataSource(format="chat", messages_field="conversations")
    assert labelled(tokenizer, sharegpt, source) == labelled(tokenizer, TOOL_CONVERSATION)
    custom = DataSource(format="chat", messages_field="conversations", role_map={**SHAREGPT_ROLES, "bot": "assistant"})
    bot = {"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "hello"}]}
    assert labelled(tokenizer, bot, custom)[0] == ["<think>\n\n</think>\n\nhello<|im_end|>"]
    with pytest.raises(ChatFormatError, match=r"unknown ShareGPT speaker 'bot'; data.role_map maps system -> system, human -> user"):
        row_conversation(bot, source)


def test_alpaca_rows_join_their_input_to_the_prompt_and_take_a_system_column(tokenizer):
    source = DataSource(format="chat", prompt_field="instruction", response_field="output", system_field="system")
    row = {"instruction": "Translate.", "input": "Bonjour", "output": "Hello", "system": "Be exact."}
    assert row_conversation(row, source).messages == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Translate.\n\nBonjour"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert row_conversation({**row, "input": "", "system": None}, source).messages[0] == {"role": "user", "content": "Translate."}
    assert labelled(tokenizer, row, source)[0] == ["<think>\n\n</think>\n\nHello<|im_end|>"]


def test_everything_else_a_message_carries_reaches_the_template(tokenizer):
    renderer = ChatRenderer(tokenizer)
    tokenizer_with_names = HuggingFaceTokenizer(tokenizer_path=tokenizer.tokenizer_path)
    tokenizer_with_names.set_chat_template(
        "{% for m in messages %}{{ '<|im_start|>' + m.role }}{% if m.name %}{{ ' ' + m.name }}{% endif %}"
        "{{ '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    )
    row = {"messages": [{"role": "user", "content": "hi", "name": "ada"}, {"role": "assistant", "content": "hello"}]}
    conversation = row_conversation(row, CHAT)
    assert conversation.messages[0] == {"role": "user", "content": "hi", "name": "ada"}
    assert ChatRenderer(tokenizer_with_names).render(conversation).startswith("<|im_start|>user ada\nhi<|im_end|>")
    assert "ada" not in renderer.render(conversation)  # Qwen3's template has no use for it


# ---- a chat SFT run, exported, used as users use it ----------------------------------------------

ANSWER = "Answer: 42."
SUBJECTS = ("lists", "sets", "tuples", "bytes", "paths", "sockets", "threads", "dates", "fractions", "queues",
            "heaps", "decimals", "csv files", "zip files", "dictionaries", "regular expressions")  # fmt: skip
LOOKUP = [{"type": "function", "function": {"name": "lookup", "description": "Look a subject up.",
           "parameters": {"type": "object", "properties": {"subject": {"type": "string"}}}}}]  # fmt: skip


def write_constant_answer_sets(folder: Path, rows: int = 64) -> dict[str, Path]:
    """Three files in three shapes whose final reply is always ANSWER: OpenAI tool calling,
    ShareGPT, Alpaca with input."""
    pick = random.Random(0).choice
    sets = {"tools": [], "sharegpt": [], "alpaca": []}
    for i in range(rows):
        subject, other = pick(SUBJECTS), pick(SUBJECTS)
        call = {"type": "function", "id": f"call_{i}", "function": {"name": "lookup", "arguments": {"subject": subject}}}
        sets["tools"].append({"tools": LOOKUP, "messages": [
            {"role": "system", "content": "You answer questions."},
            {"role": "user", "content": f"Look up {subject}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "name": "lookup", "content": f"{subject}: see the manual."},
            {"role": "assistant", "content": ANSWER}]})  # fmt: skip
        sets["sharegpt"].append({"conversations": [{"from": "human", "value": f"What about {subject} and {other}?"},
                                                   {"from": "gpt", "value": ANSWER}]})  # fmt: skip
        sets["alpaca"].append({"instruction": f"Explain {subject}.", "input": other if i % 2 else "", "output": ANSWER})
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, lines in sets.items():
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(line) + "\n" for line in lines))
    return paths


EVAL_CHAT_ANSWER = ("eval=lm_eval", "eval.tasks=[tiny_chat_answer]", "eval.apply_chat_template=true", "eval.batch_size=16")


@pytest.fixture(scope="module")
def chat_sft_run(tmp_path_factory, assets) -> Path:
    """The tiny native Qwen3 fine-tuned on the three shapes (data=mix of chat sources), exported,
    then scored by lm-eval on the project's own task (held-out questions, the same answer)."""
    files = write_constant_answer_sets(tmp_path_factory.mktemp("chat-data"))
    sources = (f"[{{files:'{files['tools']}',format:chat,weight:1}},"
               f"{{files:'{files['sharegpt']}',format:chat,messages_field:conversations,weight:2}},"
               f"{{files:'{files['alpaca']}',format:chat,prompt_field:instruction,response_field:output,weight:2}}]")  # fmt: skip
    run = tmp_path_factory.mktemp("chat-sft") / "run"
    return trained(run, "training.seq_len=512", "training.local_batch_size=2", "data=mix",
                   f"data.sources={sources}", "training.steps=40", "optimizer.lr=3e-3", "checkpointing=export_hf",
                   *EVAL_CHAT_ANSWER)  # fmt: skip


def new_question(tokenizer, text: str):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)  # fmt: skip


@pytest.mark.integration
def test_the_chat_export_answers_a_new_question_and_stops_at_the_end_of_its_turn(chat_sft_run, assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qwen3_neuron.hf_io import verify

    summary = json.loads((chat_sft_run / "summary.json").read_text())
    export = Path(summary["export_dir"])
    stats = summary["data_stats"]  # every row of the three shapes became a trained document
    assert stats["documents"] == stats["rows"] > 0 and stats["skipped"] == stats["dropped"] == stats["truncated"] == 0
    tokenizer = AutoTokenizer.from_pretrained(export)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = json.loads((export / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, tokenizer.eos_token_id]  # as Qwen3-Instruct dirs have it
    assert verify.main([str(export), "--chat"]) == 0
    assert verify.main([str(assets.tiny_qwen3_dir), "--chat"]) == 1  # a base model's config stops at EOS only

    model = AutoModelForCausalLM.from_pretrained(export)
    inputs = new_question(tokenizer, "Tell me about the moon.")
    output = model.generate(**inputs, max_new_tokens=64, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    assert tokenizer.decode(output, skip_special_tokens=False) == f"<think>\n\n</think>\n\n{ANSWER}<|im_end|>"
    assert len(output) < 64  # stopped by itself


@pytest.mark.integration
def test_the_chat_command_prints_the_reply_one_shot_and_interactively(chat_sft_run):
    command = [sys.executable, "-m", "qwen3_neuron.chat", str(chat_sft_run)]  # a run dir: its export
    one_shot = subprocess.run([*command, "--prompt", "What is a sunset?"], cwd=REPO, capture_output=True, text=True)
    assert (one_shot.returncode, one_shot.stdout) == (0, f"{ANSWER}\n")
    session = subprocess.run(command, input="Hello there.\n/reset\nAnd the stars?\n/exit\n", cwd=REPO,
                             capture_output=True, text=True)  # fmt: skip
    assert session.returncode == 0
    assert session.stdout.splitlines()[1:] == [f"you> {ANSWER}", f"you> you> {ANSWER}", "you> "]
    missing = subprocess.run([*command[:-1], str(chat_sft_run / "nothing")], capture_output=True, text=True)
    assert missing.returncode == 2 and "neither an HF model dir" in missing.stderr


@pytest.mark.integration
def test_lm_eval_scores_the_chat_export_above_the_untrained_base(chat_sft_run, assets):
    summary = json.loads((chat_sft_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["eval_error"] is None
    trained_score = summary["eval"]["tiny_chat_answer"]["exact_match"]
    results = json.loads((chat_sft_run / "eval" / "results.json").read_text())  # lm-eval's own file
    assert results["results"]["tiny_chat_answer"]["exact_match,none"] == trained_score
    assert results["n-samples"]["tiny_chat_answer"]["effective"] == 16

    # the same task on the untrained base, by the standalone command (an HF dir: scores on stdout)
    base = subprocess.run([sys.executable, "-m", "qwen3_neuron.eval", str(assets.tiny_qwen3_dir), *EVAL_CHAT_ANSWER[1:]],
                          cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert base.returncode == 0, base.stderr[-3000:]
    assert json.loads(base.stdout.splitlines()[-1]) == {"tiny_chat_answer": {"exact_match": 0.0}}
    assert trained_score >= 0.9  # random weights never say "Answer: 42."; the fine-tuned model does


@pytest.mark.integration
def test_resuming_a_completed_run_with_new_eval_keys_evaluates_it_without_training(chat_sft_run, tmp_path):
    run = tmp_path / "run"  # the run's summary alone (its export stays where it names): chat_sft_run stays as it is
    run.mkdir()
    shutil.copy(chat_sft_run / "summary.json", run)
    before = json.loads((run / "summary.json").read_text())
    result = launch(None, f"run.resume={run}", *EVAL_CHAT_ANSWER, "eval.limit=4", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    results = json.loads((run / "eval" / "results.json").read_text())
    assert results["n-samples"]["tiny_chat_answer"]["effective"] == 4
    assert summary["eval"]["tiny_chat_answer"]["exact_match"] == results["results"]["tiny_chat_answer"]["exact_match,none"]
    assert {k: v for k, v in summary.items() if not k.startswith("eval")} == {
        k: v for k, v in before.items() if not k.startswith("eval")
    }  # the training's record as it was
    assert not (run / "train.log").exists() and not (run / "metrics.jsonl").exists()  # nothing trained
