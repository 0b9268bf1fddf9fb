"""GRPO's generation at the hardware's pace: the compiled path's static KV cache (fixed buffers,
a bounded set of graphs compiled once) and FSDP's parameters gathered once per generation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import compose_job, plan_of, read_jsonl, trained
from test_grpo import COMPLETION, PROMPT_LENGTHS, SEQ_LEN
import torch


def _logits(model, model_kind: str, *, static_backend: str | None = None, whole: bool = False, generations: int = 1):
    """[B, COMPLETION, vocab] next-token logits of the same prompts and forced completions: of a
    whole-buffer forward per token (`whole`) or of the static cache (compiled blocks: `static_backend`)."""
    from test_grpo import _sampler, prompts_and_completions

    from qwen3_neuron.generation.kv_cache import StaticCache

    prompt_lengths, prompts, completions, rows = prompts_and_completions()
    step = _sampler(COMPLETION, whole, model=model, hf_backend=model_kind == "hf")
    if not whole:
        step.static_cache = StaticCache(static_backend)
    for _ in range(generations):  # a later generation reuses the cache's buffers (and graphs)
        ids, tokens, logits = prompts.clone(), None, []
        with torch.no_grad(), step.next_token_logits(model, ids, prompt_lengths) as next_token_logits:
            for t in range(COMPLETION):
                logits.append(next_token_logits(t, tokens))
                tokens = completions[:, t]
                inside = prompt_lengths + t < SEQ_LEN
                ids[rows[inside], (prompt_lengths + t)[inside]] = tokens[inside]
    return torch.stack(logits, 1)


def _assert_whole_buffers(logits: torch.Tensor, whole: torch.Tensor, summed: int) -> None:
    """Float32 throughout: the two paths differ in the order of their sums only, each sum's rounding
    bounded by float32's unit roundoff 2^-24 times its `summed` terms, relative to the logits."""
    tolerance = 2**-24 * summed * float(whole.abs().max())
    for row, length in enumerate(PROMPT_LENGTHS):
        steps = min(COMPLETION, SEQ_LEN - length + 1)  # the cut row: its logits after seq_len are not used
        torch.testing.assert_close(logits[row, :steps], whole[row, :steps], atol=tolerance, rtol=0)
    assert whole.std() > 0.1  # logits that differ between tokens: the model is not degenerate


def _summed(model_kind: str) -> int:
    """The most terms one of the model's sums adds (its MLP's down projection, or the attention's
    sum over the buffer's columns)."""
    from qwen3_neuron.models.tiny import TINY_DENSE, TINY_MOE

    config = TINY_DENSE if model_kind != "moe" else TINY_MOE
    return max(config.get("intermediate_size", 0), config.get("moe_intermediate_size", 0), SEQ_LEN)


@pytest.mark.parametrize("model_kind", ["native", "moe", "hf"])
def test_the_static_cache_has_the_whole_buffers_logits_at_every_token(assets, model_kind):
    """The compiled path's cache, run eagerly: the prompts' forward on the buffer's first columns,
    then each token alone written at its row's position; at every step its next-token logits are
    a forward of the whole buffer's."""
    from test_grpo import _tiny_policy

    model = _tiny_policy(assets, model_kind)
    whole = _logits(model, model_kind, whole=True)
    _assert_whole_buffers(_logits(model, model_kind), whole, _summed(model_kind))


def test_short_prompts_prefill_the_narrowest_width_and_decode_one_column(assets):
    """A real generation's prompts (here the longest 14 tokens in a 256-column buffer) go through
    the compiled path's narrowest prefill width, 128, not the whole buffer (on Neuron each width is
    a graph of its own, the widest the dearest); then one column per token. The logits stay the
    whole buffer's."""
    from test_grpo import _sampler, _tiny_policy, prompts_and_completions

    from qwen3_neuron.generation.kv_cache import StaticCache
    from qwen3_neuron.models.tiny import TINY_DENSE

    model = _tiny_policy(assets, "native")
    prompt_lengths, prompts, completions, rows = (t[:3] for t in prompts_and_completions())  # 5, 14, 9 tokens
    widths = []
    hook = model.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    logits = {}
    try:
        for whole in (True, False):
            step = _sampler(COMPLETION, whole, model=model)
            step.static_cache = None if whole else StaticCache(None)
            ids, tokens, logits[whole] = prompts.clone(), None, []
            widths.clear()
            with torch.no_grad(), step.next_token_logits(model, ids, prompt_lengths) as next_token_logits:
                for t in range(COMPLETION):
                    logits[whole].append(next_token_logits(t, tokens))
                    tokens = completions[:, t]
                    ids[rows, prompt_lengths + t] = tokens
    finally:
        hook.remove()
    assert widths == [128] + [1] * (COMPLETION - 1)
    whole, static = torch.stack(logits[True], 1), torch.stack(logits[False], 1)
    tolerance = 2**-24 * max(TINY_DENSE["intermediate_size"], SEQ_LEN) * float(whole.abs().max())
    torch.testing.assert_close(static, whole, atol=tolerance, rtol=0)


