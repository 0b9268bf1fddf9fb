"""Stage 6, train: one torchrun worker. `python -m qwen3_neuron.worker.train <run_dir>`.

Builds the Trainer.Config from the job the launcher settled and recorded in the run dir (job.yaml,
read once; no Hydra here, and no checks: the plan made them; workers started before the plan have
local rank 0 make it first, `worker.rank0_plan`, and that rank trains with the config it checked),
applies the device's
compatibility fixes, and runs torchtitan's trainer the way `torchtitan.train.main` does:
structured logging as `debug.enable_structured_logging` says, `comm.mode=local_tensor` skips
training, and `checkpoint.create_seed_checkpoint` saves step 0 instead of training. A run whose
last save is in HF is exported by global rank 0 once every rank has written its part
(`hf_io.export`), into `export.json` for the launcher's summary.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import traceback
from pathlib import Path

from qwen3_neuron.devices.fixes import install
from qwen3_neuron.job.job import recorded_device
from qwen3_neuron.parent_death import die_with_parent
from qwen3_neuron.handoff import Handoff
from qwen3_neuron.process_exit import exit_without_teardown
from qwen3_neuron.worker.failure_record import record_failure, stopped_by_signal
from qwen3_neuron.run_dir import (
    EXPORT_FILE,
    complete_steps,
    packing_efficiency,
    read_job,
    write_data_stats,
    write_json,
)


def main(run_dir: Path, recorded_job: dict | None = None) -> None:
    """`recorded_job`: the run dir's job.yaml as the process that forked this rank read it, its
    device's fixes installed there (`import_training`)."""
    die_with_parent(os.getppid())  # torchrun's end (the launcher's end ends torchrun) ends this rank
    handoff = Handoff.from_env()
    if recorded_job is None:  # a started worker
        recorded_job = read_job(run_dir)  # the job the launcher settled; this process's one read
        install(recorded_device(recorded_job))  # before torchtitan copies it

    plan = None
    if handoff and os.environ.get("LOCAL_RANK") == "0":
        # started before the plan: local rank 0 makes it, checking torchtitan's APIs before importing them
        from qwen3_neuron.worker.rank0_plan import plan_for_the_launcher

        try:
            plan = plan_for_the_launcher(run_dir, handoff, recorded_job)
        except Exception as error:  # a bug: the launcher prints its traceback's end
            if not stopped_by_signal(error):  # e.g. by the launcher once this rank handed it the plan's refusal
                record_failure(run_dir, error, None)
            raise
    try:  # the other ranks import meanwhile
        import torch
        from torchtitan.observability import structured_logger as sl
        from torchtitan.tools.logging import init_logger, logger

        from qwen3_neuron.finetune.adapter_save import save_adapters_for_export
        from qwen3_neuron.finetune.frozen_base import keep_requires_grad_through_distribution
        from qwen3_neuron.finetune.step_seed import seed_each_step
        from qwen3_neuron.hf_io.export import exports_hf
        from qwen3_neuron.job.job import Job
        from qwen3_neuron.job.trainer_config import build_trainer_config
        from qwen3_neuron.trainers import trainer_class
        from qwen3_neuron.worker.end_of_training import meet_after_training, skip_the_closing_sleep
        from qwen3_neuron.worker.full_last_step import keeps_a_full_last_step, save_full_last_step
        from qwen3_neuron.worker.lr_schedule import follow_one_schedule, schedule_end
        from qwen3_neuron.worker.step_memory import measure_one_step, write_step_memory
        from qwen3_neuron.worker.tensor_memory import measure_training, write_measurement
        from qwen3_neuron.worker.what_ran import check_overrides_replaced, record_what_ran
    except ImportError:
        if handoff:  # a torchtitan lacking an API: local rank 0's plan names it, and this rank exits then
            handoff.wait_for_go(run_dir)
        raise
    if handoff:  # every rank builds once the launcher says go
        handoff.wait_for_go(run_dir)
    init_logger()
    if plan is not None:  # local rank 0 of this launch: the job and config it planned and checked
        job, config = plan.job, plan.trainer_config
    else:
        job = Job.recorded(recorded_job)
        config = build_trainer_config(job, run_dir)
    settings = job.settings
    lora = settings.finetune.method == "lora"
    if lora:
        keep_requires_grad_through_distribution()  # torchtitan's spmd_types path unfreezes the base
    sl.init_structured_logger(
        source="training",  # torchtitan's own name for the trainer's records
        output_dir=config.dump_folder,
        enable=config.debug.enable_structured_logging,
    )
    sl.log_trace_instant("structured_logger_started")
    if config.comm.mode == "local_tensor":
        # as torchtitan: LocalTensor cannot initialise the model's states yet, nothing trains
        logger.info("Local tensor mode enabled - skipping training execution")
        return
    trainer = None
    exports = exports_hf(config)
    try:
        # the objective's trainer, built as torchtitan's `config.build()` builds its own: on a copy of the config
        trainer = trainer_class(settings.trainer.name)(dataclasses.replace(config), settings=settings,
                                                  seed=config.debug.seed or 0)  # fmt: skip
        trainer.metrics_processor.data_stats = getattr(trainer.dataloader, "data_stats", None)  # the progress line's
        follow_one_schedule(trainer, schedule_end(config))  # before train() loads a checkpoint
        if handoff and os.environ.get("LOCAL_RANK") == "0":
            handoff.remove_files(run_dir)  # every rank of this node has built: none reads them again
        kernels = settings.kernels
        if kernels.overrides and not kernels.allow_unused and config.parallelism.pipeline_parallel_degree == 1:
            check_overrides_replaced(trainer, kernels.overrides)  # every rank, before the first step
        if lora and settings.finetune.dropout:
            seed_each_step(trainer)  # a resumed run draws the masks the uninterrupted one drew
        held = trainer.held_tensors()  # kept across steps besides the model's and the optimizer's
        if config.checkpoint.create_seed_checkpoint:  # the plan checked world size 1, checkpoint.enable
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            meter = measure_training(trainer)  # tensor_memory.json: what the plan's estimate predicts
            step_memory = measure_one_step(trainer, config.training.steps, held) if settings.run.measure_memory else None
            skip_the_closing_sleep()
            trainer.train()
            meet_after_training()
            write_measurement(trainer, meter, run_dir)
            if step_memory is not None:
                write_step_memory(step_memory, run_dir)
            if lora:
                save_adapters_for_export(trainer, config)  # the HF save drops the adapters
            if keeps_a_full_last_step(config, job.composed.get("checkpoint") or {}):
                save_full_last_step(trainer)  # extending the run continues from its last step
        if exports and torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank has written its part of the last HF save (and LoRA adapters)
    except Exception as error:  # torchtitan raises on a non-finite loss, naming the step
        _record_failure(run_dir, error, config)
        raise
    finally:
        if trainer is not None:
            _record_data_stats(trainer, run_dir, logger)
            record_what_ran(trainer, config, run_dir)  # overrides, attention, compile: summary.json's
            trainer.close()
    if torch.distributed.is_initialized():
        with sl.log_trace_span("torch_distributed_teardown"):
            torch.distributed.destroy_process_group()
    logger.info("Training finished")
    if exports and int(os.environ.get("RANK", "0")) == 0:
        _export(config, settings, run_dir)


