"""Talk to a trained model: `python -m qwen3_neuron.chat <export dir or run dir>`.

Loads the dir with Transformers (`AutoTokenizer`, `AutoModelForCausalLM`), renders each turn with
the dir's own chat template (`apply_chat_template(..., add_generation_prompt=True)`, `--system`
and `--tools` included) and calls `generate()`: greedy unless `--do_sample`, sampling flags named
as `generate()` names them. Prints the reply only (its reasoning with `--show_reasoning`), and
says when `--max_new_tokens` cut it (the default is an interactive turn's, not an essay's).
The generation prompt is the template's own (no `enable_thinking`): the model writes the opening
its training taught (data.thinking=empty_block: the empty `<think>` block on every turn), which
is split off the reply here.
`--tools module.function` (repeatable) names tools as `grpo.tools` does: the same functions, their
schemas (`generation.tools.load_tools`) in the template, and between turns the same loop as GRPO's
rollouts: the reply's `<tool_call>` blocks parsed (`tool_calls.parse_turn`), run in a tool process
with `--tool_timeout_s` per call (a failure, a raise or a timeout answered as a tool message), the
assistant turn and the tool messages appended, and the model asked again, up to
`--max_tool_calling_iterations` rounds. Each call prints as one line, `tool> name {arguments} -> result`.
`--tools file.json` instead renders a JSON list of schemas and runs nothing.
Without `--prompt` it is an interactive prompt that keeps the conversation (`/reset` clears it,
`/exit` or Ctrl-D leaves). A run dir resolves to its summary's `export_dir` (`hf_export`).

A dir whose generation config does not stop at the template's end of turn (a base model's)
is told so on stderr, and this command stops there anyway.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from qwen3_neuron.errors import ExportError
from qwen3_neuron.generation.tool_calls import parse_turn
from qwen3_neuron.generation.tools import MAX_TOOL_CALLING_ITERATIONS, TOOL_TIMEOUT_S, ToolBox, ToolKeys, load_tools
from qwen3_neuron.hf_io.generation import end_of_turn_token, stop_ids, stop_problem
from qwen3_neuron.models.hf.model_dir import CONFIG_FILE
from qwen3_neuron.run_dir import SUMMARY_FILE, read_json

SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty")
MAX_NEW_TOKENS = 128  # an interactive turn: a few seconds on a CPU for the tiny model, a paragraph for a real one


class Reply(NamedTuple):
    text: str  # special tokens removed
    cut: bool  # generation stopped at max_new_tokens, not at the end of the turn


def model_dir_of(path: Path) -> Path:
    """The HF model dir `path` names: itself, or a run dir's export."""
    if (path / CONFIG_FILE).is_file():
        return path
    summary = read_json(path / SUMMARY_FILE)
    exported = summary.get("export_dir") if summary else None
    if exported and (Path(exported) / CONFIG_FILE).is_file():
        return Path(exported)
    raise FileNotFoundError(
        f"{path}: neither an HF model dir (no {CONFIG_FILE}) nor a run dir with an export; "
        "train with checkpointing=export_hf, or pass the export dir"
    )


