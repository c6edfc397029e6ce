"""Check, over a whole corpus, that tokenizing by cached pieces gives the plain Rust backend's ids.

    python scripts/check_pieces.py --corpus site-packages,python-stdlib,sharegpt-pypi --model gemma3-270m

Two worker processes, each encoding every batch both ways; prints one JSON line (documents, tokens, seconds of
each path, mismatches) and exits 1 on any mismatch. The build itself only checks a sample set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from specdec_cli.io.corpora import iter_documents
from specdec_cli.datastore.tokenizing.tokenize import Encoder, _tasks, tokenizer_info

_PAIR = None


def _init(info: dict) -> None:
    global _PAIR
    _PAIR = (Encoder(info["backend"], info["replace"]), Encoder(info["backend"], info["replace"], info["pieces"]))


def _check(texts: list[str]) -> tuple[int, int, float, float, list[int]]:
    plain, pieces = _PAIR
    t0 = time.perf_counter()
    a = plain.encode(texts)
    t1 = time.perf_counter()
    b = pieces.encode(texts)
    t2 = time.perf_counter()
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if x.tolist() != y.tolist()]
    return len(texts), sum(x.size for x in a), t1 - t0, t2 - t1, [len(texts[i]) for i in bad]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    info = tokenizer_info(args.model)
    if info["backend"] is None or info["pieces"] is None:
        print(json.dumps({"model": args.model, "pieces": None}))
        return 0
    docs = tokens = mismatches = 0
    plain_s = pieces_s = 0.0
    with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(info,)) as pool:
        for n, t, a, b, bad in pool.map(_check, _tasks(iter_documents(args.corpus, None)), chunksize=1):
            docs, tokens, plain_s, pieces_s, mismatches = docs + n, tokens + t, plain_s + a, pieces_s + b, mismatches + len(bad)
    print(json.dumps({"model": args.model, "kind": info["pieces"]["kind"], "documents": docs, "tokens": tokens,
                      "plain_cpu_s": round(plain_s, 1), "pieces_cpu_s": round(pieces_s, 1),
                      "mismatched_documents": mismatches}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
