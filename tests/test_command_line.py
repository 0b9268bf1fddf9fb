"""What Hydra would refuse with its own advice on the command line, said in the project's words
before Hydra composes (launch.py prints it as `Config error: ...`, exit 2)."""

from __future__ import annotations

import pytest

from qwen3_neuron.launch.hydra_setup import command_line_mistake

SECTIONS = ("activation_checkpoint, checkpoint, checkpointing, comm, compile, data, dataloader, debug, device, eval, "
            "experiment, finetune, grpo, hf, hf_assets_path, hydra, kernels, kto, loss, lr_scheduler, metrics, model, "
            "optimizer, orpo, override, parallelism, preference, profiler, reward_model, run, simpo, tokenizer, tracking, "
            "trainer, training, validator")  # fmt: skip


@pytest.mark.parametrize("args, message", [
    (["trainig.steps=3"], f"Unknown config key 'trainig'. Did you mean 'training' or 'tracking' or 'trainer'? "
                          f"Valid keys here: {SECTIONS}."),
    (["checkpointing=[from_hf,exporthf]"], "checkpointing=exporthf: no such option. Did you mean 'export_hf'? "
                                           "The options of checkpointing: export_hf, from_hf, none, periodic."),
    (["-m", "data=chat,chats"], "data=chats: no such option. Did you mean 'chat'? "
                                "The options of data: c4, chat, mix, preference, prompts, text, tiny."),
    (["dump_folder=/tmp/x"], "'dump_folder' is set by the framework; set hydra.run.dir instead."),
])  # fmt: skip
def test_a_misspelled_section_or_group_option_is_named_with_what_is_valid(args, message):
    assert command_line_mistake(args) == message


def test_valid_and_deliberately_added_keys_are_left_to_hydra():
    assert command_line_mistake([
        "-m", "training.steps=3", "checkpointing=[from_hf,export_hf]", "data=chat,text", "experiment=null",
        "+anything.new=1", "~run.verbose", "hydra.run.dir=/tmp/x", "hf_assets_path=/tmp/t", "--cfg", "job",
        "optimizer.lr=1e-3,3e-4",
    ]) is None  # fmt: skip
