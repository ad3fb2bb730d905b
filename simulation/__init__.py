"""A discrete-event simulator (simpy) of a MoA deployment under the project's own serving
policies: `predict.predict_plan` for the planner, `moa-pd simulate` and `python -m
simulation.validate` (predicted vs measured runs) for people."""
