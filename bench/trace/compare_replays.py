"""Where a CUDA-graph step's time goes, from kernel_trace.cpp's CSV files, and how two runs differ.

    python3 bench/trace/compare_replays.py one=/tmp/t1/trace-123.csv rank0=/tmp/t2/trace-456.csv ...

The first file is the baseline. For each file: the median over the last 15 replays of the most-replayed
graph of its span, the time any operation ran, the idle gaps of the stream that carries most of the
graph (backward's, on a training step), and the time from the end of the last kernel that is not an update
(AdamW, gradient averaging) to the end of the replay. Then, per kernel name, the time per replay in each
run beside the baseline's, largest differences first.
"""
import collections
import re
import statistics
import sys

REPLAYS = 15
UPDATE = re.compile(r'adam|average', re.I)


def load(path):
    """(kind, stream, start_ns, end_ns, blocks_or_bytes, graph, node, name) per line."""
    records = []
    for line in open(path):
        fields = line.rstrip('\n').split(',', 8)
        if len(fields) < 9:
            continue
        kind, _device, stream, start, end, size, graph, node, name = fields
        if kind.startswith('C'):
            name = f'memcpy kind {kind[1:]}'
        records.append((kind[0], int(stream), int(start), int(end), int(size), int(graph), int(node), name))
    return records


def replays(records):
    """The last complete replays of the graph with the most records: the k-th run of each node is replay k."""
    counts = collections.Counter(r[5] for r in records if r[5])
    if not counts:
        return []
    graph = counts.most_common(1)[0][0]
    seen = collections.Counter()
    by_replay = collections.defaultdict(list)
    for r in sorted((r for r in records if r[5] == graph), key=lambda r: r[2]):
        by_replay[seen[r[6]]].append(r)
        seen[r[6]] += 1
    size = max(len(v) for v in by_replay.values())
    complete = [sorted(by_replay[k], key=lambda r: r[2]) for k in sorted(by_replay) if len(by_replay[k]) == size]
    return complete[-REPLAYS:]


def covered(intervals):
    """Total length of the union of (start, end) intervals."""
    total, current = 0, None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0)


def short(name):
    return re.sub(r'[(<].*', '', name)[-60:]


def summarize(label, path):
    reps = replays(load(path))
    print(f'== {label}: {len(reps)} replays of {path}')
    if not reps:
        return {}
    spans, busy, idle, tails = [], [], [], []
    per_name = collections.defaultdict(list)
    for rep in reps:
        t0, t1 = rep[0][2], max(r[3] for r in rep)
        spans.append(t1 - t0)
        busy.append(covered([(r[2], r[3]) for r in rep]))
        main = collections.Counter(r[1] for r in rep).most_common(1)[0][0]
        ops = [r for r in rep if r[1] == main]
        idle.append(sum(max(0, b[2] - a[3]) for a, b in zip(ops, ops[1:]) if b[2] - a[3] > 3000))
        last = max(r[3] for r in rep if r[0] == 'K' and not UPDATE.search(r[7]))
        tails.append(t1 - last)
        totals = collections.Counter()
        calls = collections.Counter()
        for r in rep:
            totals[short(r[7])] += r[3] - r[2]
            calls[short(r[7])] += 1
        for name, ns in totals.items():
            per_name[name].append((ns, calls[name]))
    us = lambda values: statistics.median(values) / 1e3
    print(f'   span {us(spans):.1f} us, something running {us(busy):.1f} us, main stream idle in gaps over 3 us '
          f'{us(idle):.1f} us, after the last non-update kernel {us(tails):.1f} us')
    return {name: (us([v[0] for v in values]), values[0][1]) for name, values in per_name.items()}


def main():
    runs = [arg.split('=', 1) for arg in sys.argv[1:]]
    if not runs or any(len(r) != 2 for r in runs):
        sys.exit(__doc__)
    tables = [(label, summarize(label, path)) for label, path in runs]
    base_label, base = tables[0]
    for label, table in tables[1:]:
        names = sorted(set(base) | set(table),
                       key=lambda n: -abs(table.get(n, (0, 0))[0] - base.get(n, (0, 0))[0]))
        print(f'-- {label} against {base_label}: us per replay (calls), largest differences first')
        for name in names[:25]:
            a, b = base.get(name, (0, 0)), table.get(name, (0, 0))
            print(f'   {b[0] - a[0]:+9.1f}  {a[0]:9.1f} ({a[1]:4d})  {b[0]:9.1f} ({b[1]:4d})  {name}')


if __name__ == '__main__':
    main()
