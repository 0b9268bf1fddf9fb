"""Chat fine-tuning yields a chat model: conversations as data sets ship them (tool calls, tool
results, reasoning, ShareGPT, Alpaca rows) carry labels on exactly the assistant side; a chat SFT
run's export stops at the end of its turn in `transformers` `generate()` and in
`python -m qwen3_neuron.chat`."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest
from conftest import REPO, launch, trained
from test_data import spans_of
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from qwen3_neuron.data.chat_rows import SHAREGPT_ROLES, ChatFormatError, ChatRenderer, row_conversation
from qwen3_neuron.data.source import DataSource
from qwen3_neuron.hf_io.chat_command import MAX_NEW_TOKENS, Reply

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
    assert trained == [f"<think>\n\n</think>\n\n{CALL_MARKUP}", "<think>\n\n</think>\n\nIt is 18C and sunny.<|im_end|>"]
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



# ---- the chat command, in-process: what it sends the model --------------------------------------


class RecordingChat:
    """Chat's stand-in: records each conversation it is asked to continue; replies with a
    reasoning block and a numbered answer."""

    def __init__(self, model_dir, device=None):
        self.device, self.calls = "cpu", []
        RecordingChat.latest = self

    def reply(self, messages, tools=None, **generate_kwargs):
        self.calls.append(([dict(m) for m in messages], tools, generate_kwargs))
        return Reply(f"<think>\nthinking {len(self.calls)}\n</think>\n\nanswer {len(self.calls)}", cut=False)


def chat_command(monkeypatch, capsys, *args: str, typed: str = "") -> tuple[int, list[str], RecordingChat]:
    from qwen3_neuron.hf_io import chat_command as chat

    monkeypatch.setattr(chat, "Chat", RecordingChat)
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    code = chat.main(list(args))
    return code, capsys.readouterr().out.splitlines(), RecordingChat.latest


def test_the_chat_command_keeps_the_conversation_and_reset_clears_it_to_the_system_message(tmp_path, monkeypatch,
                                                                                            capsys):  # fmt: skip
    (tmp_path / "config.json").write_text("{}")  # an HF model dir, as far as the command looks
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    code, out, chat = chat_command(monkeypatch, capsys, str(tmp_path), "--system", "Be brief.", "--tools", str(tools),
                                   typed="Hello.\nAnd then?\n/reset\nAgain.\n/exit\n")  # fmt: skip
    system = {"role": "system", "content": "Be brief."}
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    assert code == 0
    assert [messages for messages, _, _ in chat.calls] == [
        [system, user("Hello.")],
        [system, user("Hello."), {"role": "assistant", "content": "answer 1"}, user("And then?")],
        [system, user("Again.")],  # after /reset: the system message only
    ]
    assert all(t == TOOLS and kw == {"max_new_tokens": MAX_NEW_TOKENS, "do_sample": False} for _, t, kw in chat.calls)
    assert out[1:] == ["you> answer 1", "you> answer 2", "you> you> answer 3", "you> "]  # the answer, not its reasoning


def test_the_chat_command_one_shot_shows_reasoning_and_samples_on_request(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text("{}")
    code, out, chat = chat_command(monkeypatch, capsys, str(tmp_path), "--prompt", "Hi?", "--show_reasoning",
                                   "--do_sample", "--temperature", "0.7", "--top_k", "5", "--max_new_tokens", "9")  # fmt: skip
    assert (code, out) == (0, ["<think>", "thinking 1", "</think>", "answer 1"])
    assert chat.calls == [([{"role": "user", "content": "Hi?"}], None,
                           {"max_new_tokens": 9, "do_sample": True, "temperature": 0.7, "top_k": 5})]  # fmt: skip
    # greedy (no --do_sample): the sampling flags are not passed on
    code, out, chat = chat_command(monkeypatch, capsys, str(tmp_path), "--prompt", "Hi?", "--temperature", "0.7")
    assert (code, out, chat.calls[0][2]) == (0, ["answer 1"], {"max_new_tokens": MAX_NEW_TOKENS, "do_sample": False})


def test_the_chat_command_refuses_tools_that_are_not_a_list(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS[0]))
    from qwen3_neuron.hf_io import chat_command as chat

    assert chat.main([str(tmp_path), "--tools", str(tmp_path / "tools.json"), "--prompt", "Hi?"]) == 2
    expected = f"error: --tools {tmp_path / 'tools.json'}: expected a JSON list of tool schemas\n"
    assert capsys.readouterr().err == expected


class ToolCallingChat(RecordingChat):
    """A stand-in whose first replies call examples/my_tools.py's calculator: once well, once with
    what it refuses; then it answers (or, `calling_forever`, it calls again every turn)."""

    calling_forever = False

    def reply(self, messages, tools=None, **generate_kwargs):
        self.calls.append(([dict(m) for m in messages], tools, generate_kwargs))
        if len(self.calls) > 1 and not self.calling_forever:
            return Reply("<think>\n\n</think>\n\nIt is 84.", cut=False)
        blocks = [f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{e}"}}}}\n</tool_call>'
                  for e in ("12 * 7", "x")]  # fmt: skip
        return Reply("<think>\nA sum.\n</think>\n\nLet me compute.\n" + "\n".join(blocks), cut=False)


def test_the_chat_command_runs_the_tools_the_reply_calls_and_asks_again_with_their_answers(tmp_path, monkeypatch,
                                                                                          capsys):  # fmt: skip
    """`--tools module.function`: GRPO's tools, schemas and loop between turns; a raise comes back as an error."""
    import psutil
    from transformers.utils import get_json_schema

    from examples.my_tools import calculator
    from qwen3_neuron.hf_io import chat_command as chat

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(chat, "Chat", ToolCallingChat)
    code = chat.main([str(tmp_path), "--tools", "examples.my_tools.calculator", "--prompt", "12 times 7?"])
    out = capsys.readouterr().out.splitlines()
    refused = ("{'error': \"calculator raised ValueError: only numbers, + - * / // % and parentheses are allowed, "
               "not 'x'\"}")  # fmt: skip
    assert (code, out) == (0, ["Let me compute.", 'tool> calculator {"expression": "12 * 7"} -> 84',
                               f'tool> calculator {{"expression": "x"}} -> {refused}', "It is 84."])  # fmt: skip
    calls = ToolCallingChat.latest.calls
    assert [tools for _, tools, _ in calls] == [[get_json_schema(calculator)]] * 2
    def call(expression):
        return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}

    assert calls[1][0] == [
        {"role": "user", "content": "12 times 7?"},
        {"role": "assistant", "content": "Let me compute.", "reasoning_content": "A sum.",
         "tool_calls": [call("12 * 7"), call("x")]},
        {"role": "tool", "name": "calculator", "content": "84"},
        {"role": "tool", "name": "calculator", "content": refused},
    ]  # fmt: skip
    tool_processes = [p for p in psutil.Process().children(recursive=True) if "tool_worker" in " ".join(p.cmdline())]
    assert tool_processes == []  # the tool process ended with the command


