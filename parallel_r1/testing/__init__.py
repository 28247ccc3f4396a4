"""What tests, drills and the demo use and the method does not: a tiny Qwen3-style model and tokenizer built in
seconds (`tiny`), the adversarial and fuzz drills (`drills`), the demo's task and paper table (`demo`), and made-up
completion records by the thousand for the rollout viewer (`completions`)."""
