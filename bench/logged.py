#!/usr/bin/env python3
"""Step figures read out of dptrain's outputs, for the GPU scripts and bench/sweep.py.

    python3 bench/logged.py median RUN/metrics.jsonl step_ms   # dpt-train: the median of a logged field
    python3 bench/logged.py bench LOG                          # dpt-bench train: its median step (ms)

Each prints the figure, or NA when the file holds none.
"""
import json
import statistics
import sys


def logged_median(path, field):
    """The median of `field` over dpt-train's training records in metrics.jsonl, the first logged interval
    left out (it holds the warm-up and the graph capture); None when there is none."""
    try:
        with open(path) as f:
            values = [r[field] for r in map(json.loads, f) if r.get("type") == "train" and r.get(field)][1:]
    except (OSError, ValueError):
        return None
    return statistics.median(values) if values else None


def bench_step_ms(path):
    """The step_ms of the first JSON line `dpt-bench train` printed into `path` (under dpt-run, rank 0's
    "[0]: " prefix before it); None when there is none."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                start = line.find("{")
                if start < 0:
                    continue
                try:
                    return json.loads(line[start:])["step_ms"]
                except (ValueError, KeyError):
                    continue
    except OSError:
        pass
    return None


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "median":
        value = logged_median(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "bench":
        value = bench_step_ms(sys.argv[2])
    else:
        sys.exit(__doc__)
    print("NA" if value is None else f"{value:.3f}")


if __name__ == "__main__":
    main()
