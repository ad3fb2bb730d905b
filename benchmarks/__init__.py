"""Benchmark scripts, each run as `python -m benchmarks.NAME` (docs/benchmarks.md), and the
helpers only they use. They use the product (experiments, router, launch, ...); the product never
imports them."""
