"""The evolution loop (docs/concepts.md, section 3), one module a job.

- ``lifecycle``: create, pause, resume and cancel a run.
- ``steps``: the database-driven state machine; ``run_advance`` does one step (lock, load, call, write).
- ``propose``: filling a round's proposal slots and what the proposer may see.
- ``enqueue``: the Celery messages a step sends after its transaction commits (through ``evolution.dispatch``).
- ``certify``: certification as the loop sees it: certify, then pause the run on infrastructure errors, advance it.
- ``review``: a reviewer's decision, then the evaluation of what was approved.
- ``measure``: the only place S, cost and valid rate are computed (pure).
- ``decision``: the round's decision, from measured candidates to a typed ``RoundDecision`` (pure).
- ``regularization``: the math of docs/concepts.md, section 4, that the decision uses (pure).
- ``state``: ``RunState``, the only code that knows the keys of ``Run.state``.
- ``inline``: a run driven to its end in this process (no worker), with the functions the tasks call.
- ``compare``: recipes compared across proposer seeds, each run driven by ``inline``.

This package's ``__init__`` imports nothing: the pure modules can be imported without the ORM ones.
"""
