"""Deployment planning: what each worker needs (weights, KV pool) and where it runs. `launch/`
executes a plan and imports planning; planning never imports launch. `moa-pd plan` is
planning.command, its tables planning.tables. Two steps:

- memory placement (planning.placement): the configs' workers, their demands (model_memory,
  pool_need), packed onto the GPUs here or assumed (gpus, pack); what `moa-pd up` starts from
  configs;
- its general case, with a profile: placement and replication by MILP (cost_model, devices, ilp,
  baselines, ilp_plan), written as plan.json (plan_file, planned_workers) for `moa-pd up --plan`.
"""