def test_the_chat_command_stops_at_max_tool_calling_iterations_and_names_a_misspelled_tool(tmp_path, monkeypatch,
                                                                                          capsys):  # fmt: skip
    from qwen3_neuron.hf_io import chat_command as chat

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(chat, "Chat", ToolCallingChat)
    monkeypatch.setattr(ToolCallingChat, "calling_forever", True)
    args = [str(tmp_path), "--tools", "examples.my_tools.calculator", "--prompt", "?", "--max_tool_calling_iterations"]
    assert chat.main([*args, "1"]) == 0
    out, err = capsys.readouterr()
    assert len(ToolCallingChat.latest.calls) == 2 and out.count("tool> calculator") == 2  # one round run, not two
    assert err == ("(the model still calls tools after --max_tool_calling_iterations=1 rounds; "
                   "its calls are not run)\n")  # fmt: skip
    assert chat.main([str(tmp_path), "--tools", "examples.my_tool.calculator", "--prompt", "?"]) == 2
    assert capsys.readouterr().err == (
        "error: --tools: 'examples.my_tool.calculator': module 'examples.my_tool' cannot be imported (No module named "
        "'examples.my_tool'); put it on PYTHONPATH or in the working directory.\n")  # fmt: skip


def test_the_chat_command_tool_defaults_are_grpos():
    from omegaconf import OmegaConf

    from qwen3_neuron.generation.tools import MAX_TOOL_CALLING_ITERATIONS, TOOL_TIMEOUT_S

    grpo = OmegaConf.load(REPO / "conf" / "trainer" / "grpo.yaml").grpo
    assert (TOOL_TIMEOUT_S, MAX_TOOL_CALLING_ITERATIONS) == (grpo.tool_timeout_s, grpo.max_tool_calling_iterations)


