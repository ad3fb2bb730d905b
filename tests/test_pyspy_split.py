"""benchmarks/pyspy_split.py: a py-spy raw profile of the shell router, split by what it does."""

from __future__ import annotations

from benchmarks.pyspy_split import split


def test_each_sample_goes_to_its_innermost_named_part():
    loop = "run (asyncio/base_events.py:600);_run_once (asyncio/base_events.py:1900)"
    task = "_run (asyncio/events.py:80)"
    warm = f"{task};warm (router/incremental.py:120)"
    lines = [
        f"{loop};select (selectors.py:468) 5",
        f"{warm};encode (router/tokenizers.py:40) 3",
        f"{warm} 2",
        f"{task};read (aiohttp/streams.py:300);feed (router/stream_reader.py:50) 4",
        f"{task};dumps (json/__init__.py:231) 1",
        f"{task} 1",
        "main (router/__main__.py:10) 1",
        "",
    ]
    total, parts = split(lines)
    assert total == 17
    assert parts == {
        "event-loop polling": 5,
        "tokenizing": 3,
        "splicing, incremental prefill": 2,
        "stream parsing": 4,
        "HTTP (aiohttp, JSON)": 1,
        "asyncio machinery": 1,
        "other": 1,
    }
