"""The prompt templates: the instruction a problem is wrapped in, as one chat user turn.

- `parallel` asks for step-by-step reasoning with parallel blocks where they help (docs/paper.md, the cold start):
  a block is `<Parallel>`, two or more independent `<Path>`s, `</Parallel>`, then straight away a
  `<Summary>` that merges them; blocks may repeat; the answer goes on a last `Final Answer:` line.
- `plain` asks for the same reasoning and the same last line, with no tags (the sequential baseline).
- `none` is the problem alone, for models trained on a task's own format (the demo's arithmetic).

SFT, RL and evaluation all build their prompts here, so the model sees one prompt everywhere.
"""

from __future__ import annotations

from ..tags.language import PARALLEL_CLOSE, PARALLEL_OPEN, PATH_CLOSE, PATH_OPEN, SUMMARY_CLOSE, SUMMARY_OPEN

FINAL_ANSWER = "Final Answer:"
PROMPT_MARKER = "\n\nProblem:\n"  # between the instruction and the problem

_ENDING = f"When you are done, write your result on a last line of its own, in the form\n{FINAL_ANSWER} <your answer>"

_PARALLEL = f"""Work through the problem below step by step.

Some steps are worth looking at from more than one independent angle: trying two different methods, \
checking a result another way, or splitting into separate cases. At such a step, think in parallel:
1. Open a block with {PARALLEL_OPEN}.
2. Write two or more paths, each one between {PATH_OPEN} and {PATH_CLOSE}. Every path must stand \
on its own: it must not mention, use or wait for any other path.
3. Close the block with {PARALLEL_CLOSE} and right after it bring together what the paths found, \
between {SUMMARY_OPEN} and {SUMMARY_CLOSE}.
Then carry on with your reasoning. Open as many blocks as the problem calls for, and none where a \
single line of thought is enough.

{_ENDING}"""

_PLAIN = f"""Work through the problem below step by step.

{_ENDING}"""

TEMPLATES = {"parallel": _PARALLEL, "plain": _PLAIN, "none": ""}
DEFAULT_TEMPLATE = "parallel"  # the one default: `PromptArguments.prompt_template` and every signature take it


def check_template(template: str) -> None:
    """Raise a ValueError naming the known templates if `template` is not one of them."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; known templates: {', '.join(TEMPLATES)}")


def build_prompt(problem: str, template: str = DEFAULT_TEMPLATE) -> list[dict]:
    """One chat user turn: the template's instruction, PROMPT_MARKER, then the problem (the problem alone for
    `none`)."""
    check_template(template)
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"the problem must be a non-empty string, got {problem!r}")
    instruction = TEMPLATES[template]
    return [
        {
            "role": "user",
            "content": f"{instruction}{PROMPT_MARKER}{problem.strip()}" if instruction else problem.strip(),
        }
    ]


def prompt_ids(tokenizer, prompt: list) -> list:
    """The token ids of a chat prompt, with the generation prompt (as TRL templates it)."""
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))


# A chat template for base models that have none (`scripts/add_special_tokens.py --chat_template plain`): the user
# turn, a blank line, then the answer and the end-of-sequence token. `{% generation %}` marks the answer for TRL's
# assistant-only loss; the BOS token, when the tokenizer has one, opens the text as it does in pretraining.
PLAIN_CHAT_TEMPLATE = (
    "{%- if bos_token %}{{- bos_token }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + eos_token }}{% endgeneration %}"
    "{%- else %}"
    "{{- message['content'] + '\n\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
