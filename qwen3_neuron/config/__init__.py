"""The one job, on both sides of torchrun, without torchtitan: `job` (the composed config and the
framework's settings parsed from it once, `settings`), `fields` (how a YAML value is checked onto
a config dataclass), `trainer_keys` (torchtitan's keys, known to the launcher before any
torchtitan import) and `torchrun` (the device, ranks and torchrun command of one node). Imports
models/ and finetune/ names; never launch/, worker/ or report/.
"""