def test_chat_renders_system_and_tools_with_the_template_and_stops_a_base_model_at_its_end_of_turn(assets, capsys):
    """A base dir (stops at EOS only): the note on stderr, and generate() told to stop at <|im_end|> too."""
    import torch

    from qwen3_neuron.hf_io.chat_command import Chat

    chat = Chat(assets.tiny_qwen3_dir, "cpu")
    tokenizer = chat.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert capsys.readouterr().err == (
        f"note: {assets.tiny_qwen3_dir}: generation_config.json stops at [{tokenizer.eos_token_id}], not at the chat "
        f"template's end of turn '<|im_end|>' ({im_end}): replies would not end; stopping there in this chat\n")  # fmt: skip
    seen = {}

    def generate(input_ids, attention_mask, eos_token_id, **kwargs):
        seen.update(prompt=tokenizer.decode(input_ids[0]), eos=eos_token_id, kwargs=kwargs)
        written = tokenizer("<think>\n\n</think>\n\nFine.<|im_end|>")["input_ids"]
        return torch.cat([input_ids, torch.tensor([written])], dim=1)

    chat.model.generate = generate
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    assert chat.reply(messages, TOOLS, max_new_tokens=5).text == "<think>\n\n</think>\n\nFine."
    assert seen["prompt"] == tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                                           tokenize=False)  # fmt: skip
    assert "Be brief." in seen["prompt"] and '"name": "get_weather"' in seen["prompt"]
    assert (seen["eos"], seen["kwargs"]) == ([im_end, tokenizer.eos_token_id], {"max_new_tokens": 5})


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
def test_the_chat_command_prints_the_reply_one_shot_and_interactively(chat_sft_run, monkeypatch, capsys):
    """In-process (`main` is what `python -m qwen3_neuron.chat` runs): the trained export's replies."""
    from qwen3_neuron.hf_io.chat_command import main

    assert main([str(chat_sft_run), "--prompt", "What is a sunset?"]) == 0  # a run dir: its export
    assert capsys.readouterr().out == f"{ANSWER}\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there.\n/reset\nAnd the stars?\n/exit\n"))
    assert main([str(chat_sft_run)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [f"you> {ANSWER}", f"you> you> {ANSWER}", "you> "]
    assert main([str(chat_sft_run / "nothing")]) == 2
    assert "neither an HF model dir" in capsys.readouterr().err


@pytest.mark.integration
def test_lm_eval_scores_the_chat_export_above_the_untrained_base(chat_sft_run, assets, capsys):
    summary = json.loads((chat_sft_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["eval_error"] is None
    trained_score = summary["eval"]["tiny_chat_answer"]["exact_match"]
    results = json.loads((chat_sft_run / "eval" / "results.json").read_text())  # lm-eval's own file
    assert results["results"]["tiny_chat_answer"]["exact_match,none"] == trained_score
    assert results["n-samples"]["tiny_chat_answer"]["effective"] == 16

    # the same task on the untrained base, by the standalone command in-process (`python -m
    # qwen3_neuron.eval` runs this main; an HF dir: scores on stdout)
    from qwen3_neuron.eval.__main__ import main

    capsys.readouterr()
    assert main([str(assets.tiny_qwen3_dir), *EVAL_CHAT_ANSWER[1:]]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"tiny_chat_answer": {"exact_match": 0.0}}
    assert trained_score >= 0.9  # random weights never say "Answer: 42."; the fine-tuned model does


@pytest.mark.integration
def test_resuming_a_completed_run_with_new_eval_keys_evaluates_it_without_training(chat_sft_run, tmp_path):
    """Scored again with the project's task and a user's own: the same questions, exact match with
    the chat template, but no pattern of its own for the reasoning block every reply opens with
    (lm-eval's think_end_token takes it off before any task scores)."""
    run = tmp_path / "run"  # the run's summary alone (its export stays where it names): chat_sft_run stays as it is
    run.mkdir()
    shutil.copy(chat_sft_run / "summary.json", run)
    before = json.loads((run / "summary.json").read_text())
    tasks = shutil.copytree(REPO / "qwen3_neuron" / "eval" / "tasks" / "tiny_chat_answer",
                            tmp_path / "tasks")  # fmt: skip
    own = (tasks / "tiny_chat_answer.yaml").read_text().replace("task: tiny_chat_answer", "task: my_chat_answer")
    (tasks / "tiny_chat_answer.yaml").write_text(own.replace('"(?s)^.*</think>", ', ""))
    result = launch(None, f"run.resume={run}", *EVAL_CHAT_ANSWER, "eval.tasks=[tiny_chat_answer,my_chat_answer]",
                    f"eval.include_path={tasks}", "eval.limit=4", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    results = json.loads((run / "eval" / "results.json").read_text())
    assert results["n-samples"]["tiny_chat_answer"]["effective"] == 4
    assert summary["eval"]["tiny_chat_answer"]["exact_match"] == results["results"]["tiny_chat_answer"]["exact_match,none"]
    assert summary["eval"]["my_chat_answer"]["exact_match"] == summary["eval"]["tiny_chat_answer"]["exact_match"] >= 0.75
    assert {k: v for k, v in summary.items() if not k.startswith("eval")} == {
        k: v for k, v in before.items() if not k.startswith("eval")
    }  # the training's record as it was
    assert not (run / "train.log").exists() and not (run / "metrics.jsonl").exists()  # nothing trained


def test_the_chat_command_refuses_a_device_that_is_not_here_as_the_launcher_does(assets, capsys):
    import torch

    from qwen3_neuron.hf_io.chat_command import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main([str(assets.tiny_qwen3_dir), "--device", "cuda", "--prompt", "hi"]) == 2
    build = (f"this torch ({torch.__version__}) is a CPU-only build." if torch.version.cuda is None
             else f"torch is built for CUDA {torch.version.cuda} but sees no GPU")  # fmt: skip
    assert capsys.readouterr().err.startswith(f"error: --device cuda is not available: {build}")


def test_a_reply_cut_while_reasoning_prints_no_reasoning_and_says_it_was_cut(capsys):
    from qwen3_neuron.hf_io.chat_command import Reply, _print_reply, split_reasoning

    assert split_reasoning("<think>\nfirst,\n\n\n") == ("first,", "")
    assert _print_reply(Reply("<think>\nfirst,\n\n\n", cut=True), show_reasoning=False, max_new_tokens=128) == ""
    assert capsys.readouterr() == (
        "\n", "(cut at --max_new_tokens=128 while still reasoning; raise it for longer replies)\n"
    )
    _print_reply(Reply("<think>\n</think>\n\nAnswer: 42.", cut=False), show_reasoning=False, max_new_tokens=128)
    assert capsys.readouterr() == ("Answer: 42.\n", "")
