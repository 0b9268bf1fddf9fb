"""What the launcher says when the workers stop with an error: the user's mistake any rank found,
as its sentence and exit 2; a crash as its traceback's last frames and where the whole one is."""

from __future__ import annotations

import os

import pytest
from conftest import REPO, launch

from qwen3_neuron.errors import DataError
from qwen3_neuron.launch.workers_failed import workers_failed
from qwen3_neuron.launch.process import LaunchResult
from qwen3_neuron.worker.failure_record import record_failure

TORCHRUN_END = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


def _divide():
    return 1 / 0


def test_a_data_error_any_rank_found_is_said_as_its_sentence_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    record_failure(tmp_path, _raised(DataError("data source rows.jsonl: none of the 40 rows became a document")), None)
    monkeypatch.setenv("RANK", "0")  # rank 0's collective, cut short by rank 1's exit: not the cause
    record_failure(tmp_path, _raised(RuntimeError("Connection closed by peer")), None)
    failure = workers_failed(tmp_path, LaunchResult(1, None, output_end=TORCHRUN_END), verbose=False)
    assert (failure.exit_code, failure.message) == (
        2, "Data error: data source rows.jsonl: none of the 40 rows became a document"
    )


def test_a_row_that_is_no_conversation_is_the_users_data_error_wherever_it_surfaces(tmp_path, monkeypatch):
    """Every reader of chat rows names the row's file and line; one that reaches a worker's end
    unconverted is still said as the user's sentence, never as a crash."""
    from qwen3_neuron.data.chat_rows import ChatFormatError, row_conversation
    from qwen3_neuron.data.source import DataSource

    with pytest.raises(ChatFormatError) as error:
        row_conversation({"messages": [{"role": "narrator", "content": "once"}]}, DataSource())
    monkeypatch.setenv("RANK", "1")
    record_failure(tmp_path, error.value, None)
    failure = workers_failed(tmp_path, LaunchResult(1, None, output_end=TORCHRUN_END), verbose=False)
    assert (failure.exit_code, failure.message) == (2, f"Data error: {error.value}")


def test_a_crash_shows_its_last_frames_and_where_the_whole_traceback_is(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    try:
        _divide()
    except ZeroDivisionError as error:
        record_failure(tmp_path, error, str(tmp_path / "checkpoint" / "step-4"))
    monkeypatch.setenv("RANK", "1")
    record_failure(tmp_path, _raised(KeyError("not rank 0's")), None)  # rank 0 speaks for a crash
    failure = workers_failed(tmp_path, LaunchResult(1, None, output_end=TORCHRUN_END), verbose=False)
    lines = failure.message.splitlines()
    assert failure.exit_code == 1
    assert lines[0] == "[qwen3-neuron] the job failed: rank 0 raised ZeroDivisionError: division by zero"
    assert lines[-2:] == [
        "ZeroDivisionError: division by zero",
        f"[qwen3-neuron] the whole traceback, and torchrun's report: {tmp_path / 'train.log'}",
    ]  # fmt: skip
    assert any("in _divide" in line for line in lines) and "    return 1 / 0" in lines
    assert TORCHRUN_END.strip() not in failure.message


@pytest.mark.parametrize("verbose, shown", [(False, TORCHRUN_END.strip()), (True, "its output is above")])
def test_without_a_record_the_end_of_train_log_is_shown_unless_it_is_on_screen(tmp_path, verbose, shown):
    failure = workers_failed(tmp_path, LaunchResult(-9, None, output_end=TORCHRUN_END), verbose=verbose)
    assert failure.exit_code == -9 and shown in failure.message and str(tmp_path / "train.log") in failure.message


def test_a_crash_while_planning_shows_its_end_and_keeps_train_log_where_the_message_points(tmp_path, assets):
    """A genuine bug (here: a user's override module that raises on import) is not a config
    mistake: exit 1, its last frames, and the whole traceback in the train.log it names; nothing
    of the failed rank is left outside the run dir."""
    (tmp_path / "broken_kernel.py").write_text(
        "import pathlib, tempfile\n"
        "pathlib.Path(__file__).with_name('rank_temp.txt').write_text(tempfile.gettempdir())\n"
        'raise RuntimeError("this kernel module is broken")\n'
    )
    run_dir, temp = tmp_path / "run", tmp_path / "temp"
    temp.mkdir()
    result = launch(run_dir, "kernels.overrides=[broken_kernel.factory]", timeout=600,
                    env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "TMPDIR": str(temp)})  # fmt: skip
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert lines[0] == "[qwen3-neuron] the job failed: rank 0 raised RuntimeError: this kernel module is broken"
    assert lines[-1] == f"[qwen3-neuron] the whole traceback, and torchrun's report: {run_dir / 'train.log'}"
    assert "Traceback" not in result.stdout + result.stderr
    log = (run_dir / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and "ChildFailedError" in log
    # nothing of the failed ranks left in the temp dir (outside the run dir), which is the ranks' own too (a
    # compiled run's caches there outlive the run)
    assert list(temp.iterdir()) == [] and (tmp_path / "rank_temp.txt").read_text() == str(temp)
