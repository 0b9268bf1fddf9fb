"""finetune=lora: the base stays bit-identical, only adapters train, and what is exported is the
trained model - for PEFT (base + hf_adapter), for Transformers (the merged hf_export) and for
`python -m qwen3_neuron.hf_io.verify`. One 2-rank run per backend is asserted on: conftest's
`lora_run` (model=native: fused q/k/v) and `hf_lora_run` (model=hf: Transformers' own layers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import LORA_DROPOUT, compose_config, compose_job, launch, plan_of, process_counts, read_jsonl
from test_resume import as_of_checkpoint
from transformers import AutoTokenizer

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.finetune.lora import LoRADropoutConverter
from qwen3_neuron.finetune.peft_format import to_peft
from qwen3_neuron.finetune.step_seed import seed_each_step
from qwen3_neuron.hf_io import verify
from qwen3_neuron.hf_io.adapter_export import write_adapter
from qwen3_neuron.hf_io.verify import fixed_batch
from qwen3_neuron.job.checks.memory import meta_model
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.settings import parse_settings
from qwen3_neuron.job.trainer_config import build_trainer_config
from qwen3_neuron.models.tiny import TINY_DENSE, TINY_MOE
from qwen3_neuron.run_dir import read_job

RANK, ALPHA = 8, 16.0
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
# backend -> (its run, whether q/k/v is one fused projection with one A)
BACKENDS = {"native": ("lora_run", True), "hf": ("hf_lora_run", False)}
backends = pytest.mark.parametrize("backend", BACKENDS)


def test_a_model_hf_launch_reads_the_model_dirs_config_once_per_process(hf_lora_run):
    """The launcher settles the job (model=hf's dir found, its config.json read: the only
    `check_settings`); every rank parses the job.yaml it wrote once, reading config.json once,
    and builds its Trainer.Config once; rank 0 reads it once more at the end, to copy it into the
    export. (torchtitan's Transformers backend reads it too, through Transformers' AutoConfig.)
    torchtitan is imported once, before the ranks are forked."""
    assert process_counts(hf_lora_run) == {
        "launcher parse": 1, "launcher check": 1, "launcher config.json": 1,
        "rank0 parse": 1, "rank0 build": 1, "rank0 config.json": 2,
        "rank1 parse": 1, "rank1 build": 1, "rank1 config.json": 1, "torchrun torch import": 1, "torchrun torchtitan import": 1,
    }  # fmt: skip


def _run(request, backend: str) -> Path:
    return request.getfixturevalue(BACKENDS[backend][0])


def _adapter_parameters(hf: dict, mlp: bool = True, fused_qkv: bool = True) -> int:
    """r x (in + out) for every adapted projection of the tiny model, from its HF numbers."""
    d, hd, ff = hf["hidden_size"], hf["head_dim"], hf["intermediate_size"]
    q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    # fused wqkv: one A (r x d), B ((q + 2 kv) x r); else one A per projection. And wo / o_proj.
    per_layer = (d + q + 2 * kv if fused_qkv else (d + q) + 2 * (d + kv)) + (q + d)
    if mlp:
        per_layer += 3 * (d + ff)  # w1, w3 (d -> ff), w2 (ff -> d)
    return RANK * per_layer * hf["num_hidden_layers"]


def _adapted_modules(fused_qkv: bool) -> int:
    """Modules with an (A, B) pair in the tiny dense model: wqkv, wo, w1, w2, w3 or HF's seven."""
    return (5 if fused_qkv else 7) * TINY_DENSE["num_hidden_layers"]


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path)