def _frames(names: set[str]) -> list[str]:
    from torch._dynamo.utils import get_compilation_metrics

    return [m.co_name for m in get_compilation_metrics() if m.co_name in names]


# model=native: test_grpo_tools' compiled rollout takes these graphs and the tool turns' one
@pytest.mark.parametrize("model_kind", ["hf"])
def test_compiled_blocks_generate_with_two_graphs_compiled_once(assets, model_kind):
    """Each block compiled as torchtitan compiles it (fullgraph; aot_eager: Dynamo's capture and
    AOT autograd, as a Neuron compile, then the eager kernels): generation adds the prompts'
    forward at one width and the one-token decode, each compiled once, never again in a second
    generation (the same buffers, positions and masks as tensors); the logits stay the whole buffer's."""
    from test_grpo import _tiny_policy

    model = _tiny_policy(assets, model_kind)
    whole = _logits(model, model_kind, whole=True)
    for block in model.layers.values():
        block.compile(backend="aot_eager", fullgraph=True)
    graphs = {"_prefill_256", "_decode"}  # the longest prompt (252) takes the 256-wide forward
    before = _frames(graphs)
    logits = _logits(model, model_kind, static_backend="aot_eager", generations=2)
    assert sorted(_frames(graphs)[len(before):]) == ["_decode", "_prefill_256"]
    _assert_whole_buffers(logits, whole, _summed(model_kind))


def test_prompts_take_the_narrowest_prefill_width():
    from qwen3_neuron.generation.kv_cache import prefill_width, prefill_widths

    assert prefill_widths(2048) == [128, 256, 512, 1024, 2048]
    assert prefill_widths(64) == [64] and prefill_widths(300) == [128, 256, 300]
    assert [prefill_width(n, 2048) for n in (1, 128, 129, 1500)] == [128, 128, 256, 2048]


@pytest.mark.integration
def test_a_compiled_grpo_run_compiles_generation_once_and_never_recompiles(tmp_path, assets):
    """experiment=cpu_qwen3_tiny_grpo (2 gloo ranks, FSDP) with compile.enable=true: torch.compile's
    own counters, in summary.json, hold the training graph and generation's two (the 64-wide
    prompts' forward, the decode), and no recompile in any step."""
    run_dir = trained(tmp_path / "run", "experiment=cpu_qwen3_tiny_grpo", "compile.enable=true",
                      "compile.backend=aot_eager", "training.steps=3")  # fmt: skip
    compiled = json.loads((run_dir / "summary.json").read_text())["compiled"]
    assert compiled["recompiles"] == 0, compiled["recompile_reasons"]
    assert compiled["graphs"] == 3 and compiled["ranks_with_graphs"] == 2
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in records] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in records)


class _Block(torch.nn.Module):
    """A block of the test's own (torch.nn's forwards are in Dynamo's skip list, as torchtitan's are not)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.relu(self.linear(x))


def test_gathering_for_generation_keeps_a_compiled_blocks_graph(tmp_path):
    """In-process, one gloo rank: a block compiled as torchtitan compiles it (fullgraph, before
    FSDP; bfloat16 compute), its graph made by training's forward. Inside `gathered`, each forward
    runs that graph, compiled nothing new, with training's outputs; after it, training's forward
    runs the same graph again."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from qwen3_neuron.generation.kv_cache import gathered

    compiles, runs = [], []

    def backend(graph_module, example_inputs):  # Dynamo's graph, each compile and each run counted
        compiles.append(graph_module)
        return lambda *args: runs.append(1) or graph_module(*args)

    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(_Block(), torch.nn.Linear(16, 8))
        model[0].compile(backend=backend, fullgraph=True)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(model[0], reshard_after_forward=True, mp_policy=policy)
        fully_shard(model, reshard_after_forward=False, mp_policy=policy)
        training_graph = model[0]._compiled_call_impl
        x = torch.randn(4, 16)
        with torch.no_grad():
            reference = model(x)  # training's forward: the graph compiled, run once
            with gathered(model):
                outputs = [model(x) for _ in range(3)]
                runs_inside = len(runs) - 1
            model(x)
    finally:
        torch.distributed.destroy_process_group()
    assert (len(compiles), runs_inside, len(runs)) == (1, 3, 5)
    assert all(torch.equal(output, reference) for output in outputs)
    assert model[0]._compiled_call_impl is training_graph


