"""`moa-pd train-scorer`: learn each pool candidate's chance of a correct answer from the
query's embedding, out of setting-#5 runs, and judge it on held-out questions (routing/train.py).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from routing.outcomes import Outcomes, OutcomesError, read_outcomes
from routing.scorer_file import Scorer
from routing.train import TrainOptions, check_both_classes, train_scorer

log = logging.getLogger(__name__)

Embed = Callable[[Sequence[str]], np.ndarray]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results",
        nargs="+",
        required=True,
        metavar="RUN",
        help="run folders (or their results.jsonl) holding setting-#5 rows",
    )
    p.add_argument("--out", required=True, help="the scorer file to write (scorer.json)")
    p.add_argument(
        "--heldout",
        type=float,
        default=0.25,
        help="share of questions held out for the evaluation (default 0.25)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the bootstrap")
    p.add_argument(
        "--questions",
        action="append",
        default=[],
        metavar="JSONL",
        help="the questions of a run on a dataset given by path (matched by file name); "
        "vendored datasets are found by name",
    )
    p.add_argument(
        "--skip-candidate",
        action="append",
        default=[],
        metavar="ID",
        help="leave this candidate out (e.g. one that never answers right), repeatable",
    )
    p.add_argument(
        "--embedding-model",
        default="all-minilm-l6-v2",
        help="the query embedder; the router must use the same (default the embedded MiniLM)",
    )


def question_texts(outcomes: Outcomes, extra_files: Sequence[str]) -> list[str]:
    """The prompt each question went out with (experiments.prompts), in `outcomes.keys` order."""
    from experiments.datasets import DATASETS, load_questions
    from experiments.prompts import build_question_prompt

    by_stem = {Path(f).stem: f for f in extra_files}
    texts: dict[tuple[str, str], str] = {}
    for dataset in sorted({d for d, _ in outcomes.keys}):
        source = by_stem.get(dataset, dataset if dataset in DATASETS else None)
        if source is None:
            raise OutcomesError(
                f"the runs hold rows of dataset '{dataset}', which is not vendored; give its "
                f"questions with --questions PATH/{dataset}.jsonl"
            )
        for q in load_questions(source):
            texts[(dataset, q.id)] = build_question_prompt(q)
    missing = [k for k in outcomes.keys if k not in texts]
    if missing:
        d, s = missing[0]
        raise OutcomesError(
            f"{len(missing)} questions of the runs are not in their dataset (first: '{s}' of "
            f"'{d}'); give the file the run used with --questions"
        )
    return [texts[k] for k in outcomes.keys]


def minilm(model: str) -> Embed:
    from router.embedder import Embedder
    from routing.query_embedding import query_embeddings

    embedder = Embedder(model)
    return lambda texts: query_embeddings(embedder, texts)


def heldout_table(scorer: Scorer) -> Table:
    table = Table(title="held-out questions: scorer vs the training prior")
    for col in ("candidate", "n", "correct", "prior", "AUC [95% CI]", "Brier", "Brier prior"):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for cid, m in scorer.heldout.items():
        auc = f"{m['auc']:.3f} [{m['auc_lo']:.2f}, {m['auc_hi']:.2f}]" if "auc" in m else "n/a"
        table.add_row(
            cid,
            str(int(m["n"])),
            str(int(m["positives"])),
            f"{m['prior']:.3f}",
            auc,
            f"{m['brier']:.4f}",
            f"{m['brier_prior']:.4f}",
        )
    return table


def train(args: argparse.Namespace, embed: Embed | None = None) -> Scorer:
    outcomes = read_outcomes(args.results, frozenset(args.skip_candidate))
    check_both_classes(outcomes)
    texts = question_texts(outcomes, args.questions)
    t0 = time.perf_counter()
    x = (embed or minilm(args.embedding_model))(texts)
    log.info("embedded %d questions in %.1f s", len(texts), time.perf_counter() - t0)
    opts = TrainOptions(args.heldout, args.seed, args.embedding_model)
    return train_scorer(outcomes, x, opts)


def main(args: argparse.Namespace, embed: Embed | None = None) -> int:
    console = Console(stderr=True, soft_wrap=True)
    try:
        scorer = train(args, embed)
    except (ValueError, RuntimeError) as e:  # OutcomesError, bad dataset or --heldout, embedder
        console.print(f"[red]error:[/red] {e}")
        return 2
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        scorer.dump(args.out)
    except OSError as e:
        console.print(f"[red]error:[/red] --out {args.out}: cannot write it ({e.strerror})")
        return 2
    Console(width=max(Console().width, 100), soft_wrap=True).print(heldout_table(scorer))
    r = scorer.heldout_router
    if r.get("questions"):
        console.print(
            f"as a router, top-1 on {int(r['questions'])} held-out questions every candidate "
            f"answered: hit rate {r['top1_hit_rate']:.3f}, regret {r['regret']:.3f} (always "
            f"'{r['prior_candidate']}': {r['prior_hit_rate']:.3f}, {r['prior_regret']:.3f}); "
            f"{int(r['distinct_picks'])} distinct picks"
        )
    n = scorer.trained_on["questions"]
    console.print(
        f"wrote {args.out}: {len(scorer.candidates)} candidates, weights refit on all {n} "
        "questions (the table is the fit without the held-out ones)"
    )
    return 0
