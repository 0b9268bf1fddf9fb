"""Training data beyond torchtitan's registered data sets: the packed kinds (job/settings.py's PACKED_KINDS).

`source` (a source's keys: the `data` settings' and each loader source's; no heavy import),
`row_loading` (local files, the HF cache; JSON rows as the file holds them, with their file and
line; per-rank shards, the validation carve), `chat_rows` (rows as
data sets ship them -> conversations -> tokens with the assistant turns marked), `preference`
(a pair row -> its chosen and rejected conversations), `prompts` (a prompt row -> the tokens a
GRPO step generates from, and the columns its rewards read), `packing` (documents -> seq_len
samples with per-document positions: best fit, greedy, none, or text flowing on), `dataset` (one
source, checkpointable), `loader` (torchtitan's dataloader component), `data_checks` (the plan's
first-rows checks), `preview` (run.show_data). Used by both sides; imports torchtitan and
datasets (`source` excepted), never launch/, worker/ or report/. (tests/test_package_layout.py
holds this list to the package's modules.)
"""