def import_training(run_dir: Path) -> dict:
    """What every rank imports before it builds, imported once by the process that forks the ranks
    (`worker.forked_torchrun`); the device's fixes first, as in `main`. Returns the job read, for
    the ranks."""
    recorded_job = read_job(run_dir)
    install(recorded_device(recorded_job))
    try:
        import torchtitan.trainer  # noqa: F401

        from qwen3_neuron.trainers import default_trainer, trainer_class

        # the objective's trainer and what it imports (the job's settings are parsed by each rank)
        named = (recorded_job.get("trainer") or {}).get("name")
        trainer_class(named or default_trainer(recorded_job["data"]["kind"]))
        from qwen3_neuron.job import trainer_config  # noqa: F401

        if recorded_job["model"]["kind"] == "hf":  # Transformers' model machinery, which every rank builds with
            import transformers.modeling_utils  # noqa: F401
    except ImportError:  # the ranks import again, and local rank 0's plan names what is missing
        pass
    return recorded_job


def forked_rank(run_dir: Path, recorded_job: dict) -> None:
    """One rank forked by `worker.forked_torchrun`: `main`, its traceback on this rank's stderr as
    a started worker's would be (the fork's own wrapper keeps it for the agent only)."""
    tempfile.tempdir = None  # the forking process's temp dir holds torch's error files only; the rank's is the usual
    try:
        main(run_dir, recorded_job)
    except Exception:
        traceback.print_exc()
        raise


def _export(config, settings, run_dir: Path) -> None:
    """The HF export (LoRA: adapter and merged model), recorded for the launcher's summary: the
    export's fields, or its error (the run then fails, its checkpoints kept)."""
    from qwen3_neuron.errors import ExportError
    from qwen3_neuron.hf_io.run_export import export_run
    from qwen3_neuron.worker.full_last_step import promote_full_last_step

    try:
        record = export_run(config, run_dir, settings.finetune, settings.hf.export_dir)
        promote_full_last_step(run_dir / config.checkpoint.folder)
    except ExportError as e:
        print(f"[qwen3-neuron] export failed: {e}", file=sys.stderr, flush=True)
        record = {"error": f"export failed: {e}"}
    write_json(run_dir / EXPORT_FILE, record)


def _record_data_stats(trainer, run_dir: Path, logger) -> None:
    """This rank's data counts (data=text|chat|mix), for the log and summary.json's data_stats."""
    data_stats = getattr(trainer.dataloader, "data_stats", None)
    stats = data_stats() if data_stats else None
    if stats is None:
        return
    rank = int(os.environ.get("RANK", "0"))
    write_data_stats(run_dir, rank, stats)
    counts = ", ".join(f"{k} {v:,}" for k, v in stats.items() if k != "examples")  # those: the end-of-run lines
    efficiency = packing_efficiency(stats)
    if efficiency is not None:
        counts += f", packing efficiency {efficiency:.4f}"
    logger.info(f"[qwen3-neuron data] rank {rank}: {counts}")


def _record_failure(run_dir: Path, error: Exception, config) -> None:
    """Say why the run stopped and which checkpoint is the last good one (`failure.record_failure`)."""
    folder = run_dir / config.checkpoint.folder
    steps = complete_steps(folder) if config.checkpoint.enable else []
    record_failure(run_dir, error, str(folder / f"step-{steps[-1]}") if steps else None)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_without_teardown(0)  # a failed run raised above: it exits as usual, non-zero
