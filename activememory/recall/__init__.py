"""The recall runtime: one `mem.recall(turn)` (docs/design.md §4).

- `coordinator`: `Recaller`: preflight, cache and breaker, submit the run and wait for its report.
- `budget`: `RecallBudget`: the preflight, work and finalize deadlines of one run.
- `models`: which recall model answers (the model chain) and the models built for it.
- `subagent_input`: what the sub-agent sees: query text, search query, prompts, tool list.
- `tools`: `RecallTools`, `RecallModel` and the per-run tool wiring.
- `memory_core`: the notes index and the memory_search / memory_get tools.
- `verdict`: what a run's report means (evidence gate, NONE, timeout_partial).
- `local_model`, `openai_model`: the built-in recall models.
- `cache`, `breaker`: the recall cache and the circuit breaker.

The sub-agent itself runs in the supervisor's recall pool (`actors/recall_pool.py`).
"""