def test_the_memory_plan_keeps_a_compiled_runs_static_cache_all_run(tmp_path, assets):
    """Compiled, the cache's buffers live from one generation to the next: the plan counts them at
    every moment of the step, not only while sampling."""
    from qwen3_neuron.job.checks.memory import DTYPE_BYTES, GIB

    eager = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo"), tmp_path / "eager")
    compiled = plan_of(compose_job("experiment=cpu_qwen3_tiny_grpo", "compile.enable=true"), tmp_path / "compiled")
    text = json.loads((Path(assets.tiny_qwen3_dir) / "config.json").read_text())
    training = compiled.trainer_config.training
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    cache = (text["num_hidden_layers"] * 2 * training.local_batch_size * training.seq_len
             * text["num_key_value_heads"] * head_dim * DTYPE_BYTES[training.mixed_precision_param])  # fmt: skip
    assert compiled.memory.static_cache_gib * GIB == cache and eager.memory.static_cache_gib == 0
    assert (eager.memory.generation_gib - compiled.memory.generation_gib) * GIB == pytest.approx(cache)
    assert "static KV cache" in compiled.memory.line()
    # the cache is held at every moment of the step: at the peak (the loss's, not sampling's) the
    # compiled run's total is the eager run's plus the cache
    assert compiled.memory.peak_at == eager.memory.peak_at != "GRPO's generation"
    assert (compiled.memory.per_rank_gib - eager.memory.per_rank_gib) * GIB == pytest.approx(cache)


def _gathering_rank(rank: int, port: int, out_dir: str) -> None:
    """One of two gloo ranks: FSDP2 as torchtitan wraps a model (each block resharded after its
    forward, the root not; bfloat16 compute), forwards inside and outside `gathered`."""
    import os

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    from qwen3_neuron.generation.kv_cache import gathered

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model[:2]:
        fully_shard(block, reshard_after_forward=True, mp_policy=policy)
    fully_shard(model, reshard_after_forward=False, mp_policy=policy)
    gathers = []
    all_gather = torch.distributed.all_gather_single  # FSDP2's all-gather of a module's parameters
    torch.distributed.all_gather_single = lambda *a, **k: gathers.append(1) or all_gather(*a, **k)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))
    hooked = []  # a block's forward hooks (FSDP's among them) run or not
    model[1].register_forward_pre_hook(lambda module, args: hooked.append(1))

    def sharded(module) -> bool:
        return all(isinstance(p, DTensor) for p in module.parameters(recurse=False))

    with torch.no_grad():
        reference = model(x)
        outside = len(gathers)  # each module gathered once per forward; the root keeps its parameters
        with gathered(model):
            at_entry, hooks = len(gathers), len(hooked)
            outputs = [model(x) for _ in range(4)]
            inside, hooks_inside = len(gathers) - at_entry, len(hooked) - hooks
        after = len(gathers)
        model(x)
    record = {"outside": outside, "at_entry": at_entry - outside, "inside": inside, "block_hooks_inside": hooks_inside,
              "forward_after": len(gathers) - after, "same": all(torch.equal(out, reference) for out in outputs),
              "blocks_resharded": all(sharded(block) for block in model[:2]),
              "root_kept": not sharded(model[2])}  # fmt: skip
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


def test_generation_gathers_each_fsdp_module_once_and_puts_training_back(tmp_path):
    """On two gloo ranks: `gathered` all-gathers each FSDP module once, its forwards then gather
    nothing, run no block hooks (FSDP's) and give the FSDP forward's outputs bit for bit; after
    it, a forward gathers as in training again and reshards the blocks after it (the root keeps
    its parameters, as before)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.start_processes(_gathering_rank, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record == {"outside": 3, "at_entry": 2, "inside": 0, "block_hooks_inside": 0, "forward_after": 3,
                          "same": True, "blocks_resharded": True, "root_kept": True}, rank  # fmt: skip
