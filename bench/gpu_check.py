"""launch.py vs bare torchtitan, one row per training, on one GPU (or one CPU rank): tokens/s and MFU.

    python bench/gpu_check.py [--device cuda|cpu] [--out DIR] [--runs DIR] [--budget-s 480]

bench/gpu_check.sh runs it after set-up and the CUDA-marked tests. Rows (each: bare torchtitan, then
launch.py, on the same torchtitan settings; `bench/side_by_side.py` builds both commands):

- native           torchtitan's `qwen3_0_6b` (0.6B; CPU: `qwen3_debugmodel`)
- native compile   the same with `compile.enable=true` on both sides (run last: it takes longest)
- hf               the Transformers backend (`transformers_modeling_backend_full`) on a generated model dir of
                   the native row's shape (config.json + tokenizer, random init: nothing to download)
- moe kernels=none torchtitan's `qwen3_moe_debug` (debugmodel_moe; CPU: the same function with the project's
                   tiny_moe, `qwen3_moe_debug_tiny`), torchtitan's grouped experts on both sides
- moe kernels=blockwise  launch.py with `kernels=blockwise` against the bare run of `moe kernels=none` (bare
                   torchtitan has no blockwise experts): its ratio is blockwise vs torchtitan's experts

One rank: torchtitan then shards nothing (FSDP degree 1) and runs the matmuls under autocast in
`training.mixed_precision_param` (bfloat16 on CUDA; on CPU the dtype launch.py picks). Each run takes
`warmup` untimed steps, then `timed` steps: tokens/s is the median of torchtitan's per-step `tps`; MFU is
tokens/s x torchtitan's FLOPs per token / the peak FLOP/s launch.py measured for this device and dtype
(its run dir's metrics.jsonl and peak_flops.json), for both sides alike. On a GPU torchtitan's table names
(H100, H200: 989 TFLOP/s bf16 dense), two more columns divide the same tokens/s by that data-sheet peak,
as torchtitan's own MFU does: those compare with torchtitan's published MFU. Both sides train the same
seed on the same data, so their losses must agree.

Each launch.py run's trainer_config.json is compared with the Trainer.Config bare torchtitan builds
from the same flags (torchtitan's ConfigManager): the fields that differ are printed under the table.

`--budget-s`: seconds from `--started` (the shell script's start) in which the rows must fit: a row is
skipped when less is left than it should take, and each run is killed after `Sizes.run_timeout_s`
(twice that with compile), so the check ends inside the device machine's command limit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.side_by_side import RunFailed, Timing, bare_command, bare_flag, launch_command, timed_training
from qwen3_neuron.assets.build import DATASET_NAME, EOS_TOKEN, build_assets
from qwen3_neuron.report.peak_flops import datasheet_peak_flops
from qwen3_neuron.run_dir import PEAK_FLOPS_FILE, read_json, read_metrics


@dataclass(frozen=True)
class Sizes:
    native_config: str  # torchtitan config function of the native and compile rows
    native_flavor: str
    moe_module: str  # bare torchtitan's --module for the MoE rows (a shorthand or a module path)
    moe_flavor: str
    seq_len: int
    local_batch_size: int
    warmup: int  # untimed steps (compile: the first steps compile)
    timed: int
    run_timeout_s: int


MOE_CONFIG = "qwen3_moe_debug"  # torchtitan's debugmodel_moe: 8 layers of 64 experts, top 8
SIZES = {
    # torchtitan's qwen3_0_6b training shape (4 x 4096 tokens a step); debugmodel_moe takes the same.
    "cuda": Sizes("qwen3_0_6b", "0.6B", "qwen3", "debugmodel_moe", seq_len=4096, local_batch_size=4, warmup=5,
                  timed=10, run_timeout_s=150),
    # debugmodel_moe's 300 M expert parameters take minutes a step on a CPU: the project's tiny_moe
    # in torchtitan's same config function instead (qwen3_moe_debug_tiny below)
    "cpu": Sizes("qwen3_debugmodel", "debugmodel", "bench.gpu_check", "tiny_moe", seq_len=128, local_batch_size=2,
                 warmup=2, timed=3, run_timeout_s=600),
}  # fmt: skip
HF_MODULE, HF_CONFIG = "transformers_modeling_backend", "transformers_modeling_backend_full"


@dataclass
class Row:
    name: str
    module: str  # bare torchtitan's --module / --config
    config: str
    selection: list[str]  # launch.py's groups and framework keys for the same config
    settings: dict[str, object]  # torchtitan fields, the same on both sides
    bare_only: dict[str, object] = field(default_factory=dict)  # what launch.py sets from its own keys
    bare_from: str | None = None  # reuse that row's bare run (same bare command)
    bare: Timing | None = None
    ours: Timing | None = None
    peak_flops: float | None = None  # launch.py's measured peak FLOP/s per rank (its peak_flops.json)
    flops_per_token: float | None = None  # torchtitan's count for the model (launch.py's metrics.jsonl)
    errors: list[str] = field(default_factory=list)
    skipped: bool = False  # it would not have fitted in the budget (said in errors): no failure
    config_diff: list[str] = field(default_factory=list)
    memory: dict[str, float | None] = field(default_factory=dict)  # launch.py's summary: estimate, tracked, allocated

    @property
    def compiled(self) -> bool:
        return self.settings.get("compile.enable") is True


def rows(device: str, sizes: Sizes, hf_dir: Path) -> list[Row]:
    paths = build_assets()
    dtype = "bfloat16" if device == "cuda" else _cpu_param_dtype()
    shared = {
        "training.steps": sizes.warmup + sizes.timed,
        "training.seq_len": sizes.seq_len,
        "training.local_batch_size": sizes.local_batch_size,
        "training.mixed_precision_param": dtype,
        "lr_scheduler.warmup_steps": 2,
        "metrics.log_freq": 1,
        "debug.seed": 42,
        "dataloader.dataset": DATASET_NAME,
        "dataloader.dataset_path": paths.text_dataset_dir,
    }
    tokenizer = {"hf_assets_path": paths.tokenizer_dir}
    # step 2 (a warm-up step, untimed) under torch's MemTracker: the plan's estimate beside it and CUDA's allocator peak
    one_rank = [f"device={device}", "run.nproc_per_node=1", "run.measure_memory=true"]
    native = [*one_rank, "model=native", f"model.config_fn={sizes.native_config}",
              f"model.flavor={sizes.native_flavor}"]  # fmt: skip
    moe = [*one_rank, "model=moe", f"model.config_fn={MOE_CONFIG}", f"model.flavor={sizes.moe_flavor}"]
    moe_config = MOE_CONFIG if sizes.moe_module == "qwen3" else qwen3_moe_debug_tiny.__name__
    return [
        Row("native", "qwen3", sizes.native_config, native, {**shared, **tokenizer}),
        Row("native compile", "qwen3", sizes.native_config, native, {**shared, **tokenizer, "compile.enable": True}),
        Row("hf", HF_MODULE, HF_CONFIG, [*one_rank, "model=hf", f"model.hf_model={hf_dir}"],
            shared, bare_only={"hf_model": hf_dir, "hf_assets_path": hf_dir}),
        Row("moe kernels=none", sizes.moe_module, moe_config, [*moe, "kernels=none"], {**shared, **tokenizer}),
        Row("moe kernels=blockwise", sizes.moe_module, moe_config, [*moe, "kernels=blockwise"],
            {**shared, **tokenizer}, bare_from="moe kernels=none"),
    ]  # fmt: skip


def qwen3_moe_debug_tiny():
    """torchtitan's `qwen3_moe_debug` with the project's tiny_moe model: bare torchtitan's config
    function for the CPU MoE rows (`--module bench.gpu_check --config qwen3_moe_debug_tiny`), the
    config launch.py builds from `model.config_fn=qwen3_moe_debug model.flavor=tiny_moe`."""
    from torchtitan.models.qwen3.config_registry import qwen3_moe_debug

    from qwen3_neuron.models.flavors import moe_model_spec

    config = qwen3_moe_debug()
    config.model_spec = moe_model_spec("tiny_moe")
    return config


def _cpu_param_dtype() -> str:
    from qwen3_neuron.devices.policy import mixed_precision_param

    return mixed_precision_param("cpu") or "bfloat16"


def write_hf_dir(out_dir: Path, flavor: str, tokenizer_dir: Path) -> Path:
    """A Transformers Qwen3 dir of torchtitan's `flavor` shape: config.json and the tiny tokenizer,
    no weights (model=hf without checkpointing=from_hf starts from a random init)."""
    from tokenizers import Tokenizer
    from torchtitan.models.qwen3 import model_registry
    from transformers import Qwen3Config

    from qwen3_neuron.models.hf.model_dir import native_architecture

    eos_id = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(EOS_TOKEN)
    architecture = native_architecture(model_registry(flavor).model)
    config = Qwen3Config(**architecture, bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id)
    config.architectures = ["Qwen3ForCausalLM"]
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    for tokenizer_file in sorted(tokenizer_dir.iterdir()):
        shutil.copy2(tokenizer_file, out_dir / tokenizer_file.name)
    return out_dir


# ---- same config? ------------------------------------------------------------------------------

IGNORED = {"dump_folder"}  # the run dir: each side has its own
ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def config_differences(bare_args: list[str], trainer_config_json: Path, device: str) -> list[str]:
    """Fields where launch.py's recorded Trainer.Config differs from bare torchtitan's for the same flags
    (with the device's override imports that qwen3_neuron.worker.torchtitan_cli adds, as it runs)."""
    from torchtitan.config.manager import ConfigManager

    from qwen3_neuron.devices.policy import override_imports
    from qwen3_neuron.worker.torchtitan_cli import model_kind, with_override_imports

    bare_args = with_override_imports(bare_args, override_imports(device, model_kind(bare_args)))

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its notes
        bare_config = ConfigManager().parse_args(bare_args)
    bare = _flat(json.loads(json.dumps(bare_config.to_dict(), default=repr)))
    ours = _flat(json.loads(trainer_config_json.read_text()))
    return [
        f"{key}: bare {_short(bare.get(key, '(absent)'))} | ours {_short(ours.get(key, '(absent)'))}"
        for key in sorted(set(bare) | set(ours))
        if key.split(".")[0] not in IGNORED and _norm(bare.get(key)) != _norm(ours.get(key))
    ]


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    """{"a.b.0.c": leaf}: dicts, and lists of dicts (layers), opened down to their leaves."""
    opened_list = isinstance(tree, list) and any(isinstance(item, dict) for item in tree)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if opened_list else None
    if items is None:
        return {prefix[:-1]: tree}
    flat: dict[str, object] = {}
    for key, value in items:
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def _norm(value: object) -> object:
    return ADDRESS.sub("", value) if isinstance(value, str) else value


def _short(value: object, width: int = 200) -> str:
    text = repr(_norm(value))
    return text if len(text) <= width else text[: width - 3] + "..."


# ---- running -----------------------------------------------------------------------------------


COMPILE_FACTOR = 2  # a compile.enable run against an eager one, wall time (measured on CPU: 149 s vs 83 s)


def run_rows(args, table: list[Row], sizes: Sizes, runs: Path) -> None:
    """Bare, then launch.py, row by row; the compile row last (it takes longest), and a row skipped
    when what is left of the budget is less than it should take (its runs x the longest eager run)."""
    eager_walls: list[float] = []
    for row in sorted(table, key=lambda r: r.compiled):
        slug = re.sub(r"[^a-z0-9]+", "-", row.name)
        left = args.budget_s - (time.time() - args.started) if args.budget_s else float("inf")
        expected = max(eager_walls, default=0) * (1 if row.bare_from else 2) * (COMPILE_FACTOR if row.compiled else 1)
        if left < expected:
            row.errors.append(f"skipped: {left:.0f} s of the budget left, it should take {expected:.0f} s")
            row.skipped = True
            print(f"-- {row.name}: {row.errors[-1]}", flush=True)
            continue
        bare_settings = {**row.settings, **row.bare_only, "dump_folder": runs / f"{slug}-bare"}
        bare_flags = [bare_flag(key, value) for key, value in bare_settings.items()]
        bare_args = ["--module", row.module, "--config", row.config, *bare_flags]
        if row.bare_from:
            row.bare = next(r.bare for r in table if r.name == row.bare_from)
        else:
            command = bare_command(bare_settings, module=row.module, config=row.config, device=args.device, nproc=1)
            row.bare = _timed(row, "bare", command, runs / f"{slug}-bare.log", sizes)
        run_dir = runs / f"{slug}-ours"
        ours_command = launch_command(row.settings, run_dir, row.selection)
        row.ours = _timed(row, "ours", ours_command, run_dir.with_suffix(".log"), sizes)
        if not row.compiled:
            eager_walls += [t.wall_s for t in (row.bare, row.ours) if t]
        peak = read_json(run_dir / PEAK_FLOPS_FILE)
        row.peak_flops = peak["flops_per_second"] if peak else None
        counted = [r["flops_per_token"] for r in read_metrics(run_dir) if r.get("flops_per_token")] if row.ours else []
        row.flops_per_token = counted[-1] if counted else None
        summary = read_json(run_dir / "summary.json") or {}
        row.memory = {key: summary.get(key) for key in MEMORY_KEYS}
        if (run_dir / "trainer_config.json").is_file():
            try:
                row.config_diff = config_differences(bare_args, run_dir / "trainer_config.json", args.device)
            except (Exception, SystemExit) as e:  # tyro exits on a flag it cannot read
                row.config_diff = [f"(not compared: {type(e).__name__}: {e})"]
        print(f"-- {row.name}: bare {_brief(row.bare)} | ours {_brief(row.ours)}", flush=True)


def _brief(timing: Timing | None) -> str:
    if timing is None:
        return "failed"
    return f"{timing.tps:,.0f} tok/s, first step {timing.first_step_s:.1f} s, wall {timing.wall_s:.0f} s"


def _timed(row: Row, side: str, command: list[str], log: Path, sizes: Sizes) -> Timing | None:
    print(f"-- {row.name} ({side}): {' '.join(map(str, command))}", flush=True)
    try:
        timeout_s = sizes.run_timeout_s * (COMPILE_FACTOR if row.compiled else 1)
        return timed_training(command, REPO, warmup=sizes.warmup, log=log, timeout_s=timeout_s)
    except RunFailed as e:
        row.errors.append(f"{side} failed: {e}")
        print(f"-- {row.name} ({side}) FAILED, log {log}:\n{e}", flush=True)
        return None


# ---- report ------------------------------------------------------------------------------------


def mfu(row: Row, timing: Timing | None, peak: float | None = None) -> float | None:
    """tokens/s x FLOPs per token / peak (default: launch.py's measured one), both sides with launch.py's
    FLOPs per token (torchtitan prints TFLOP/s with two decimals: too coarse for a CPU)."""
    peak = peak or row.peak_flops
    if timing is None or not row.flops_per_token or not peak:
        return None
    return timing.tps * row.flops_per_token / peak


def loss_difference(row: Row) -> float | None:
    """The largest |ours - bare| loss over the steps both logged: 0 for the same config, seed and data."""
    if row.bare is None or row.ours is None or row.bare_from:
        return None
    pairs = list(zip(row.bare.losses, row.ours.losses))
    return max(abs(a - b) for a, b in pairs) if pairs else None


def ratio(ours: float | None, bare: float | None) -> float | None:
    return ours / bare if ours is not None and bare else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = ("config", "bare tok/s", "ours tok/s", "ratio", "bare MFU", "ours MFU", "loss max diff",
           "bare 1st step s", "ours 1st step s", "estimate GiB", "tracked step GiB", "max allocated GiB",
           "estimate / allocated")  # fmt: skip
MEMORY_KEYS = ("memory_estimate_gib", "tracked_peak_gib", "max_memory_allocated_gib")


SHEET_COLUMNS = ("bare MFU sheet", "ours MFU sheet")


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.2f}%"


