"""The real-SGLang backend: the patched worker entry, PD-pair command lines, the pair CLI, and
the flags of SGLang's CPU path (`cpu.py`). Processes are started through launch.procs.

`python -m sglang_ext.launch_server --backend sglang ...` runs one worker (`worker.py`);
`python -m sglang_ext.sglang_backend ...` starts a prefill + decode pair and its sglang-router.
"""