def _checkpoint(step_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint (torchtitan's keys)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(step_dir, tmp_path / f"{step_dir.name}.pt")
    saved = torch.load(tmp_path / f"{step_dir.name}.pt", weights_only=False)
    return {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}


def _initial_base(config, assets) -> dict[str, torch.Tensor]:
    """The tiny HF dir's weights in torchtitan's keys, as the run's from_hf load converts them."""
    spec = config.model_spec
    return spec.state_dict_adapter(spec.model, None).from_hf(_safetensors(assets.tiny_qwen3_dir / "model.safetensors"))


def _titan_model(run_dir: Path, state: dict[str, torch.Tensor]):
    """The model the run trained (LoRA included; model=hf: Transformers' Qwen3 with torchtitan's
    LoRALinear layers), built as the plan builds it, on the CPU, holding `state` (None: on the meta
    device, as built)."""
    config = build_trainer_config(Job.recorded(read_job(run_dir)), run_dir)
    model = meta_model(config)
    if state is None:  # the architecture alone
        return model, config
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)  # the RoPE tables: buffers no checkpoint holds
    model.load_state_dict(state, strict=True)
    return model.eval(), config


def _titan_logits(model, ids):
    positions = torch.arange(ids.shape[1]).expand(ids.shape)
    with torch.no_grad():
        return model(ids, positions=positions, attention_masks=model.get_attention_masks(positions))


def _hf(path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()


# ---- integration: one LoRA run per backend ------------------------------------------------------


@pytest.mark.integration
@backends
def test_only_the_adapters_train_and_the_summary_counts_them(backend, request, assets):
    run_dir, fused = _run(request, backend), BACKENDS[backend][1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 10
    base = sum(t.numel() for t in _safetensors(assets.tiny_qwen3_dir / "model.safetensors").values())
    expected = {"native": 139_264, "hf": 155_648}[backend]  # hf: one A each for q, k, v
    assert summary["trainable_parameters"] == _adapter_parameters(TINY_DENSE, fused_qkv=fused) == expected
    assert summary["total_parameters"] == base + summary["trainable_parameters"]
    # AdamW holds an (A, B) pair per adapted module and nothing of the base
    pairs = 2 * _adapted_modules(fused)
    assert f"Optimizer AdamW (model_part=0): {pairs} params" in (run_dir / "train.log").read_text()
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]
    assert losses[-1] < losses[0]
    # finetune.dropout reached the workers' model: every adapted layer drops its adapter input
    model, _ = _titan_model(run_dir, None)
    dropouts = [getattr(m, "_lora_dropout", None) for m in model.modules() if hasattr(m, "lora_a")]
    assert dropouts == [LORA_DROPOUT] * _adapted_modules(fused)


@pytest.mark.integration
@backends
def test_checkpoints_hold_the_adapters_only(backend, request, assets, tmp_path):
    run_dir, fused = _run(request, backend), BACKENDS[backend][1]
    base_bytes = (assets.tiny_qwen3_dir / "model.safetensors").stat().st_size
    for step in (4, 8):
        step_dir = run_dir / "checkpoint" / f"step-{step}"
        saved = _checkpoint(step_dir, tmp_path)
        assert len(saved) == 2 * _adapted_modules(fused), sorted(saved)[:5]
        assert all(".lora_a." in k or ".lora_b." in k for k in saved), sorted(saved)[:5]
        assert all(saved[k].abs().max() > 0 for k in saved if ".lora_b." in k)  # B starts at zero: trained
        # adapters + their two AdamW states (+ DCP's few KB per tensor): a fraction of the base alone
        assert sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file()) < base_bytes / 3
    if backend == "hf":  # Transformers' module names, one adapter per projection
        assert "model.model.layers.0.self_attn.k_proj.lora_a.weight" in saved


@pytest.mark.integration
@backends
def test_the_export_is_the_unchanged_base_plus_the_adapter(backend, request, assets):
    """Weights without an adapter are the base's and adapted ones base + alpha/r B A, bit for bit:
    not one bit of the frozen base moved."""
    run_dir = _run(request, backend)
    base_hf = _safetensors(assets.tiny_qwen3_dir / "model.safetensors")
    merged = _safetensors(run_dir / "hf_export" / "model.safetensors")
    adapter = _safetensors(run_dir / "hf_adapter" / "adapter_model.safetensors")
    assert set(merged) == set(base_hf)
    adapted = 0
    for key, weight in merged.items():
        module = "base_model.model." + key.removesuffix(".weight")
        if f"{module}.lora_A.weight" not in adapter:
            assert torch.equal(weight, base_hf[key]), key
            continue
        delta = ALPHA / RANK * (adapter[f"{module}.lora_B.weight"] @ adapter[f"{module}.lora_A.weight"])
        assert delta.abs().max() > 0, key
        assert torch.equal(weight, base_hf[key] + delta), key
        adapted += 1
    assert adapted == 7 * TINY_DENSE["num_hidden_layers"]


@pytest.mark.numerics
@pytest.mark.integration
@backends
def test_peft_on_the_base_gives_the_trained_models_logits(backend, request, assets, tmp_path):
    """The trained model (the base + the step-8 adapters, in the model the run built) against PEFT
    with those adapters, converted and written by the export's own code, on the tiny HF dir."""
    from peft import PeftModel

    run_dir = _run(request, backend)
    adapters = _checkpoint(run_dir / "checkpoint" / "step-8", tmp_path)
    config = build_trainer_config(Job.recorded(read_job(run_dir)), run_dir)
    base = _initial_base(config, assets)
    model, config = _titan_model(run_dir, {**base, **adapters})
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    finetune = parse_settings(read_job(run_dir)).finetune
    write_adapter(to_peft(adapters, config.model_spec, None), finetune, str(assets.tiny_qwen3_dir), adapter_dir)
    peft_model = PeftModel.from_pretrained(_hf(assets.tiny_qwen3_dir), adapter_dir).eval()
    ids = fixed_batch(TINY_DENSE["vocab_size"])
    with torch.no_grad():
        peft_logits = peft_model(ids).logits
    titan_logits = _titan_logits(model, ids)
    without_adapters = {**base, **{k: (torch.zeros_like(v) if ".lora_b." in k else v) for k, v in adapters.items()}}
    assert (titan_logits - _titan_logits(_titan_model(run_dir, without_adapters)[0], ids)).abs().max() > 1e-2
    # float32 both, two libraries' order of sums (the adapter's beside the weight's): the longest, the
    # MLP's 768 terms, rounds by at most 768 x 2^-24 of the magnitudes summed
    torch.testing.assert_close(peft_logits, titan_logits, rtol=0, atol=768 * 2**-24 * titan_logits.abs().max())


@pytest.mark.numerics
@pytest.mark.integration
@backends
def test_the_exported_adapter_loads_with_peft_and_equals_the_merged_export(backend, request, assets, capsys):
    from peft import PeftModel

    run_dir = _run(request, backend)
    adapter_dir = run_dir / "hf_adapter"
    assert sorted(p.name for p in adapter_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    hyper = (config["peft_type"], config["r"], config["lora_alpha"], config["lora_dropout"])
    assert hyper == ("LORA", RANK, ALPHA, LORA_DROPOUT)
    assert set(config["target_modules"]) == PROJECTIONS and config["task_type"] == "CAUSAL_LM"
    assert config["base_model_name_or_path"] == str(assets.tiny_qwen3_dir)
    adapter = _safetensors(adapter_dir / "adapter_model.safetensors")
    assert len(adapter) == 2 * 7 * TINY_DENSE["num_hidden_layers"]
    d, hd = TINY_DENSE["hidden_size"], TINY_DENSE["head_dim"]
    assert adapter["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (RANK, d)
    assert adapter["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (2 * hd, RANK)
    assert adapter["base_model.model.model.layers.3.mlp.down_proj.lora_A.weight"].shape == (RANK, 768)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["adapter_dir"], summary["export_dir"]) == (str(adapter_dir), str(run_dir / "hf_export"))
    last = run_dir / "checkpoint" / "step-10"  # the full last step (DCP), its HF save consumed by the export
    assert (last / ".metadata").exists() and not list(last.glob("*.safetensors"))
    assert not list((run_dir / "checkpoint").glob("full-*"))
    ids = fixed_batch(TINY_DENSE["vocab_size"])
    with torch.no_grad():
        peft_logits = PeftModel.from_pretrained(_hf(assets.tiny_qwen3_dir), adapter_dir).eval()(ids).logits
        merged_logits = _hf(run_dir / "hf_export")(ids).logits
        base_logits = _hf(assets.tiny_qwen3_dir)(ids).logits
    # float32: the merged weight W + s B A rounds once more than the adapter's separate sum; the longest
    # sum, the MLP's 768 terms, rounds by at most 768 x 2^-24 of the magnitudes summed
    torch.testing.assert_close(merged_logits, peft_logits, rtol=0, atol=768 * 2**-24 * peft_logits.abs().max())
    assert (peft_logits - base_logits).abs().max() > 1e-2  # the adapter does something

    assert verify.main([str(adapter_dir)]) == 0  # `python -m qwen3_neuron.hf_io.verify <dir>`, in this process
    out = capsys.readouterr().out
    assert "missing keys (0)" in out and "unexpected keys (0)" in out
    assert f"vs merged {run_dir / 'hf_export'}" in out and out.strip().endswith("OK")
    # a chat LoRA (data=chat): the merged model ends its turn in generate(), as a chat model must
    generation = json.loads((run_dir / "hf_export" / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf_export")
    assert generation["eos_token_id"] == [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    assert verify.main([str(run_dir / "hf_export"), "--chat"]) == 0


@pytest.mark.integration
def test_verify_takes_the_adapters_base_and_merged_model_from_the_command_line(lora_run, assets, tmp_path, capsys):
    """An adapter moved away from its run dir, whose recorded base is gone: `--base` names the
    base and `--merged` the merged export. The merged export passes; the untrained base in its
    place fails on the logits."""
    import shutil

    adapter_dir = tmp_path / "adapter"
    shutil.copytree(lora_run / "hf_adapter", adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    (adapter_dir / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/gone"}))
    base, merged = str(assets.tiny_qwen3_dir), str(lora_run / "hf_export")

    assert verify.main([str(adapter_dir)]) == 2  # the recorded base is not there
    assert "/gone" in capsys.readouterr().err
    assert verify.main([str(adapter_dir), "--base", base, "--merged", merged]) == 0
    out = capsys.readouterr().out
    assert f"adapter dir: {adapter_dir} (base: {base})" in out and f"vs merged {merged}" in out
    assert out.strip().endswith("OK")
    assert verify.main([str(adapter_dir), "--base", base, "--merged", base]) == 1
    assert capsys.readouterr().out.strip().endswith("FAILED")


@pytest.mark.integration
@backends
def test_a_resume_from_step_4_reloads_the_base_and_ends_on_the_uninterrupted_runs_exports(backend, request, assets,
                                                                                          tmp_path):  # fmt: skip
    """The run's dir as it stood after its step-4 adapter checkpoint; run.resume loads the base
    from HF again, then the adapters, optimizer and chat data position (row index, best-fit packing
    buffer, samples packed but not handed out, data counts), and ends on the uninterrupted run's losses, validation,
    PEFT adapter and merged export, bit for bit: the base did not move across the resume either.
    Dropout masks included: each step's follow from the seed and the step. (A resume after
    kill -9 itself: tests/test_resume.py.)"""
    lora_run = _run(request, backend)
    run_dir = as_of_checkpoint(lora_run, tmp_path / "run", step=4)

    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # step 1 was judged by the launch that trained it: warned about there, not again here
    assert "INITIAL WEIGHTS PROBABLY NOT LOADED" not in result.stdout + result.stderr
    log = (run_dir / "train.log").read_text()
    assert f"finetune=lora: resuming; loading the base weights from {assets.tiny_qwen3_dir} first" in log
    assert re.search(r"Loading the checkpoint from \S*step-4", log)
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}
    reference = {r["step"]: r["loss"] for r in read_jsonl(lora_run / "metrics.jsonl") if "loss" in r}
    assert sorted(resumed) == list(range(1, 11))
    assert [resumed[s] for s in range(5, 11)] == [reference[s] for s in range(5, 11)]
    summaries = [json.loads((d / "summary.json").read_text()) for d in (run_dir, lora_run)]
    assert summaries[0]["val_loss"] == summaries[1]["val_loss"] and summaries[0]["val_step"] == 10
    verdicts = [(s["first_loss"], s["first_loss_check"], s["status"]) for s in summaries]
    assert verdicts[0] == verdicts[1] == (reference[1], "weights_probably_not_loaded", "completed")
    # best-fit packing (data=chat's default): the same samples from the checkpointed buffer on
    assert json.loads((run_dir / "trainer_config.json").read_text())["dataloader"]["sources"][0]["packing"] == "best_fit"
    assert summaries[0]["data_stats"] == summaries[1]["data_stats"]
    for written in ("hf_adapter/adapter_model.safetensors", "hf_export/model.safetensors"):
        after_resume, uninterrupted = _safetensors(run_dir / written), _safetensors(lora_run / written)
        assert after_resume.keys() == uninterrupted.keys()
        assert all(torch.equal(after_resume[k], uninterrupted[k]) for k in uninterrupted), written


# ---- plans (no processes) -----------------------------------------------------------------------


def _dropout_layer(dropout: float):
    """torchtitan's Linear (8 -> 6) with the project's LoRA layer on it, every weight nonzero."""
    from torchtitan.models.common.linear import Linear

    converter = LoRADropoutConverter.Config(rank=2, alpha=4.0, dropout=dropout).build()
    layer = converter.convert(Linear.Config(in_features=8, out_features=6, bias=False)).build()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(parameter.numel())))
    return layer


@pytest.mark.numerics
def test_lora_dropout_drops_the_adapters_input_only_and_only_while_training():
    layer, x = _dropout_layer(0.5), torch.randn(4, 8)
    base = x @ layer.weight.T
    torch.manual_seed(7)
    trained = layer.train()(x)
    torch.manual_seed(7)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)  # the same draw
    expected = base + 2.0 * (dropped @ layer.lora_a.weight.T @ layer.lora_b.weight.T)
    torch.testing.assert_close(trained, expected, rtol=0, atol=1e-6)  # float32, the same 8-term sums: equal
    evaluated = layer.eval()(x)
    torch.testing.assert_close(evaluated, base + 2.0 * (x @ layer.lora_a.weight.T @ layer.lora_b.weight.T))
    assert (trained - evaluated).abs().max() > 1e-3
    # no parameter of its own: the keys of torchtitan's layer; dropout 0 builds torchtitan's layer itself
    plain = _dropout_layer(0.0)
    assert type(plain).__name__ == "LoRALinear" and type(layer).__name__ == "LoRALinearWithDropout"
    assert layer.state_dict().keys() == plain.state_dict().keys() == {"weight", "lora_a.weight", "lora_b.weight"}


class _Steps:
    """What `seed_each_step` reads of torchtitan's Trainer: the step counter and the model parts."""

    def __init__(self, model):
        self.step, self.model_parts = 0, [model]


def _dropout_outputs(steps: range, reseed: bool, start_seed: int) -> dict[int, torch.Tensor]:
    torch.manual_seed(start_seed)  # what set_determinism seeds, or a resumed run's RNG at start-up
    layer, x = _dropout_layer(0.5), torch.ones(4, 8)
    trainer = _Steps(layer.train())
    if reseed:
        seed_each_step(trainer)
    outputs = {}
    for step in steps:
        trainer.step = step
        outputs[step] = torch.stack([layer(x), layer(x)])  # two micro-batches of one step
        layer.eval()(x)  # a validation forward in between draws nothing and reseeds nothing
        layer.train()
    return outputs


def test_dropout_masks_follow_the_step_so_a_resumed_run_draws_the_uninterrupted_runs():
    """torchtitan checkpoints no RNG state: the masks of steps 3-4 after a restart at step 3 equal
    the uninterrupted run's only because each step reseeds from the run seed and the step."""
    uninterrupted = _dropout_outputs(range(1, 5), reseed=True, start_seed=42)
    resumed = _dropout_outputs(range(3, 5), reseed=True, start_seed=42)
    for step in (3, 4):
        assert torch.equal(resumed[step], uninterrupted[step])
        assert not torch.equal(uninterrupted[step][0], uninterrupted[step][1])  # micro-batches: own masks
    assert not torch.equal(uninterrupted[3], uninterrupted[4])
    assert not torch.equal(_dropout_outputs(range(3, 5), reseed=True, start_seed=43)[3], uninterrupted[3])
    without = (_dropout_outputs(range(1, 5), reseed=False, start_seed=42), _dropout_outputs(range(3, 5), False, 42))
    assert not torch.equal(without[0][3], without[1][3])  # what the reseeding prevents



@pytest.mark.parametrize("backend", ["moe", "hf"])
def test_moe_plan_puts_adapters_on_attention_and_says_experts_are_not_covered(backend, assets, tmp_path, capsys):
    base = {"moe": f"checkpoint.initial_load_path={assets.tiny_qwen3_moe_dir}",
            "hf": f"model.hf_model={assets.tiny_qwen3_moe_dir}"}[backend]  # fmt: skip
    plan = plan_of(compose_job(f"model={backend}", "finetune=lora", "checkpointing=from_hf", base), tmp_path / "run")
    note = next(n for n in plan.notes if n.startswith("finetune=lora"))
    assert "routed experts (mlp.experts.*) get no LoRA adapters" in note
    assert "gate_proj, up_proj, down_proj match no Linear layer" in note
    assert note in capsys.readouterr().err  # said at plan time, not only in a dry run
    fused = backend == "moe"
    assert plan.parameters["trainable_parameters"] == _adapter_parameters(TINY_MOE, mlp=False, fused_qkv=fused)


def test_hf_plan_takes_any_subset_of_q_k_v_and_the_model_starts_as_the_base(assets, tmp_path):
    """model=hf has one Linear per projection: q and v alone get adapters (native's fused wqkv
    refuses that), as PEFT would put them; B starts at zero, A at torchtitan's Kaiming-uniform."""
    overrides = ["finetune=lora", "checkpointing=from_hf", "finetune.target_modules=[q_proj,v_proj]"]
    plan = plan_of(compose_job("model=hf", f"model.hf_model={assets.tiny_qwen3_dir}", *overrides), tmp_path / "hf")
    d, q, kv = TINY_DENSE["hidden_size"], 4 * TINY_DENSE["head_dim"], 2 * TINY_DENSE["head_dim"]
    assert plan.parameters["trainable_parameters"] == RANK * ((d + q) + (d + kv)) * TINY_DENSE["num_hidden_layers"]
    assert not [n for n in plan.notes if n.startswith("finetune=lora")]
    model = meta_model(plan.trainer_config)
    adapted = sorted(name for name, module in model.named_modules() if hasattr(module, "lora_a"))
    assert adapted[:2] == ["model.model.layers.0.self_attn.q_proj", "model.model.layers.0.self_attn.v_proj"]
    assert all(not p.requires_grad for name, p in model.named_parameters() if ".lora_" not in name)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(float("nan") if ".lora_" in name else 0.0)
        model.init_weights(buffer_device=None)  # as the trainer: Transformers' init, then the adapters'
    q_proj = dict(model.named_modules())["model.model.layers.0.self_attn.q_proj"]
    assert torch.equal(q_proj.lora_b.weight, torch.zeros_like(q_proj.lora_b.weight))  # the base's function
    assert 0 < q_proj.lora_a.weight.abs().max() <= d**-0.5  # Kaiming-uniform(a=sqrt 5): bound 1/sqrt(in)
    with pytest.raises(ConfigError, match="computes q_proj, k_proj, v_proj with one projection"):
        plan_of(compose_job(f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}", *overrides), tmp_path / "native")


def test_full_finetune_trains_every_parameter(assets, tmp_path):
    plan = plan_of(compose_job("run.dry_run=true"), tmp_path / "run")
    counts = plan.parameters
    assert counts["trainable_parameters"] == counts["total_parameters"] > 3_000_000


def test_lora_memory_estimate_keeps_the_frozen_base_and_drops_its_gradients(assets, tmp_path):
    full = plan_of(compose_job("run.dry_run=true"), tmp_path / "full").memory
    lora = plan_of(
        compose_job("run.dry_run=true", "finetune=lora", "checkpointing=from_hf",
                       f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}"),
        tmp_path / "lora",
    ).memory  # fmt: skip
    assert lora.parameters_gib > full.parameters_gib  # base + adapters
    assert lora.gradients_gib < full.gradients_gib / 20 and lora.optimizer_gib < full.optimizer_gib / 20


# ---- the experiments ----------------------------------------------------------------------------


def test_trn2_qwen3_4b_lora_names_the_published_weights_and_plans_64_lora_ranks(assets, tmp_path):
    from qwen3_neuron.errors import ConfigError

    chats = tmp_path / "chats.jsonl"  # 6 x the bundled conversations: val_fraction=0.02 feeds each of 64 ranks
    chats.write_text(Path(assets.chat_train_file).read_text() * 6)
    files = f"data.files={chats}"
    composed = compose_config("experiment=trn2_qwen3_4b_lora", "run.dry_run=true", files)
    assert composed["finetune"] == {**composed["finetune"], "method": "lora", "rank": 16, "alpha": 32.0}
    with pytest.raises(ConfigError, match="initial_load_path=/fsx/models/Qwen3-4B-Instruct-2507"):
        plan_of(Job.parse(composed), tmp_path / "4b")  # the published weights are not on this machine
    # the same recipe on the tiny HF dir (its architecture, a RoPE table it covers)
    plan = plan_of(
        compose_job("experiment=trn2_qwen3_4b_lora", "run.dry_run=true", files, "model.flavor=tiny",
                       "training.seq_len=1024", f"checkpoint.initial_load_path={assets.tiny_qwen3_dir}"),
        tmp_path / "tiny",
    )  # fmt: skip
    assert (plan.device, plan.world_size) == ("neuron", 64)
    assert plan.parameters["trainable_parameters"] == 2 * _adapter_parameters(TINY_DENSE)  # rank 16
    config = plan.trainer_config
    checkpoint = config.checkpoint
    assert checkpoint.initial_load_in_hf and checkpoint.last_save_in_hf and checkpoint.export_dtype == "bfloat16"
    [source] = config.dataloader.sources  # the user's conversations, with the weights' own tokenizer
    assert (source.format, source.files, source.val_fraction) == ("chat", str(chats), 0.02)
    assert config.hf_assets_path == str(assets.tiny_qwen3_dir) and config.validator.enable


def test_cpu_qwen3_tiny_lora_plans_the_lora_stand_in(assets, tmp_path):
    plan = plan_of(compose_job("experiment=cpu_qwen3_tiny_lora"), tmp_path / "run")
    assert (plan.device, plan.world_size, plan.trainer_config.training.steps) == ("cpu", 2, 5)
    assert plan.parameters["trainable_parameters"] == _adapter_parameters(TINY_DENSE)
    config = plan.trainer_config
    assert config.checkpoint.initial_load_path == config.hf_assets_path == str(assets.tiny_qwen3_dir)
    assert config.dataloader.sources[0].format == "chat" and config.validator.enable


def test_a_moe_lora_export_is_refused_merged_and_planned_as_adapters_alone(assets, tmp_path):
    load = ["model=moe", "finetune=lora", "checkpointing=[from_hf,export_hf]",
            f"checkpoint.initial_load_path={assets.tiny_qwen3_moe_dir}"]  # fmt: skip
    with pytest.raises(ConfigError, match="native MoE models have no config.json mapping") as error:
        plan_of(compose_job(*load), tmp_path / "merged")
    assert "finetune.merge_export=false exports the adapters alone" in str(error.value)
    plan = plan_of(compose_job(*load, "finetune.merge_export=false"), tmp_path / "adapters")
    assert plan.trainer_config.checkpoint.last_save_in_hf


def test_hf_lora_leaves_the_adapters_out_of_the_hf_state_dict(assets, tmp_path):
    """model=hf: LoRA wraps the model (`with_lora`), so the HF load and save see the base's keys
    alone, the same as without LoRA; the adapters go their own way (adapter_save)."""
    hf = ("model=hf", f"model.hf_model={assets.tiny_qwen3_dir}", "checkpointing=from_hf")
    keys = {}
    for name, overrides in {"full": hf, "lora": (*hf, "finetune=lora")}.items():
        config = plan_of(compose_job(*overrides), tmp_path / name).trainer_config
        state_dict = meta_model(config).state_dict()
        adapter = config.model_spec.state_dict_adapter(config.model_spec.model, config.hf_assets_path)
        keys[name] = (set(state_dict), set(adapter.to_hf(state_dict)))
    assert any(".lora_a." in key for key in keys["lora"][0])
    assert keys["lora"][1] == keys["full"][1]
