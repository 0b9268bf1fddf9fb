"""eval=lm_eval: what is refused before anything trains (unknown tasks with close matches, data
not in the local cache, no export, an objective nobody evaluates), what a sweep reads of a job's
scores (its table's columns, its objective), and an evaluation that fails keeping the run.
The scores themselves: tests/test_chat.py (the chat SFT run against the untrained base); the
launch refusing them: tests/test_bad_inputs.py's eval rows."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest
from conftest import REPO

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.eval.eval_section import EvalSettings
from qwen3_neuron.eval.objective import check_objective, check_objective_metric, objective_value
from qwen3_neuron.eval.run import check_export_planned, evaluate_run
from qwen3_neuron.eval.task_checks import check_tasks, task_manager
from qwen3_neuron.report.sweep_table import write_report

CHAT_ANSWER = EvalSettings(kind="lm_eval", tasks=["tiny_chat_answer"])


@pytest.fixture(scope="module")
def registry():
    """lm-eval's whole task registry with the project's tasks (seconds: built once), as a run
    naming one of lm-eval's own tasks gets it."""
    return task_manager(EvalSettings(kind="lm_eval", tasks=["gsm8k"]))


def test_the_projects_own_tasks_are_found_without_indexing_lm_evals_own():
    assert task_manager(CHAT_ANSWER).all_tasks == ["tiny_chat_answer"]


def test_an_unknown_task_is_refused_with_close_matches(registry):
    with pytest.raises(
        ConfigError, match=r"unknown lm-eval task 'tiny_chat_anser'\. Did you mean 'tiny_chat_answer'\?"
    ):
        check_tasks(EvalSettings(kind="lm_eval", tasks=["tiny_chat_anser"]), registry)
    with pytest.raises(ConfigError, match=r"eval=lm_eval needs eval.tasks"):
        check_tasks(EvalSettings(kind="lm_eval"), registry)


def test_a_task_whose_hub_data_is_not_cached_is_refused_with_the_download_command(registry, tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))  # an empty cache
    with pytest.raises(ConfigError, match=r"gsm8k reads openai/gsm8k, which is not in the local HF cache .*"
                                          r"`hf download openai/gsm8k --repo-type dataset`"):  # fmt: skip
        check_tasks(EvalSettings(kind="lm_eval", tasks=["gsm8k"]), registry)
    with pytest.raises(ConfigError, match=r"mmlu reads cais/mmlu"):  # a group: its tasks' data sets
        check_tasks(EvalSettings(kind="lm_eval", tasks=["mmlu"]), registry)
    check_tasks(CHAT_ANSWER, registry)  # the project's own task reads files beside its YAML


def test_a_run_without_an_export_is_refused_saying_which_checkpointing_to_add():
    with pytest.raises(ConfigError, match=r"add checkpointing=export_hf"):
        check_export_planned({"checkpoint": {"enable": True, "interval": 10}})
    check_export_planned({"checkpoint": {"enable": True, "last_save_in_hf": True}})


def test_an_objective_must_be_a_summary_field_or_an_evaluated_score(registry):
    with pytest.raises(ConfigError, match=r"needs an evaluation: add eval=lm_eval"):
        check_objective("eval.tiny_chat_answer.exact_match", EvalSettings())
    with pytest.raises(ConfigError, match=r"names no task this run evaluates"):
        check_objective("eval.gsm8k.exact_match", CHAT_ANSWER)
    with pytest.raises(ConfigError, match=r"Did you mean 'final_loss'\?"):
        check_objective("final_los", EvalSettings())
    with pytest.raises(ConfigError, match=r"Valid: eval.tiny_chat_answer.exact_match\."):
        check_objective_metric("eval.tiny_chat_answer.acc", CHAT_ANSWER, registry, None)
    with pytest.raises(ConfigError, match=r"higher is better for exact_match.*hydra.sweeper.direction=maximize"):
        check_objective_metric("eval.tiny_chat_answer.exact_match", CHAT_ANSWER, registry, "minimize")
    check_objective_metric("eval.tiny_chat_answer.exact_match", CHAT_ANSWER, registry, "maximize")


