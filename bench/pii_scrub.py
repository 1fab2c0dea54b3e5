"""What PII scrubbing costs: microseconds to scrub a 64 KiB body, by kind of content.

Three bodies of 64 KiB, built deterministically: an LLM chat request of plain prose with a few
numbers and dates (``clean``: nothing to replace, the common case), the same prose with one of
every kind of personal data and secret about every 600 bytes (``dense``), and a JSON document of
numbers, timestamps, UUIDs and hex ids (``ids``: digit-heavy, nothing to replace). Each is scrubbed
``--reps`` times by the agent's scrubber with every kind on; the figures are the median and the
fastest time per body (the fastest says what the code costs on a machine others load too), and
the median per 4 KiB, the default ``max_content_chars``. The scrubbed
dense body is checked for every value of the corpus, so a run that missed them cannot pass.

Usage: ``python bench/pii_scrub.py [--reps N] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

from otel_ebpf.pii import PiiScrubber

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from results import write_result
from tests.pii_corpus import CORPUS, secret_part

SIZE = 64 * 1024
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "there",
    "one",
    "all",
    "we",
    "their",
    "can",
    "has",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "model",
    "answer",
    "tokens",
    "summary",
    "please",
    "explain",
]


def _prose(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    date = f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
    return f"{text}. Order {rng.randint(1, 99999)} costs {rng.random() * 100:.2f} on {date}."


def bodies() -> dict[str, str]:
    rng = random.Random(16)
    messages, pii = [], [value for values in CORPUS.values() for value in values]
    dense = []
    while len(json.dumps(messages)) < SIZE:
        messages.append({"role": "user", "content": _prose(rng, 80)})
        dense.append(
            {"role": "user", "content": _prose(rng, 40) + " " + pii[len(dense) % len(pii)] + " " + _prose(rng, 30)}
        )
    ids = {"items": []}
    while len(json.dumps(ids)) < SIZE:
        ids["items"].append(
            {
                "id": str(uuid.UUID(int=rng.getrandbits(128))),
                "trace": f"{rng.getrandbits(128):032x}",
                "ts": 1_700_000_000_000_000_000 + rng.getrandbits(40),
                "n": rng.randint(0, 10**9),
                "x": rng.random(),
                "at": f"2024-05-{rng.randint(10, 28)}T12:{rng.randint(10, 59)}:00Z",
            }
        )
    return {
        name: json.dumps({"model": "m", "messages": value} if name != "ids" else value)[:SIZE]
        for name, value in (("clean", messages), ("dense", dense), ("ids", ids))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a few repetitions")
    args = parser.parse_args()
    reps = 10 if args.quick else args.reps
    figures = {}
    for name, body in bodies().items():
        scrubber = PiiScrubber()
        out = scrubber.scrub(body)
        replaced = sum(scrubber.counts.values())
        if name == "dense":
            missed = [v for kind, values in CORPUS.items() for v in values if secret_part(kind, v) in out]
            assert not missed, missed
        else:
            assert out == body, f"{name}: ordinary text changed"
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            scrubber.scrub(body)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        figures[name] = {
            "bytes": len(body),
            "replaced": replaced,
            "median_us": round(median * 1e6),
            "min_us": round(min(times) * 1e6),
            "MB_per_s": round(len(body) / median / 1e6, 1),
            "us_per_4KiB": round(median * 1e6 / 16),
        }
        print(
            f"{name:6} {len(body)} B, {replaced} replaced: {median * 1e6:8.0f} µs median, "
            f"{min(times) * 1e6:8.0f} µs fastest "
            f"({len(body) / median / 1e6:.1f} MB/s)",
            flush=True,
        )
    write_result("pii_scrub", None, figures)


if __name__ == "__main__":
    main()