def table_lines(table: list[Row], sheet_peak: float | None = None) -> list[str]:
    """The Markdown table: absolute values and ours/bare ratios, one row per training; with
    `sheet_peak`, the MFU against that data-sheet peak too."""
    columns = COLUMNS + (SHEET_COLUMNS if sheet_peak else ())
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in table:
        bare_tps = row.bare.tps if row.bare else None
        ours_tps = row.ours.tps if row.ours else None
        bare_mfu, ours_mfu = mfu(row, row.bare), mfu(row, row.ours)
        cells = [
            row.name, fmt(bare_tps, ",.0f"), fmt(ours_tps, ",.0f"), fmt(ratio(ours_tps, bare_tps), ".3f"),
            percent(bare_mfu), percent(ours_mfu), fmt(loss_difference(row), ".2g"),
            fmt(row.bare and row.bare.first_step_s, ".1f"), fmt(row.ours and row.ours.first_step_s, ".1f"),
            *(fmt(row.memory.get(key), ".3f") for key in MEMORY_KEYS),
            fmt(ratio(row.memory.get("memory_estimate_gib"), row.memory.get("max_memory_allocated_gib")), ".3f"),
        ]  # fmt: skip
        if sheet_peak:
            cells += [percent(mfu(row, row.bare, sheet_peak)), percent(mfu(row, row.ours, sheet_peak))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(table: list[Row], args, sizes: Sizes, out: Path) -> str:
    peaks = {row.peak_flops for row in table if row.peak_flops}
    device_name = _device_name(args.device)
    sheet_peak = datasheet_peak_flops(device_name) if args.device == "cuda" else None
    sheet_note = [
        f"MFU sheet = the same tok/s x FLOPs/token / the data-sheet peak torchtitan's MFU uses for this GPU "
        f"({sheet_peak / 1e12:g} TFLOP/s bf16 dense): comparable with torchtitan's published MFU"
    ] if sheet_peak else []  # fmt: skip
    lines = [
        f"device {args.device} ({device_name}), 1 rank, seq_len {sizes.seq_len} x local batch "
        f"{sizes.local_batch_size}, {sizes.warmup} warm-up + {sizes.timed} timed steps per run",
        *table_lines(table, sheet_peak),
        "ratio = ours / bare (launch.py / bare torchtitan): tok/s per device, median over the timed steps;",
        "MFU = tok/s x torchtitan's FLOPs/token / the peak launch.py measured ("
        + (", ".join(f"{p / 1e12:.4g} TFLOP/s" for p in sorted(peaks)) or "none measured")
        + "), the same for both sides, so the MFU ratio is the tok/s ratio;",
        *sheet_note,
        "loss max diff: largest |ours - bare| loss over all steps (same seed and data: 0 when the configs agree)",
        "moe kernels=blockwise: its bare column is the moe kernels=none bare run (bare torchtitan has no blockwise)",
    ]
    by_name = {row.name: row for row in table}
    hf, native = by_name["hf"].ours, by_name["native"].ours
    if hf and native:
        lines.append(
            f"hf / native, both launch.py on the same shape: {hf.tps / native.tps:.3f} "
            f"({hf.tps:,.0f} vs {native.tps:,.0f} tok/s): what the Transformers backend costs"
        )
    for row in table:
        for error in row.errors:
            lines.append(f"{row.name}: {error.splitlines()[0]}")
        if row.config_diff:
            lines.append(f"{row.name}: Trainer.Config fields where launch.py differs from bare torchtitan:")
            lines += [f"    {d}" for d in row.config_diff]
        elif row.ours:
            lines.append(f"{row.name}: Trainer.Config the same as bare torchtitan's (but dump_folder)")
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    records = [_row_record(r, sheet_peak) for r in table]
    (out / "results.json").write_text(json.dumps(records, indent=2, default=str) + "\n")
    return text


def _row_record(row: Row, sheet_peak: float | None) -> dict[str, object]:
    record = {k: v for k, v in vars(row).items() if k not in ("bare", "ours")}
    record["datasheet_peak_flops"] = sheet_peak
    for side in ("bare", "ours"):
        timing = getattr(row, side)
        record[side] = timing._asdict() if timing else None
        record[f"{side}_mfu"] = mfu(row, timing)
        record[f"{side}_mfu_datasheet"] = mfu(row, timing, sheet_peak) if sheet_peak else None
    record["ratio"] = ratio(row.ours and row.ours.tps, row.bare and row.bare.tps)
    record["loss_max_diff"] = loss_difference(row)
    return record


def _device_name(device: str) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    import platform

    return platform.processor() or platform.machine()


def pack_logs(runs: Path, out: Path) -> None:
    """The runs' logs and small JSON files as one archive (the device tool returns few files)."""
    keep = ("*.log", "*/summary.json", "*/trainer_config.json", "*/peak_flops.json", "*/command.sh", "*/train.log")
    with tarfile.open(out / "runs.tar.gz", "w:gz") as archive:
        for pattern in keep:
            for path in sorted(runs.glob(pattern)):
                archive.add(path, arcname=str(path.relative_to(runs)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=sorted(SIZES), default="cuda")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--runs", type=Path, help="where the run dirs go (default: OUT/runs)")
    parser.add_argument("--budget-s", type=float, default=0, help="skip rows once this is spent (0: no limit)")
    parser.add_argument("--started", type=float, default=time.time(), help="epoch seconds the budget counts from")
    args = parser.parse_args(argv)
    sizes = SIZES[args.device]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.runs or args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)

    from qwen3_neuron.devices.fixes import install

    install(args.device)  # before torchtitan is imported (the config comparison imports it)
    hf_dir = write_hf_dir(runs / f"hf-{sizes.native_flavor}", sizes.native_flavor, build_assets().tokenizer_dir)
    table = rows(args.device, sizes, hf_dir)
    run_rows(args, table, sizes, runs)
    print(report(table, args, sizes, args.out), flush=True)
    pack_logs(runs, args.out)
    return 0 if all(row.skipped or (row.bare and row.ours) for row in table) else 1


if __name__ == "__main__":
    raise SystemExit(main())
