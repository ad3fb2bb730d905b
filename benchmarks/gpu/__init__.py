"""The GPU benchmark of issue 19, prepared for a lent GPU machine (run_gpu_bench.sh)."""
