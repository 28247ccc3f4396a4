"""The private members of TRL's and transformers' trainers that ours rely on, listed in one place.

A private member can move in any release. An override of a method the parent no longer calls is dead code that
fails silently, and an attribute read that vanished fails mid-run. `tests/test_private_members.py` checks every
entry against the installed TRL and transformers, so an upgrade that moves one fails by name, at once.

Each entry: (class, member, kind, what ours does with it). Kinds: `overridden` (a method our subclass replaces
and calls through `super()`), `called` (a method ours calls), `set in __init__` (an instance attribute the
parent's constructor sets and ours reads), `class attribute` (read on the class).
"""

PRIVATE_MEMBERS = (
    ("GRPOTrainer", "_generate_and_score_completions", "overridden", "logs the block metrics and the sampler gap"),
    ("GRPOTrainer", "_get_per_token_logps_and_entropies", "overridden", "the structured training forward"),
    ("GRPOTrainer", "_tokenize_prompts", "called", "the prompt ids the engine decodes from"),
    ("GRPOTrainer", "_tokenizer", "set in __init__", "the tag vocabulary and the pad id"),
    ("GRPOTrainer", "_dist", "set in __init__", "gathers ZeRO-3 parameters for generation"),
    ("GRPOTrainer", "_metrics", "set in __init__", "where logged metrics are appended"),
    ("GRPOTrainer", "_name", "class attribute", "the model card names the stage"),
    ("GRPOTrainer", "_tag_names", "class attribute", "the model card's tags"),
    ("SFTTrainer", "_name", "class attribute", "the model card names the stage"),
    ("SFTTrainer", "_tag_names", "class attribute", "the model card's tags"),
    ("Trainer", "_save_rng_state", "overridden", "checkpoints carry the engine's random stream"),
    ("Trainer", "_load_rng_state", "overridden", "a resumed run samples as the unbroken one"),
)
