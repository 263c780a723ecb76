"""Idle CPU during a make test run, from a per-test timeline and /proc/stat samples (see README.md here).

    python docs/make-test-2026-12-06b-avx2/timeline_idle.py TIMELINE.tsv PROC_STAT.txt

TIMELINE.tsv: one line per test, `worker<TAB>start<TAB>end<TAB>nodeid` (epoch seconds). PROC_STAT.txt: lines
`epoch cpu user nice system idle iowait irq softirq steal ...` (the first line of /proc/stat, once a second).
Prints each worker's first start and last end, the idle core-seconds while tests ran, and the idle core-seconds
shared out among the test files running at the time.
"""

import collections
import sys


def main(timeline_path: str, stat_path: str) -> None:
    samples = []
    for line in open(stat_path, encoding="utf-8"):
        fields = line.split()
        values = list(map(int, fields[2:]))
        idle = values[3] + values[4]
        samples.append((float(fields[0]), sum(values[:8]) - idle, sum(values[:8])))
    intervals = [(a[0], b[0], (b[1] - a[1]) / max(1, b[2] - a[2])) for a, b in zip(samples, samples[1:])]
    tests = []
    for line in open(timeline_path, encoding="utf-8"):
        worker, start, end, nodeid = line.rstrip("\n").split("\t")
        tests.append((worker, float(start), float(end), nodeid))
    origin = min(start for _, start, _, _ in tests)
    last = max(end for _, _, end, _ in tests)
    for worker in sorted({w for w, *_ in tests}):
        spans = [(s, e) for w, s, e, _ in tests if w == worker]
        print(
            worker,
            "first start",
            round(min(spans)[0] - origin, 1),
            "last end",
            round(max(e for _, e in spans) - origin, 1),
        )
    by_file = collections.Counter()
    total = 0.0
    for start, end, busy in intervals:
        if not origin <= start <= last:
            continue
        idle = (1 - busy) * 2 * (end - start)  # two cores
        total += idle
        running = [n for _, s, e, n in tests if s < end and e > start]
        for nodeid in running:
            by_file[nodeid.split("::")[0]] += idle / len(running)
    print("idle core-seconds while tests ran:", round(total, 1))
    for name, seconds in by_file.most_common(10):
        print(f"{seconds:6.1f} {name}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
