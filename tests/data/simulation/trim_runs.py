"""Rebuild this folder's runs from full `moa-pd run` folders, trimmed to what the simulator reads:
per row its timing, per agent its times and token counts (output ids become zeros: only their
count is read). `python tests/data/simulation/trim_runs.py SRC_DIR DST_DIR RUN...`"""

import json
import sys
from pathlib import Path

ROW_KEYS = ("sample_id", "dataset", "setting", "e2e_s", "started_at", "session_started_at")
ROW_KEYS += ("config", "mode", "error")
AGENT_KEYS = ("model", "layer", "start_s", "final_request_s", "first_token_s", "end_s")
AGENT_KEYS += ("prompt_tokens", "cached_tokens", "slot_order", "killed", "warmups")


def trim(row: dict) -> dict:
    out = {k: row[k] for k in ROW_KEYS if k in row}
    out["agents"] = {
        a: {**{k: t[k] for k in AGENT_KEYS if k in t}, "output_ids": [0] * len(t["output_ids"])}
        for a, t in row["agents"].items()
    }
    return out


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    for run in sys.argv[3:]:
        (dst / run).mkdir(parents=True, exist_ok=True)
        lines = (src / run / "results.jsonl").read_text().splitlines()
        rows = [json.dumps(trim(json.loads(x)), separators=(",", ":")) for x in lines if x.strip()]
        (dst / run / "results.jsonl").write_text("\n".join(rows) + "\n")
