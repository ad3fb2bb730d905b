"""A discrete-event simulator (simpy) of a MoA deployment under the project's own serving
policies: `predict.predict_plan` for the planner, `moa-pd simulate` and `python -m
simulation.validate` (predicted vs measured runs) for people.

Why not Vidur (MIT, `vidur` on PyPI): its runtime estimation is random forests over per-operator
CUDA profiles of one model per replica (attention, MLP, all-reduce...), which do not exist for
this CPU reference engine and are not what `moa-pd profile` measures; its replica schedulers
(vLLM, Orca, Sarathi) serve single-model requests, with no agent graph, no prefill/decode pair
with warm-ups and a gate, no prefix caching across agents, no workers sharing cores; and its
event loop is hand-written, where this one builds on simpy. What it shares with Vidur is the cost
decomposition (a batch's time from its new tokens and the KV context they attend to, fitted from
profiled points: profiling/profile_file.py) and the validation against measured medians.
"""
