"""Deployment planning: what each worker needs (weights, KV pool) and where it runs. `launch/`
only executes a plan; later layers (profiles, a simulator, an ILP over replicas) build on the
data types in planning.types."""