def test_a_sweep_table_has_a_column_per_score_and_the_objective_reads_it(tmp_path):
    for name, lr, score in (("0", "0.001", 0.25), ("1", "0.003", 1.0)):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n")
        summary = {"status": "completed", "final_loss": 1.0, "eval": {"tiny_chat_answer": {"exact_match": score}}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        assert objective_value(summary, "eval.tiny_chat_answer.exact_match") == score
    write_report(tmp_path)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    assert [(r["optimizer.lr"], r["eval.tiny_chat_answer.exact_match"]) for r in rows] == [
        ("0.001", "0.25"),
        ("0.003", "1.0"),
    ]
    assert list(rows[0])[-2:] == ["error", "run_dir"]
    assert "| eval.tiny_chat_answer.exact_match |" in (tmp_path / "summary.md").read_text()


def test_a_failed_evaluation_keeps_the_run_and_says_what_failed(tmp_path, registry):
    fields = evaluate_run(tmp_path, CHAT_ANSWER, {"export_dir": str(tmp_path / "gone")}, "cpu", registry, verbose=False)
    assert fields["eval"] is None and fields["eval_error"].startswith("evaluation failed: ")
    assert (tmp_path / "eval" / "eval.log").exists()  # lm-eval's own words on it


def test_a_completed_run_resumed_with_new_eval_keys_is_evaluated_only(tmp_path):
    from qwen3_neuron.eval.completed_run import rescore_settings
    from qwen3_neuron.report.summary import sweep_job_value

    summary = {"status": "completed", "eval": {"tiny_chat_answer": {"exact_match": 0.5}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    composed = {"eval": {"kind": "lm_eval", "tasks": ["tiny_chat_answer"], "limit": 4}}
    typed = ["run.resume=x", "eval=lm_eval", "eval.tasks=[tiny_chat_answer]", "eval.limit=4"]
    assert rescore_settings(tmp_path, composed, typed) == EvalSettings(
        kind="lm_eval", tasks=["tiny_chat_answer"], limit=4
    )
    with pytest.raises(
        ConfigError, match=r"may only evaluate it again \(eval\.\*\), but this command also sets 'training.steps'"
    ):
        rescore_settings(tmp_path, composed, [*typed, "training.steps=50"])
    assert rescore_settings(tmp_path, composed, ["run.resume=x", "training.steps=50"]) is None  # trains on, as before
    objective = "eval.tiny_chat_answer.exact_match"
    assert sweep_job_value(summary, objective, stop_on_failure=False) == 0.5


def test_scores_accumulate_and_a_trained_on_runs_earlier_scores_move_aside(assets, tmp_path):
    """`python -m qwen3_neuron.eval <run> eval.tasks=[a]`, then `[b]`: eval/results.json and the
    summary's `eval` hold both. Once the run trains on (run.resume with a larger training.steps),
    they are the earlier model's: moved to eval/step-N/, none left looking current."""
    from qwen3_neuron.eval.__main__ import main as evaluate_main
    from qwen3_neuron.eval.run import set_aside_earlier_scores

    tasks = shutil.copytree(REPO / "qwen3_neuron" / "eval" / "tasks" / "tiny_chat_answer", tmp_path / "tasks")
    again = tasks / "tiny_chat_answer.yaml"
    again.rename(tasks / "again.yaml")
    (tasks / "again.yaml").write_text(
        (tasks / "again.yaml").read_text().replace("task: tiny_chat_answer", "task: tiny_chat_answer_again")
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {"status": "completed", "steps": 10, "export_dir": str(assets.tiny_qwen3_dir)}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    quick = ["eval.limit=2", "eval.apply_chat_template=true"]
    assert evaluate_main([str(run_dir), "eval.tasks=[tiny_chat_answer]", *quick]) == 0
    assert evaluate_main([str(run_dir), "eval.tasks=[tiny_chat_answer_again]", f"eval.include_path={tasks}", *quick]) == 0
    both = {"tiny_chat_answer", "tiny_chat_answer_again"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["eval"]) == both and summary["status"] == "completed"
    assert set(json.loads((run_dir / "eval" / "results.json").read_text())["results"]) == both

    aside = set_aside_earlier_scores(run_dir, summary)
    assert aside == run_dir / "eval" / "step-10"
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["step-10"]
    assert json.loads((aside / "scores.json").read_text()) == summary["eval"]
    assert set(json.loads((aside / "results.json").read_text())["results"]) == both


# ---- python -m qwen3_neuron.eval <run dir>: scored again, training nothing -----------------------

TRAINED = {"status": "completed", "exit_code": 0, "final_loss": 1.25, "steps": 10}


def _run_dir(tmp_path, export_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({**TRAINED, "export_dir": str(export_dir)}))
    return run


def test_the_eval_command_on_a_run_dir_writes_its_scores_beside_the_training_record(tmp_path, monkeypatch):
    """lm-eval itself stands aside here (tests/test_chat.py scores for real): what the command
    does with its scores."""
    from qwen3_neuron.eval import run as eval_run
    from qwen3_neuron.eval.__main__ import main

    asked = []

    def lm_eval(model_dir, settings, out_dir, device, manager, adapter):
        asked.append((model_dir, settings.tasks, settings.limit, adapter))
        (out_dir / "results.json").write_text("{}")
        return {"tiny_chat_answer": {"exact_match": 0.5}}

    monkeypatch.setattr(eval_run, "evaluate", lm_eval)
    export = tmp_path / "export"
    run = _run_dir(tmp_path, export)
    assert main([str(run), "eval.tasks=[tiny_chat_answer]", "eval.limit=2"]) == 0
    assert asked == [(export, ["tiny_chat_answer"], 2, None)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"] == {"tiny_chat_answer": {"exact_match": 0.5}} and summary["eval_error"] is None
    assert {k: summary[k] for k in TRAINED} == TRAINED  # the training's record as it was
    assert (run / "eval" / "results.json").exists()


def test_a_failed_evaluation_of_a_run_dir_keeps_it_completed_records_the_error_and_exits_1(tmp_path, capsys):
    from qwen3_neuron.eval.__main__ import main

    broken = tmp_path / "broken-export"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # no model type, no weights: lm-eval cannot load it
    run = _run_dir(tmp_path, broken)
    assert main([str(run), "eval.tasks=[tiny_chat_answer]", "eval.limit=2"]) == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["eval_error"].startswith("evaluation failed: ")
    assert {k: summary[k] for k in TRAINED} == TRAINED
    assert "[qwen3-neuron] evaluation failed: " in capsys.readouterr().err
    assert (run / "eval" / "eval.log").exists()