class Chat:
    """One model dir, loaded once; `reply` renders a conversation and generates its next turn."""

    def __init__(self, model_dir: Path, device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the screen is the conversation's
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(self.device).eval()
        self.stop = stop_ids(self.model.generation_config)
        problem = stop_problem(self.tokenizer, self.model.generation_config)  # the loaded ones: read once
        if problem:
            print(f"note: {model_dir}: {problem}; stopping there in this chat", file=sys.stderr)
            try:
                self.stop = [end_of_turn_token(self.tokenizer)[1], *self.stop]
            except ExportError:
                pass  # no template end of turn to stop at: generation runs to max_new_tokens

    def reply(self, messages: list[dict[str, Any]], tools: list | None = None, **generate_kwargs) -> Reply:
        """The assistant's next turn."""
        import torch

        inputs = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(self.device)
        with torch.no_grad():
            output = self.model.generate(**inputs, eos_token_id=self.stop, **generate_kwargs)
        new = output[0, inputs["input_ids"].shape[1]:]
        cut = len(new) == generate_kwargs.get("max_new_tokens") and int(new[-1]) not in self.stop
        return Reply(self.tokenizer.decode(new, skip_special_tokens=True), cut)


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply that opens with a <think> block (one cut before its end:
    all reasoning); ("", text) otherwise."""
    if "</think>" not in text:
        opened = text.lstrip().startswith("<think>")
        return (text.replace("<think>", "", 1).strip(), "") if opened else ("", text.strip())
    reasoning, answer = text.split("</think>", 1)
    return reasoning.replace("<think>", "", 1).strip(), answer.strip()


def _generate_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": args.do_sample}
    if args.do_sample:
        kwargs.update({name: getattr(args, name) for name in SAMPLING if getattr(args, name) is not None})
    return kwargs


def _print_reply(reply: Reply, show_reasoning: bool, max_new_tokens: int) -> str:
    reasoning, answer = split_reasoning(reply.text)
    if show_reasoning and reasoning:
        print(f"<think>\n{reasoning}\n</think>")
    print(answer, flush=True)
    if reply.cut:
        during = " while still reasoning" if reasoning and not answer else ""
        print(f"(cut at --max_new_tokens={max_new_tokens}{during}; raise it for longer replies)", file=sys.stderr)
    return answer


def load_tool_flags(values: list[str], timeout_s: float) -> tuple[list | None, ToolBox | None]:
    """`--tools` values -> (the schemas for the template, the runnable tools or None): JSON schema
    files, or `module.function` names, not both."""
    files = [v for v in values if v.endswith(".json") or Path(v).is_file()]
    if files and len(files) < len(values):
        raise ValueError(f"--tools {' '.join(values)}: either JSON schema files or module.function tools, not both")
    if not files:
        tools = load_tools(values, None, timeout_s, ToolKeys(tool="--tools", timeout="--tool_timeout_s"))
        return (tools.schemas, tools) if tools else (None, None)
    schemas = []
    for file in files:
        listed = json.loads(Path(file).read_text())
        if not isinstance(listed, list):
            raise ValueError(f"--tools {file}: expected a JSON list of tool schemas")
        schemas += listed
    return schemas, None


def answer(chat: Chat, conversation: list[dict[str, Any]], schemas: list | None, tools: ToolBox | None,
           args: argparse.Namespace) -> None:  # fmt: skip
    """The assistant's answer to the conversation's last turn, printed and appended to it: with
    `tools`, each round of its tool calls run and answered (GRPO's rollout loop), then its next turn."""
    generate_kwargs = _generate_kwargs(args)
    for round in range(args.max_tool_calling_iterations + 1):
        reply = chat.reply(conversation, schemas, **generate_kwargs)
        message, calls = parse_turn(reply.text) if tools else ({}, [])
        if not calls or reply.cut:  # a turn cut inside a call is not run, as in training
            conversation.append({"role": "assistant", "content": _print_reply(reply, args.show_reasoning,
                                                                               args.max_new_tokens)})  # fmt: skip
            return
        if args.show_reasoning and message.get("reasoning_content"):
            print(f"<think>\n{message['reasoning_content']}\n</think>")
        if message["content"]:
            print(message["content"])
        if round == args.max_tool_calling_iterations:
            print(f"(the model still calls tools after --max_tool_calling_iterations={round} rounds; "
                  "its calls are not run)", file=sys.stderr)  # fmt: skip
            conversation.append(message)
            return
        results = tools.run([(call, None) for call in calls])
        for call, result in zip(calls, results):
            called = f"{call.name} {json.dumps(call.arguments)}" if call.arguments is not None else "(no call)"
            print(f"tool> {called} -> {result.content}", flush=True)
        conversation += [message, *(result.message() for result in results)]


def device_problem(device: str) -> str | None:
    """Why `--device` cannot run here, as the launcher's device=... says it; None when it can (or
    torch is left to judge a device type the framework does not know)."""
    from qwen3_neuron.devices.policy import DEVICE_TYPES, unavailable_reason

    kind = device.split(":")[0]
    return unavailable_reason(kind) if kind in DEVICE_TYPES else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_neuron.chat", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="an HF model dir (hf_export) or a run dir that exported one")
    parser.add_argument("--prompt", help="one user message: print the reply and exit")
    parser.add_argument("--system", help="a system message before the conversation")
    parser.add_argument("--tools", action="append", default=[],
                        help="a tool the model may call, module.function (repeatable); or a JSON file of schemas")
    parser.add_argument("--tool_timeout_s", type=float, default=TOOL_TIMEOUT_S, help="the seconds a tool call may take")
    parser.add_argument("--max_tool_calling_iterations", type=int, default=MAX_TOOL_CALLING_ITERATIONS,
                        help="the most rounds of tool calls in one answer")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when there is one, else cpu)")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="the most tokens of one reply")
    parser.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    for name in SAMPLING:
        parser.add_argument(f"--{name}", type=float if name != "top_k" else int, help="with --do_sample")
    parser.add_argument("--show_reasoning", action="store_true", help="print the reply's <think> block too")
    args = parser.parse_args(argv)
    try:
        model_dir = model_dir_of(args.path)
        if args.max_tool_calling_iterations < 0:
            raise ValueError(f"--max_tool_calling_iterations {args.max_tool_calling_iterations}: the most rounds of "
                             "tool calls in one answer, 0 or more")  # fmt: skip
        schemas, tools = load_tool_flags(args.tools, args.tool_timeout_s)
        problem = device_problem(args.device) if args.device else None
        if problem:
            raise ValueError(f"--device {args.device} is not available: {problem}")
        chat = Chat(model_dir, args.device)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    history = [{"role": "system", "content": args.system}] if args.system else []
    try:
        if args.prompt is not None:
            answer(chat, [*history, {"role": "user", "content": args.prompt}], schemas, tools, args)
            return 0
        conversation = list(history)
        print(f"chatting with {model_dir} on {chat.device} (/reset clears the conversation, /exit or Ctrl-D leaves)")
        while True:
            try:
                text = input("you> ")
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if text.strip() == "/exit":
                return 0
            if text.strip() == "/reset":
                conversation = list(history)
                continue
            conversation.append({"role": "user", "content": text})
            answer(chat, conversation, schemas, tools, args)
    finally:
        if tools:
            tools.close()  # no tool process outlives the command
