"""The names of a training directory's files (see :mod:`geospec.engine.checkpoint`).

Torch-free, so that the report and the run directory can read a finished run's records without
loading the engine.
"""

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
PREVIOUS_MODEL_FILE = "model.prev.safetensors"
STATE_FILE = "trainer_state.pt"
RESULT_FILE = "result.json"
"""Written last by the trainer: its presence means the run is finished."""
METRICS_FILE = "metrics.jsonl"

#: Every file the trainer writes into a training directory.
TRAINER_FILES = (
    CONFIG_FILE,
    MODEL_FILE,
    PREVIOUS_MODEL_FILE,
    STATE_FILE,
    RESULT_FILE,
    METRICS_FILE,
)
