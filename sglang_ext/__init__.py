"""sglang_ext."""
