"""The catalogue of bad inputs: each fails before any worker starts, names the key or file and
what would be valid, and writes nothing. Add a row to extend it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO, SESSION_CACHE, compose_job, launch, plan_of, processes_mentioning

from qwen3_neuron.errors import ConfigError

BLOCKWISE = "qwen3_neuron.kernels.moe.blockwise.blockwise_experts"
FULL_AC = "torchtitan.distributed.activation_checkpoint.FullAC.Config"

# Bad data files for the data rows: "{bad}" in an override is this dir (written by `bad_data`).
BAD_DATA = SESSION_CACHE / "bad-data"
CHAT = ["data=chat", "data.val_files=null"]
DPO = ["experiment=cpu_qwen3_tiny_dpo", "data.val_files=null"]
PREFERENCE = ["experiment=cpu_qwen3_tiny_preference", "data.val_files=null"]  # any trainer=
GRPO = ["experiment=cpu_qwen3_tiny_grpo"]

# (overrides, texts the error must contain)
PLAN_TIME = [
    (["training.stpes=3"], ["training.stpes", "'steps'"]),
    (["model.flavr=x"], ["model.flavr", "'flavor'"]),
    (["optimizer.implementaton=foreach"], ["optimizer.implementaton", "'implementation'"]),
    (["training.steps=abc"], ["training.steps", "expected int", "'abc'"]),
    (["training.dtype=fp16"], ["training.dtype", "'bfloat16'", "'float32'"]),
    (["run.dry_run=maybe"], ["run.dry_run", "expected bool"]),
    (["compile.components=model"], ["compile.components", "expected list"]),
    (["training.steps=0"], ["training.steps must be a positive integer, got 0"]),
    (["training.steps=-5"], ["training.steps must be a positive integer, got -5"]),
    (["training.local_batch_size=0"], ["training.local_batch_size must be a positive integer"]),
    (["training.seq_len=0"], ["training.seq_len must be a positive integer"]),
    (["metrics.log_freq=0"], ["metrics.log_freq must be a positive integer"]),
    (["optimizer.lr=-1e-3"], ["optimizer.lr", "must be > 0"]),
    (["parallelism.pipeline_parallel_microbatch_size=0"], ["pipeline_parallel_microbatch_size must be greater than 0"]),
    (["model.flavor=5B"], ["model.flavor=5B", "4B", "tiny"]),
    (["model.config_fn=qwen3_33b"], ["model.config_fn=qwen3_33b", "qwen3_32b"]),
    (["model.module=qwen4"], ["model.module=qwen4", "torchtitan.models.qwen4.config_registry"]),
    (["device=cuda"], ["device.type=cuda", "CUDA"]),
    (["device=neuron"], ["device.type=neuron", "torch-neuronx"]),
    (["parallelism.tensor_parallel_degree=3"], ["parallelism", "world size 2"]),
    (["run.nproc_per_node=0"], ["run.nproc_per_node", ">= 1"]),
    (["+dump_folder=/tmp/elsewhere"], ["dump_folder", "hydra.run.dir"]),
    (["hf_assets_path=/nonexistent/tokenizer"], ["hf_assets_path=/nonexistent/tokenizer", "qwen3_neuron.assets"]),
    (["dataloader.dataset_path=/nonexistent/data"], ["dataloader.dataset_path=/nonexistent/data", "does not exist"]),
    (["+activation_checkpoint._target_=torchtitan.config.configs.TrainingConfig"], ["activation_checkpoint._target_", "FullAC.Config"]),
    (["+activation_checkpoint._target_=no_such_pkg.Thing.Config"], ["activation_checkpoint._target_", "cannot import"]),
    (["model=moe", "kernels=nki"], ["kernels=nki needs device neuron", "kernels=blockwise"]),
    (["model=moe", "kernels.overrides=[no_such_pkg.moe.experts]"], ["no_such_pkg.moe.experts", "could not be imported"]),
    (["model=moe", "kernels.overrides=[qwen3_neuron.worker.metrics.not_an_override]"], ["names no registered @override"]),
    (["kernels=blockwise"], ["kernels=blockwise replaces the experts of torchtitan's MoE layers", "use model=moe"]),
    (["model=hf", "kernels=blockwise"], ["model=hf has none: use model=moe"]),
    (["kernels.overrides=[qwen3_neuron.kernels.moe.blockwise.blockwise_experts]"], [f"'{BLOCKWISE}' matches no node"]),
    (["model=moe", "kernels=blockwise", "kernels.overrides=[examples.my_moe.my_experts]"], ["both claim node", "kernels=none"]),
    (["model=moe", "model.top_k=9"], ["model.top_k=9", "8 experts"]),
    (["model=moe", "model.num_experts=0"], ["model.num_experts must be >= 1"]),
    (["model=moe", "model.flavor=tiny"], ["model.flavor=tiny", "tiny_moe"]),
    (["model.num_experts=4"], ["model.num_experts applies to model=moe"]),
    (["model=moe", "checkpointing=export_hf"], ["checkpointing=export_hf cannot export model.flavor=tiny_moe",
                                                "native MoE models have no config.json mapping", "checkpointing=periodic"]),
    (["model.flavor=32B"], ["does not fit", "GiB of", "parameters 61.02", "more FSDP ranks", "run.memory_check=warn"]),
    # torchtitan's own checks (ParallelDims, update_from_config, _validate_cuda_graphs), named
    (["parallelism.context_parallel_degree=0"], ["parallelism.context_parallel_degree=0: must be >= 1"]),
    (["training.seq_len=4096"], ["training.seq_len=4096 is too long for qwen3 tiny", "RoPE maximum", "2048"]),
    (["parallelism=pp", "training.disable_cuda_graphs=false"],
     ["CUDA graphs do not support pipeline parallelism", "training.disable_cuda_graphs"]),
    # finetune=lora (the base-load rows name a from_hf dir so that only the LoRA key is wrong)
    (["finetune=lora", "finetune.target_modules=[q_proj,k_proj,v_proj,qkv_proj]"],
     ["finetune.target_modules: unknown module 'qkv_proj'", "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"]),
    (["finetune=lora", "finetune.rank=0"], ["finetune.rank must be a positive integer, got 0"]),
    (["finetune=lora", "finetune.rank=-4"], ["finetune.rank must be a positive integer, got -4"]),
    (["finetune=lora", "finetune.dropout=1.0"], ["finetune.dropout must be in [0, 1)", "got 1.0"]),
    (["finetune=lora", "finetune.target_modules=[q_proj,o_proj]"],
     ["computes q_proj, k_proj, v_proj with one projection (wqkv)", "all of them or none"]),
    (["finetune=lora", "model=moe", "finetune.target_modules=[gate_proj,up_proj]"],
     ["matches no Linear layer of this model", "q_proj, k_proj, v_proj, o_proj"]),
    (["finetune=lora", "model=hf"], ["nothing loads it", "checkpointing=from_hf (model.hf_model's weights"]),
    (["finetune=lora", "model=hf", "finetune.dropout=-0.1"], ["finetune.dropout must be in [0, 1)", "got -0.1"]),
    (["finetune=lora", "model=hf", "model.hf_model=${assets:tiny_qwen3_moe_dir}", "checkpointing=from_hf",
      "finetune.target_modules=[gate_proj,up_proj]"],
     ["matches no Linear layer of this model", "its Linear layers: k_proj, lm_head, o_proj, q_proj, v_proj"]),
    (["finetune=lora"], ["finetune=lora freezes the base model, but nothing loads it", "checkpointing=from_hf",
                         "checkpoint.initial_load_path=/abs/hf_dir"]),
    (["finetune=lora", "checkpointing=periodic"], ["nothing loads it"]),
    (["finetune=lora", "finetune.rnak=4"], ["finetune.rnak", "'rank'"]),
    # what torchtitan's train.main would assert once the workers run
    (["checkpointing=periodic", "checkpoint.create_seed_checkpoint=true"],
     ["checkpoint.create_seed_checkpoint=true needs world size 1", "world size 2", "run.nproc_per_node=1"]),
    (["checkpoint.create_seed_checkpoint=true", "run.nproc_per_node=1"],
     ["checkpoint.create_seed_checkpoint=true needs checkpoint.enable=true"]),
    # data=text|chat|mix: first rows only, before any worker
    (["data=text", "data.files=/nonexistent/corpus.jsonl"], ["data.files: '/nonexistent/corpus.jsonl' does not exist"]),
    (["data=text", "data.files={bad}/*.nomatch"], ["data.files: '{bad}/*.nomatch' matches no file"]),
    (["data=text", "data.files={bad}/notes.docx"], ["has extension '.docx'", ".jsonl", ".parquet", "save_to_disk"]),
    (["data=text", "data.files={bad}/empty.jsonl"], ["data.files: '{bad}/empty.jsonl' is empty (no rows)"]),
    (["data=text", "data.files={bad}/chats.jsonl"], ["data.text_field=text is not a column", "its columns: messages"]),
    ([*CHAT, "data.files={bad}/texts.jsonl"], ["data.messages_field=messages is not a column", "its columns: body"]),
    ([*CHAT, "data.files={bad}/texts.jsonl", "data.prompt_field=question", "data.response_field=body"],
     ["data.prompt_field=question is not a column", "its columns: body"]),
    ([*CHAT, "data.files={bad}/unknown_role.jsonl"], ["{bad}/unknown_role.jsonl line 2: unknown role 'robot'", "system, user, assistant, tool"]),
    ([*CHAT, "data.files={bad}/no_assistant.jsonl"], ["{bad}/no_assistant.jsonl line 1: no assistant turn"]),
    ([*CHAT, "hf_assets_path={bad}/tokenizer_without_template"], ["no chat template", "hf_assets_path"]),
    ([*CHAT, "data.files={bad}/call_without_name.jsonl"], ["{bad}/call_without_name.jsonl line 1: ", "tool_calls[0]: a tool call needs a function name"]),
    ([*CHAT, "data.files={bad}/arguments_not_json.jsonl"], ["{bad}/arguments_not_json.jsonl line 1: ", "(get_time): arguments are not JSON"]),
    ([*CHAT, "data.files={bad}/tool_without_call.jsonl"], ["{bad}/tool_without_call.jsonl line 1: message 1 is a tool result with no assistant tool call"]),
    # rows as data sets ship them: a malformed one named by its file and 1-based line
    ([*CHAT, "data.files={bad}/malformed.jsonl"],
     ["{bad}/malformed.jsonl line 3: not JSON (Unterminated string starting at column 83): "]),
    ([*CHAT, "data.files={bad}/array.json"], ["{bad}/array.json line 4: not JSON (Expecting ',' delimiter at column 1)"]),
    # a seq_len that leaves the first rows nothing to train on, or drops more than data.max_dropped of them
    ([*CHAT, "data.files={bad}/chats.jsonl", "training.seq_len=8"],
     ["training.seq_len=8: none of the 3 rows of {bad}/chats.jsonl keeps a token to train on; the first: "
      "{bad}/chats.jsonl line 1: the prompt alone is 13 tokens (before its first assistant token), training.seq_len 8: "
      "cut there, nothing of it would be trained. Raise training.seq_len"]),
    (["data=chat", "training.seq_len=32"],
     ["22 of the first 64 rows of ", "would not be trained (34 %, more than data.max_dropped=0.1): 22 dropped (too "
      "long for training.seq_len=32), 0 skipped"]),
    (["data=chat", "data.max_dropped=5"], ["data.max_dropped=5.0: a share of the rows read, in [0, 1) (0.1: a tenth), or null"]),
    ([*CHAT, "data.files={bad}/one_long_prompt.jsonl", "training.seq_len=40"],
     ["1 of the 3 rows of {bad}/one_long_prompt.jsonl would not be trained (33 %, more than data.max_dropped=0.1): "
      "1 dropped (too long for training.seq_len=40), 0 skipped (cannot be read as rows of data.kind=chat); the first: "
      "{bad}/one_long_prompt.jsonl line 2: the prompt alone is ", "or raise data.max_dropped (null: no limit)"]),
    ([*CHAT, "data.files={bad}/sharegpt.jsonl"], ["data.messages_field=messages is not a column",
                                                   "ShareGPT rows: set data.messages_field=conversations"]),
    ([*CHAT, "data.files={bad}/sharegpt.jsonl", "data.messages_field=conversations"],
     ["{bad}/sharegpt.jsonl line 1: conversations[1]: unknown ShareGPT speaker 'bot'", "human -> user", "observation -> tool"]),
    ([*CHAT, "data.files={bad}/tool_calls.jsonl", "hf_assets_path={bad}/chatml_tokenizer"],
     ["{bad}/tool_calls.jsonl line 1: the data has tools or tool calls, but the tokenizer's chat template does not render them"]),
    (["data=chat", "data.val_files={bad}/empty.jsonl"], ["data.val_files: '{bad}/empty.jsonl' is empty (no rows)"]),
    ([*CHAT, "data.files={bad}/chats.jsonl", "data.val_fraction=0.1"],
     ["data.val_fraction=0.1: the validation set it carves out of {bad}/chats.jsonl has 0 rows, fewer than the 2 "
      "ranks that each read a share; raise data.val_fraction or set data.val_files"]),
    (["data=chat", "data.val_fraction=0.1", "data.val_files=${assets:chat_validation_file}"],
     ["data.val_fraction and data.val_files both"]),
    (["data=chat", "validator.steps=-1"], ["validator.steps=-1", "validator.steps=N"]),
    (["data=chat", "data.overlong=split"], ["data.overlong=split is for text", "truncate or drop"]),
    (["data=chat", "data.thinking=off"],
     ["Wrong value for 'data.thinking': expected one of 'empty_block', 'as_rendered', got 'off'."]),
    (["data=text", "data.overlong=cut"], ["data.overlong", "'truncate'", "'drop'", "'split'"]),
    (["data=chat", "data.packing=bestfit"],
     ["Wrong value for 'data.packing': expected one of 'best_fit', 'greedy', 'none', got 'bestfit'. Did you mean "
      "'best_fit'?"]),
    (["data=chat", "data.pack_buffer=0"], ["data.pack_buffer=0", "at least 1"]),
    (["data=text", "data.packing=greedy"], ["data.packing=greedy", "overlong=split", "data.overlong=truncate or drop"]),
    (["data=text", "data.files=null", "data.hf_dataset=nobody/no-such-set"],
     ["data.hf_dataset=nobody/no-such-set", "cannot be read from the local HF cache", "hf download nobody/no-such-set --repo-type dataset"]),
    (["data=text", "data.hf_dataset=nobody/no-such-set"], ["set exactly one of files or hf_dataset (got both"]),
    (["data=mix", "data.sources=[{files:'{bad}/texts.jsonl',weight:0}]"], ["data.sources[0].weight=0.0", "must be > 0"]),
    (["data=mix", "data.sources=[{files:'{bad}/texts.jsonl',wieght:2}]"], ["data.sources[0].wieght", "'weight'"]),
    (["data.files=/tmp/corpus.jsonl"], ["data.files applies to data=text|chat|mix|preference|prompts", "data=tiny"]),
    (["data=c4"], ["dataloader.dataset=c4: allenai/c4 is not in the local HF cache", "hf download allenai/c4"]),
    (["model=hf", "model.hf_model=nobody/no-such-model"],
     ["model.hf_model=nobody/no-such-model: not a local dir and not in the Hugging Face cache",
      "hf download nobody/no-such-model`)"]),
    (["model=hf", "model.hf_model=Qwen3-0.6B"], ["hf download Qwen/Qwen3-0.6B --local-dir Qwen3-0.6B`)"]),
    (["data=text", "run.objective=val_los"], ["run.objective", "'val_loss'"]),
    ([*DPO, "data.files={bad}/no_rejected.jsonl"], ["{bad}/no_rejected.jsonl line 2: data.rejected_field=rejected: the row has no rejected response"]),
    ([*DPO, "data.files={bad}/same_responses.jsonl"], ["{bad}/same_responses.jsonl line 1: the chosen and the rejected response are the same"]),
    ([*DPO, "data.files={bad}/long_prompt.jsonl", "training.seq_len=64"],
     ["{bad}/long_prompt.jsonl line 1: its prompt is", "training.seq_len=64", "raise training.seq_len above"]),
    ([*DPO, "data.files={bad}/pairs.jsonl", "data.chosen_field=better"], ["data.chosen_field=better is not a column", "its columns: chosen, prompt, rejected"]),
    (["model=hf", "finetune=lora", "data=preference"], ["data=preference tunes a model against itself", "checkpointing=from_hf"]),
    ([*DPO, "parallelism=tp"], ["data=preference with tensor parallelism (degree 2) is not supported", "parallelism=fsdp"]),
    ([*DPO, "preference.beta=0"], ["preference.beta must be > 0"]),
    ([*DPO, "preference.loss=hinge"], ["preference.loss", "'sigmoid'", "'ipo'", "'robust'"]),
    ([*DPO, "preference.label_smoothing=0.1"], ["preference.label_smoothing applies to preference.loss=robust"]),
    ([*DPO, "preference.sft_weight=-1"], ["preference.sft_weight must be >= 0"]),
    ([*DPO, "preference.loss=robust", "preference.label_smoothing=0.5"], ["preference.label_smoothing=0.5", "0 <= p < 0.5"]),
    (["data=chat", "preference.beta=0.2"], ["preference.beta is a setting of trainer=dpo, and this run trains with "
                                            "trainer=sft: choose trainer=dpo or leave preference.* out."]),
    ([*DPO, "trainer=orpo"],
     ["preference.sft_weight is a setting of trainer=dpo, and this run trains with trainer=orpo"]),
    (["data=chat", "trainer=kto"], ["trainer=kto trains on data=preference rows, not on data=chat's (which train with "
                                    "trainer=sft): use data=preference for trainer=kto, or leave trainer out."]),
    ([*PREFERENCE, "trainer=orpo", "orpo.beta=0"], ["orpo.beta must be > 0 (TRL's default 0.1), got 0.0."]),
    ([*PREFERENCE, "trainer=simpo", "simpo.cpo_alpha=-1"], ["simpo.cpo_alpha must be >= 0"]),
    ([*PREFERENCE, "trainer=kto", "data.files={bad}/unlabelled.jsonl"],
     ["data.label_field=label is not a column of {bad}/unlabelled.jsonl, nor are data.chosen_field=chosen and "
      "data.rejected_field=rejected: trainer=kto reads unpaired rows (prompt, completion, label) or pairs; its "
      "columns: completion, prompt"]),
    ([*PREFERENCE, "trainer=kto", "kto.gamma=1"],
     ["Unknown config key 'kto.gamma'. Valid keys here: beta, desirable_weight, undesirable_weight."]),
    (["data=mix", "data.sources=[{files:'{bad}/pairs.jsonl',format:preference}]"], ["format=preference", "use data=preference"]),
    ([*GRPO, "grpo.num_generations=1"], ["grpo.num_generations=1: a group needs at least 2 completions"]),
    ([*GRPO, "training.local_batch_size=6"], ["a rank's batch of 6 completions", "whole groups of grpo.num_generations=4"]),
    ([*GRPO, "grpo.max_completion_length=60"],
     ["line 1: the prompt is ", "grpo.max_completion_length=60 more must fit in training.seq_len=64", "raise training.seq_len"]),
    (["model=hf", "data=prompts", "grpo.rewards=[qwen3_neuron.rewards.length_penalty]"],
     ["data=prompts samples completions from the model", "nothing loads weights", "checkpointing=from_hf"]),
    ([*GRPO, "parallelism=tp"], ["data=prompts with tensor parallelism (degree 2) is not built", "parallelism=fsdp"]),
    ([*GRPO, "grpo.rewards=[examples.my_rewards.nothing]"],
     ["grpo.rewards[0]: 'examples.my_rewards.nothing': module 'examples.my_rewards' has no 'nothing'."]),
    ([*GRPO, "grpo.rewards=[no_such_module.reward]"], ["grpo.rewards[0]: 'no_such_module.reward': module 'no_such_module' cannot be imported"]),
    ([*GRPO, "grpo.reward_weights=[1.0,2.0]"], ["grpo.reward_weights has 2 weights for 1 rewards"]),
    ([*GRPO, "grpo.rewards=[qwen3_neuron.rewards.exact_answer]"],
     ["grpo.rewards[0]: qwen3_neuron.rewards.exact_answer reads the column 'answer' of each row, which the "
      "first rows of ", "lack (their columns besides the prompt: chosen, rejected)"]),
    ([*GRPO, "grpo.loss_type=ppo"], ["grpo.loss_type", "'dapo'", "'dr_grpo'"]),
    ([*GRPO, "training.seq_len=63"], ["training.seq_len=63 is not divisible by 2: model=hf (torchtitan's Transformers "
                                      "backend) takes a multiple of", "e.g. 64."]),
    ([*GRPO, "data.files={bad}/dict_prompts.jsonl"],
     ["line 1: data.prompt_field=prompt: the prompt is one message, not a list of them; a prompt is a list of "
      'messages ([{"role": "user", "content": "..."}]) or a string']),
    (["data=chat", "grpo.beta=0.1"], ["grpo.beta is a setting of trainer=grpo, and this run trains with trainer=sft"]),
]  # fmt: skip


def test_an_override_meant_for_other_models_passes_the_plan_with_kernels_allow_unused(tmp_path, assets):
    overrides = ["kernels.overrides=[qwen3_neuron.kernels.moe.blockwise.blockwise_experts]", "kernels.allow_unused=true"]
    plan = plan_of(compose_job(*overrides), tmp_path / "run")  # no "matches no node" refusal
    assert [e if isinstance(e, str) else e[0] for e in plan.trainer_config.override.imports].count(BLOCKWISE) == 1
    assert not [line for line in plan.replacements if BLOCKWISE in line]  # it replaced nothing, as allowed


@pytest.fixture(scope="session")
def bad_data(assets):
    """The files the data rows name, in the session's cache dir."""
    BAD_DATA.mkdir(exist_ok=True)
    (BAD_DATA / "empty.jsonl").write_text("")
    prompt = {"prompt": {"role": "user", "content": "What is 2 + 2?"}}  # a message where a list of them belongs
    (BAD_DATA / "dict_prompts.jsonl").write_text("\n".join(json.dumps(prompt) for _ in range(3)) + "\n")
    (BAD_DATA / "notes.docx").write_text("not a format datasets reads")
    def turn(role, text):
        return {"role": role, "content": text}

    def call(function):
        return {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": function}]}

    rows = {
        "texts.jsonl": [{"body": "some text"}] * 3,
        "chats.jsonl": [{"messages": [turn("user", "hi"), turn("assistant", "hello")]}] * 3,
        "unknown_role.jsonl": [{"messages": [turn("user", "hi"), turn("assistant", "hello")]},
                               {"messages": [turn("robot", "beep"), turn("assistant", "hello")]}],
        "no_assistant.jsonl": [{"messages": [turn("system", "be nice"), turn("user", "hi")]}],
        "call_without_name.jsonl": [{"messages": [turn("user", "hi"), call({"arguments": {}})]}],
        "arguments_not_json.jsonl": [{"messages": [turn("user", "hi"), call({"name": "get_time", "arguments": "{tz:"})]}],
        "tool_without_call.jsonl": [{"messages": [turn("user", "hi"), turn("tool", "12:00"), turn("assistant", "noon")]}],
        "sharegpt.jsonl": [{"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "hello"}]}],
        "one_long_prompt.jsonl": [{"messages": [turn("user", "hi"), turn("assistant", "hello")]},
                                  {"messages": [turn("user", "why " * 40), turn("assistant", "because")]},
                                  {"messages": [turn("user", "hi"), turn("assistant", "hello")]}],
        "tool_calls.jsonl": [{"messages": [turn("user", "hi"), call({"name": "get_time", "arguments": {}}),
                                           turn("tool", "12:00"), turn("assistant", "noon")]}],
    }  # fmt: skip
    pair = {"prompt": [turn("user", "hi")], "chosen": [turn("assistant", "hello")], "rejected": [turn("assistant", "go away")]}
    rows.update({
        "pairs.jsonl": [pair] * 3,
        "no_rejected.jsonl": [pair, {**pair, "rejected": None}],
        "same_responses.jsonl": [{**pair, "rejected": pair["chosen"]}],
        "long_prompt.jsonl": [{**pair, "prompt": [turn("user", "why " * 40)]}],
        "unlabelled.jsonl": [{"prompt": "hi", "completion": "hello"}] * 3,
    })  # fmt: skip
    for name, lines in rows.items():
        (BAD_DATA / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat = json.dumps({"messages": [turn("user", "hi"), turn("assistant", "hello")]})
    (BAD_DATA / "malformed.jsonl").write_text(f"{chat}\n\n{chat[:-4]}\n{chat}\n")  # line 3 ends mid-string
    (BAD_DATA / "array.json").write_text(f"[\n{chat},\n{chat}\n{chat}\n]\n")  # line 4: a comma missing
    tokenizer = BAD_DATA / "tokenizer_without_template"
    shutil.copytree(assets.tokenizer_dir, tokenizer, dirs_exist_ok=True)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    (tokenizer / "chat_template.jinja").unlink(missing_ok=True)
    chatml = BAD_DATA / "chatml_tokenizer"  # ChatML turns only: no tools, no tool calls
    shutil.copytree(tokenizer, chatml, dirs_exist_ok=True)
    config["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
    (chatml / "tokenizer_config.json").write_text(json.dumps(config))
    return BAD_DATA


@pytest.mark.parametrize("overrides, expected", PLAN_TIME, ids=[" ".join(o) for o, _ in PLAN_TIME])
def test_bad_input_fails_at_plan_time_naming_the_key(tmp_path, assets, bad_data, overrides, expected):
    run_dir = tmp_path / "run"
    overrides = [o.replace("{bad}", str(bad_data)) for o in overrides]
    with pytest.raises(ConfigError) as error:
        plan_of(compose_job(*overrides), run_dir)
    expected = [text.replace("{bad}", str(bad_data)) for text in expected]
    for text in expected:
        assert text in str(error.value)
    assert not run_dir.exists()


# Caught by Hydra itself while composing, by the framework's own settings (`check_settings`: the
# kernels, top_k, LoRA and data file rows) or by torchtitan's keys as the launcher knows them
# (`trainer_keys`: the training.stpes row), before torchrun starts (a model=hf dir that is not there
# too); or, the training.steps=0 row, by the plan in torchrun's local rank 0, which stops every worker and removes
# what torchrun wrote. Either way, checked through launch.py, whose process never imports torchtitan.
LAUNCH_TIME = [
    (["model=nativ"], ["model=nativ: no such option", "native"]),
    (["experiment=cpu_qwen3_tiny"], ["experiment=cpu_qwen3_tiny: no such option", "cpu_qwen3_tiny_native"]),
    (["device=tpu"], ["device=tpu: no such option", "cpu"]),
    (["trainer=dpp"], ["trainer=dpp: no such option. Did you mean 'dpo'?"]),
    (["data=text", "data.files=/nonexistent/corpus.jsonl"], ["data.files: '/nonexistent/corpus.jsonl' does not exist"]),
    (["data=chat", "data.files=/nonexistent/*.jsonl"], ["data.files: '/nonexistent/*.jsonl' matches no file"]),
    (["kernels=blockwise"], ["kernels=blockwise replaces the experts", "use model=moe"]),
    (["trainig.steps=3"], ["trainig"]),
    (["run.verbose=maybe"], ["run.verbose", "expected bool"]),
    (["model=hf", "model.hf_model=/nonexistent/Qwen3"], ["model.hf_model=/nonexistent/Qwen3: no such directory"]),
    (["model=moe", "kernels=nki"], ["kernels=nki needs device neuron"]),
    (["model.top_k=2"], ["model.top_k applies to model=moe only"]),
    (["finetune=lora", "finetune.rank=0"], ["finetune.rank must be a positive integer, got 0"]),
    (["training.stpes=3"], ["training.stpes", "'steps'"]),
    (["training.steps=0"], ["training.steps must be a positive integer, got 0"]),
    # eval=lm_eval: checked by the launcher before torchrun starts, the task names in lm-eval's registry
    (["eval=lm_eval", "eval.tasks=[tiny_chat_anser]", "checkpointing=export_hf"],
     ["eval.tasks: unknown lm-eval task 'tiny_chat_anser'. Did you mean 'tiny_chat_answer'?"]),
    (["eval=lm_eval", "eval.tasks=[tiny_chat_answer]"], ["this run writes none: add checkpointing=export_hf"]),
    (["run.objective=eval.tiny_chat_answer.exact_match"], ["needs an evaluation: add eval=lm_eval"]),
]


@pytest.mark.parametrize("overrides, expected", LAUNCH_TIME, ids=[" ".join(o) for o, _ in LAUNCH_TIME])
def test_bad_input_on_the_command_line_exits_non_zero_and_writes_nothing(
    tmp_path, assets, monkeypatch, overrides, expected
):
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # stderr lists every module imported
    run_dir = tmp_path / "run"
    result = launch(run_dir, *overrides, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]  # a config mistake, Hydra's own included
    for text in expected:
        assert text in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not run_dir.exists()
    assert processes_mentioning(str(run_dir)) == []
    assert " torchtitan.trainer\n" not in result.stderr


def test_a_launch_refused_by_the_plan_leaves_no_run_dir_when_its_workers_are_stopped_mid_exit(tmp_path, assets):
    """The plan in local rank 0 refuses the data (a malformed row 40, data.max_dropped=0); the
    launcher then stops the workers, here (tests/held_refusal) while rank 0 is still ending after
    handing the refusal over, as a busy machine leaves it 1 launch in 4: that stop is no crash to
    record (it once left failure.json: `SignalException: ... got signal: 15`, user_error false)."""
    good = json.dumps({"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]})
    rows = tmp_path / "chats.jsonl"
    rows.write_text("\n".join([good] * 39 + [good[:30]] + [good] * 60) + "\n")
    paths = [str(REPO / "tests" / "held_refusal"), os.environ.get("PYTHONPATH")]
    held = {"PYTHONPATH": os.pathsep.join(filter(None, paths))}
    run_dir = tmp_path / "run"
    result = launch(run_dir, "data=chat", f"data.files={rows}", "data.val_files=null", "data.max_dropped=0", env=held)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"Config error: 1 of the first 64 rows of {rows} would not be trained")
    assert not run_dir.exists()
    assert processes_mentioning(str(run_dir)) == []


# Every mistake answered in one sentence, from the launcher, the workers and the commands alike:
# (command, exit code, the console's exact first line on stderr). "{x}" fills in below.
TOPLEVEL = ("activation_checkpoint, checkpoint, checkpointing, comm, compile, data, dataloader, debug, device, eval, "
            "experiment, finetune, grpo, hf, hf_assets_path, hydra, kernels, kto, loss, lr_scheduler, metrics, model, "
            "optimizer, orpo, override, parallelism, preference, profiler, reward_model, run, simpo, tokenizer, tracking, "
            "trainer, training, validator")  # fmt: skip
# CUDA asked for without a GPU: the sentence depends on the torch build (PyPI's Linux wheels from
# 2.14 on are CUDA builds, which run on CPU; the CPU wheel cannot use a GPU at all)
NO_CUDA = (
    f"this torch ({torch.__version__}) is a CPU-only build. Install a CUDA build, e.g. `pip install torch "
    "--index-url https://download.pytorch.org/whl/cu128`, on a machine with an NVIDIA GPU."
    if torch.version.cuda is None else
    f"torch is built for CUDA {torch.version.cuda} but sees no GPU (check `nvidia-smi` and CUDA_VISIBLE_DEVICES)."
)  # fmt: skip
ANSWERS = [
    (["launch.py", "optimizer.lr=fast"], 2, "Config error: Wrong type for 'optimizer.lr': expected float, got str 'fast'."),
    (["launch.py", "optimizer.weight_decay=abc", "run.dry_run=true"], 2,
     "Config error: Wrong type for 'optimizer.weight_decay': expected float, got str 'abc'."),
    (["launch.py", "training.steps=ten"], 2, "Config error: Wrong type for 'training.steps': expected int, got str 'ten'."),
    (["launch.py", "trainig.steps=3"], 2,
     f"Config error: Unknown config key 'trainig'. Did you mean 'training' or 'tracking' or 'trainer'? "
     f"Valid keys here: {TOPLEVEL}."),
    (["launch.py", "checkpointing=[from_hf,exporthf]"], 2, "Config error: checkpointing=exporthf: no such option. Did "
                                                          "you mean 'export_hf'? The options of checkpointing: export_hf, from_hf, none, periodic."),
    (["launch.py", "data=chats"], 2, "Config error: data=chats: no such option. Did you mean 'chat'? "
                                     "The options of data: c4, chat, mix, preference, prompts, text, tiny."),
    (["launch.py", "device=cuda"], 2, "Config error: device.type=cuda: device=cuda is not available: {no_cuda}"),
    (["-m", "qwen3_neuron.chat", "{tiny_dir}", "--device", "cuda"], 2, "error: --device cuda is not available: {no_cuda}"),
    # a seq_len that leaves nothing to train: found in the plan's first rows, before torchrun starts
    (["launch.py", "data=chat", "data.overlong=drop", "training.seq_len=32", "run.nproc_per_node=1"], 2,
     "Config error: training.seq_len=32: none of the first 64 rows of {chat_file} keeps a token to train on; the "
     "first: {chat_file} line 1: 145 tokens, training.seq_len 32 (data.overlong=drop). Raise training.seq_len or set "
     "data.overlong=truncate"),
]  # fmt: skip


@pytest.mark.parametrize("command, exit_code, first_line", ANSWERS, ids=[" ".join(c) for c, _, _ in ANSWERS])
def test_each_mistake_is_answered_in_one_sentence_without_a_traceback(tmp_path, assets, command, exit_code, first_line):
    if "cuda" in " ".join(command) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    fill = {"no_cuda": NO_CUDA, "tiny_dir": assets.tiny_qwen3_dir, "chat_file": assets.chat_train_file}
    command = [part.format(**fill) for part in command]
    if command[0] == "launch.py":
        result = launch(tmp_path / "run", *command[1:], timeout=600)
    else:
        result = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert result.stderr.splitlines()[0] == first_line.format(**fill)
    assert "Traceback" not in result.stdout + result.stderr
