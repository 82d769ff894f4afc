"""Runs flow's benchmarks and its peers' (LangGraph, DBOS) on the same
workflow shapes, alternating them, and writes the table into
docs/benchmarks.md between its markers. Called by bench/run.

Every figure is the median of the repetitions, with their min-max; each
peer's figure also as a ratio to flow's. The disk's fsync time is measured
first: with full durability it bounds how often a commit can happen.
"""

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
PYTHON = sys.executable
QUICK = "--quick" in sys.argv
REPS = 1 if QUICK else 3

START = "<!-- side-by-side:start -->"
END = "<!-- side-by-side:end -->"


def run(command, **kwargs):
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def ours(benchmark):
    """flow's `runs` bench, one benchmark, its markdown row."""
    args = ["cargo", "bench", "-q", "-p", "flow-runtime", "--bench", "runs", "--"]
    if QUICK:
        args.append("--quick")
    row = [line for line in run(args + ["--only", benchmark]).splitlines() if line.startswith("|")]
    if not row:
        sys.exit(f"flow's bench {benchmark} printed no row")
    return row[0]


def end_to_end(store, flowds="1"):
    """B9, flowd end to end on `store` (sqlite or postgres): its markdown
    rows, one for each count of flowds sharing the store (PostgreSQL only)."""
    args = ["cargo", "bench", "-q", "-p", "flow-daemon", "--bench", "end_to_end", "--", "--store", store, "--flowds", flowds]
    if QUICK:
        args.append("--quick")
    rows = [line for line in run(args).splitlines() if line.startswith("| B9")]
    if len(rows) != len(flowds.split(",")):
        sys.exit(f"flowd's bench end_to_end printed {len(rows)} rows for {store} with {flowds} flowds")
    return rows


def checker():
    """B6, the checker's speed and peak memory: its bench's rows."""
    quick = ["--quick"] if QUICK else []
    return [
        "| B6 " + line[2:]
        for line in run(["cargo", "bench", "-q", "-p", "flow-compiler", "--bench", "check", "--", *quick]).splitlines()
        if line.startswith(("| one workflow", "| 1000 files", "| 50 files", "| peak memory"))
    ]


def ours_only(b6_rows):
    """flow's benchmarks that have no peer here, as their rows: B4 (a crash
    and restart), B5 (the Redis limit), B6 (the checker, `b6_rows`), B11
    (`flowc test` on 1,000 tests of the examples)."""
    quick = ["--quick"] if QUICK else []
    rows = [line for line in run(["cargo", "bench", "-q", "-p", "flow-runtime", "--bench", "runs", "--", *quick, "--only", "b4"]).splitlines() if line.startswith("| B4")]
    rows += [line for line in run(["cargo", "bench", "-q", "-p", "flow-runtime", "--bench", "limit", "--", *quick]).splitlines() if line.startswith("| B5")]
    rows += b6_rows
    rows += [
        line
        for line in run(["cargo", "bench", "-q", "-p", "flowc", "--bench", "test", "--", *quick]).splitlines()
        if line.startswith("| B11")
    ]
    return rows


def lsp():
    """flow-lsp's latency (B7) on the 5,000-line file: the p50 and p99 of
    each case its bench prints (diagnostics after an edit, completion),
    keyed by the case's name."""
    args = ["cargo", "bench", "-q", "-p", "flow-lsp", "--bench", "lsp", "--"]
    if QUICK:
        args.append("--quick")
    cases = {}
    for line in run(args).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # | case | samples | p50 | p99 | max | goal |
        if line.startswith("|") and len(cells) >= 4 and cells[2].endswith(" ms") and cells[3].endswith(" ms"):
            cases[cells[0]] = (float(cells[2][:-3]), float(cells[3][:-3]))
    if not any(case.startswith("diagnostics") for case in cases) or not any(
        case.startswith("completion") for case in cases
    ):
        sys.exit(f"flow-lsp's bench printed no diagnostics or completion row: {cases}")
    return cases


def peer(script, benchmark, size):
    output = run([PYTHON, os.path.join("bench", "peers", script), benchmark, str(size)])
    return json.loads(output.strip().splitlines()[-1])


def number(pattern, text):
    found = re.search(pattern, text)
    if not found:
        sys.exit(f"no `{pattern}` in: {text}")
    return float(found.group(1))


def fsync_us():
    """The disk's sync time, as SQLite pays it: 4 KiB written, synced with
    fdatasync (flow's SQLite and the peers' both call it; on a file that
    grows, as here, it flushes the size as fsync would)."""
    times = []
    with tempfile.NamedTemporaryFile(dir=ROOT) as handle:
        for _ in range(50 if QUICK else 500):
            handle.write(b"x" * 4096)
            handle.flush()
            started = time.perf_counter()
            os.fdatasync(handle.fileno())
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def cold_start_ms(command, runs):
    """`command(i)` for the i-th start: each may take fresh files."""
    times = []
    for i in range(runs):
        started = time.perf_counter()
        run(command(i))
        times.append((time.perf_counter() - started) * 1e3)
    return times


def goal(values, target, unit, at_most=False):
    """The median of `values` against a goal of at least (or at most) `target`."""
    sign = "≤" if at_most else "≥"
    return f"{statistics.median(values) / target:,.2f}× the goal of {sign} {target:,} {unit}"


def b6_rows(lines):
    """The checker's rows of the main table, from its bench's `lines`: the
    speed on the largest workflows and the peak memory of the largest,
    against the issue's goals (≥ 25 MB/s, ≤ 120 MB)."""
    rows = []
    speeds = [
        (int(number(r"one workflow, ([0-9]+) steps", line)), number(r"([0-9.]+) MB/s", line))
        for line in lines
        if line.startswith("| B6 one workflow")
    ]
    if speeds:
        shown = speeds[-2:]
        rows.append(
            "| B6 `flowc check` speed (parse, check, lower; one core), one workflow of "
            + " and ".join(f"{steps:,}" for steps, _ in shown)
            + " steps | "
            + "; ".join(f"{speed:,.1f} MB/s" for _, speed in shown)
            + " | – (the peers have no checker) | – | the goal of ≥ 25 MB/s: "
            + ", ".join(f"{speed / 25:,.2f}×" for _, speed in shown)
            + " |"
        )
    peaks = [line for line in lines if line.startswith("| B6 peak memory")]
    if peaks:
        line = peaks[-1]
        steps = int(number(r"one workflow of ([0-9]+) steps", line))
        resident = number(r"\| check ([0-9.]+) MB", line)
        rows.append(
            f"| B6 peak memory of `flowc check`, one workflow of {steps:,} steps "
            f"| {resident:,.1f} MB | – | – | {goal([resident], 120, 'MB', at_most=True)} |"
        )
    return rows


def spread(values):
    return statistics.median(values), min(values), max(values)


def cell(values, unit, digits=0):
    middle, low, high = spread(values)
    return f"{middle:,.{digits}f} {unit} ({low:,.{digits}f} – {high:,.{digits}f})"


def main():
    started = time.perf_counter()
    # Other work on the machine moves every figure: said with them.
    load_before = os.getloadavg()[0]
    fsync = fsync_us()
    print(f"fsync: {fsync:.0f} µs", file=sys.stderr)
    b1_runs = 50 if QUICK else 1000
    b2_items = 1000 if QUICK else 10000
    b3_runs = 100 if QUICK else 2000
    # DBOS's waiters are woken by a listener that polls the database once per
    # waiter per tick, so its B3 slows as parked runs grow: flow's B3seq count.
    dbos_b3_runs = 20 if QUICK else 300
    flow_b1, flow_b1_seq, langgraph_b1, dbos_b1 = [], [], [], []
    # B1's CPU time per durable step, every thread of the process, and the
    # last repetition's split by thread.
    flow_b1_cpu, b1_cpu_split = [], ""
    # B1's allocations per durable step (an untimed pass counting them):
    # steady where the machine's noise moves the CPU time.
    flow_b1_allocations = []
    flow_b2, langgraph_b2 = [], []
    flow_b3, flow_b3_seq, langgraph_b3, dbos_b3 = [], [], [], []
    # B9 with the in-process figures it is held against, in the same repetition.
    flow_b9, flow_b1pg, flow_b9pg = [], [], []
    # Scale-out: flowds sharing one PostgreSQL, by their count: steps/s,
    # steps per core-second (flowds, PostgreSQL and the load generator),
    # and flowd's and PostgreSQL's CPU per step.
    scale_counts = "1,2" if QUICK else "1,2,3"
    scale = {int(n): ([], [], [], []) for n in scale_counts.split(",")}
    # B7 once, first: its bench takes hundreds of samples of each case itself.
    flow_b7 = lsp()
    print("B7 done", file=sys.stderr)
    for rep in range(REPS):
        print(f"repetition {rep + 1} of {REPS}", file=sys.stderr)
        # Alternated: ours, then each peer, so that the machine's state
        # drifts over all of them alike.
        row = ours("b1")
        flow_b1.append(number(r"\| ([0-9.]+) steps/s", row))
        flow_b1_cpu.append(number(r"CPU per step ([0-9.]+) µs", row))
        b1_cpu_split = re.search(r"CPU per step [0-9.]+ µs \(([^)]*)\)", row).group(1)
        flow_b1_allocations.append(number(r"([0-9.]+) allocations per step", row))
        flow_b1_seq.append(number(r"\| ([0-9.]+) steps/s", ours("b1seq")))
        langgraph_b1.append(peer("langgraph_bench.py", "b1", b1_runs)["steps_per_second"])
        dbos_b1.append(peer("dbos_bench.py", "b1", b1_runs)["steps_per_second"])
        # The median of flow's five runs, not its best: LangGraph's is one run.
        flow_b2.append(number(r"\(median ([0-9.]+)\)", ours("b2")))
        langgraph_b2.append(peer("langgraph_bench.py", "b2", b2_items)["us_per_step"])
        row = ours("b3")
        parked_runs = number(r"park ([0-9]+) runs", row)
        # Rates, runs per second: the two sides park different counts. Two
        # decimals of a quick run can read 0.00 s: at least 5 ms.
        flow_b3.append(
            (
                parked_runs / max(number(r"park ([0-9.]+) s", row), 0.005),
                parked_runs / max(number(r"resume ([0-9.]+) s", row), 0.005),
            )
        )
        row = ours("b3seq")
        seq_runs = number(r"park ([0-9]+) runs", row)
        flow_b3_seq.append((number(r"([0-9.]+) parked/s", row), number(r"([0-9.]+) resumed/s", row)))
        answer = peer("langgraph_bench.py", "b3", b3_runs)
        langgraph_b3.append((b3_runs / answer["park_seconds"], b3_runs / answer["resume_seconds"]))
        answer = peer("dbos_bench.py", "b3", dbos_b3_runs)
        dbos_b3.append((dbos_b3_runs / answer["park_seconds"], dbos_b3_runs / answer["resume_seconds"]))
        row = end_to_end("sqlite")[0]
        b9_load = re.search(r"\| B9 \| ([0-9]+ runs x 10 steps started over HTTP by [0-9]+ clients)", row).group(1)
        flow_b9.append(number(r"\| ([0-9.]+) steps/s", row))
        flow_b1pg.append(number(r"\| ([0-9.]+) steps/s", ours("b1pg")))
        # The first row (one flowd) is B9 on PostgreSQL; the others add flowds.
        for row in end_to_end("postgres", scale_counts):
            flowds = int(number(r", ([0-9]+) flowds?(?: \|)", row))
            rate = number(r"\| ([0-9.]+) steps/s", row)
            cores = sum(
                number(pattern, row)
                for pattern in (r"cores busy: flowd ([0-9.]+)", r"load generator ([0-9.]+),", r"PostgreSQL ([0-9.]+);")
            )
            steps_per_second, per_core, flowd_cpu, postgres_cpu = scale[flowds]
            steps_per_second.append(rate)
            per_core.append(rate / cores)
            flowd_cpu.append(number(r"CPU per step: flowd ([0-9.]+) µs", row))
            postgres_cpu.append(number(r"PostgreSQL ([0-9.]+) µs", row))
        flow_b9pg.append(scale[1][0][-1])

    workdir = tempfile.mkdtemp()
    with open(os.path.join(workdir, "one.flow"), "w") as source:
        source.write(
            'recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }\n'
            "workflow one {\n  step s = r { q: \"x\" }\n}\n"
        )
    with open(os.path.join(workdir, "in.json"), "w") as handle:
        handle.write("{}")
    starts = 3 if QUICK else 10
    # A new store each time, as LangGraph's run gets a new database.
    flow_b8 = cold_start_ms(
        lambda i: [
            os.path.join(TARGET, "release", "flow"),
            "run",
            os.path.join(workdir, "one.flow"),
            "--input",
            os.path.join(workdir, "in.json"),
            "--db",
            os.path.join(workdir, f"b8-{i}.db"),
            "--json",
        ],
        starts,
    )
    import_b8 = cold_start_ms(lambda _: [PYTHON, "-c", "import langgraph.graph"], starts)
    langgraph_b8 = cold_start_ms(
        lambda _: [PYTHON, os.path.join("bench", "peers", "langgraph_bench.py"), "b8"], starts
    )

    def ratio(ours_values, theirs_values, higher_is_better=True):
        a, b = statistics.median(ours_values), statistics.median(theirs_values)
        return f"{(a / b if higher_is_better else b / a):,.1f}×"

    def b3_cell(name, values):
        return (
            f"{name} park {cell([p for p, _ in values], 'runs/s')}, "
            f"resume {cell([r for _, r in values], 'runs/s')}"
        )

    b3_peers = f"{b3_cell('LangGraph', langgraph_b3)}; {b3_cell('DBOS', dbos_b3)}"

    def b3_lead(ours_values):
        return "; ".join(
            f"{ratio([p for p, _ in ours_values], [p for p, _ in theirs])} {name} parking, "
            f"{ratio([r for _, r in ours_values], [r for _, r in theirs])} resuming"
            for name, theirs in (("LangGraph", langgraph_b3), ("DBOS", dbos_b3))
        )

    def b3_disk(ours_values):
        """Runs per fsync time: 1× would be one fsync per run parked (or resumed)."""

        def both(values):
            return (
                f"park {statistics.median([p for p, _ in values]) * fsync / 1e6:,.2f}×, "
                f"resume {statistics.median([r for _, r in values]) * fsync / 1e6:,.2f}×"
            )

        return f"{both(ours_values)} (LangGraph {both(langgraph_b3)}; DBOS {both(dbos_b3)})"

    def b7_cell():
        parts = []
        for case, (p50, p99) in flow_b7.items():
            if case.startswith("diagnostics"):
                parts.append(f"{case}: p99 {p99:.1f} ms")
            else:
                parts.append(f"{case}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        return "; ".join(parts)

    rows = [
        f"| B1 {b1_runs} runs × 10 steps at once (flow), full durability | {cell(flow_b1, 'steps/s')} "
        f"| LangGraph {cell(langgraph_b1, 'steps/s')}; DBOS {cell(dbos_b1, 'steps/s')} "
        f"| {ratio(flow_b1, langgraph_b1)} LangGraph, {ratio(flow_b1, dbos_b1)} DBOS "
        f"| {statistics.median(flow_b1) * fsync / 1e6:,.1f}× the rate of one fsync per step "
        f"(LangGraph {statistics.median(langgraph_b1) * fsync / 1e6:,.2f}×, DBOS {statistics.median(dbos_b1) * fsync / 1e6:,.2f}×) |",
        f"| B1 one run after another (as the peers run), full durability | {cell(flow_b1_seq, 'steps/s')} "
        f"| LangGraph {cell(langgraph_b1, 'steps/s')}; DBOS {cell(dbos_b1, 'steps/s')} "
        f"| {ratio(flow_b1_seq, langgraph_b1)} LangGraph, {ratio(flow_b1_seq, dbos_b1)} DBOS "
        f"| {statistics.median(flow_b1_seq) * fsync / 1e6:,.2f}× |",
        f"| CPU per durable step: B1 at once, every thread of flow's process | {cell(flow_b1_cpu, 'µs', 1)} "
        f"(last repetition by thread: {b1_cpu_split}); {cell(flow_b1_allocations, 'allocations', 1)} per step | – | – "
        f"| {goal(flow_b1_cpu, 11.5, 'µs', at_most=True)} (half of the 23 µs of 2026-11-30) |",
        f"| B2 one run, loop of {b2_items:,} items, in memory | {cell(flow_b2, 'µs/step', 2)} "
        f"| LangGraph {cell(langgraph_b2, 'µs/step', 1)} | {ratio(flow_b2, langgraph_b2, False)} "
        f"| {goal(flow_b2, 3, 'µs/step', at_most=True)} |",
        f"| B3 park runs at an approval, then resume them all: flow's {parked_runs:,.0f} at once "
        f"(the peers' one after another: LangGraph {b3_runs:,} runs, DBOS {dbos_b3_runs:,}) "
        f"| park {cell([p for p, _ in flow_b3], 'runs/s')}, resume {cell([r for _, r in flow_b3], 'runs/s')} "
        f"| {b3_peers} "
        f"| {b3_lead(flow_b3)} | {b3_disk(flow_b3)} |",
        f"| B3 one run after another (as the peers run; flow {seq_runs:,.0f} runs) "
        f"| park {cell([p for p, _ in flow_b3_seq], 'runs/s')}, resume {cell([r for _, r in flow_b3_seq], 'runs/s')} "
        f"| {b3_peers} "
        f"| {b3_lead(flow_b3_seq)} | {b3_disk(flow_b3_seq)} |",
        f"| B9 flowd end to end: {b9_load} (`POST /v1/runs`), until all completed, SQLite full durability "
        f"| {cell(flow_b9, 'steps/s')} | – (the peers' servers are not set up here) | – "
        f"| {statistics.median(flow_b9) / statistics.median(flow_b1):,.2f}× B1 at once in process (goal ≥ 0.70×) |",
        f"| B9 the same on PostgreSQL (127.0.0.1, `synchronous_commit=on`) "
        f"| {cell(flow_b9pg, 'steps/s')} | – | – "
        f"| {statistics.median(flow_b9pg) / statistics.median(flow_b1pg):,.2f}× B1 on PostgreSQL in process "
        f"({cell(flow_b1pg, 'steps/s')}); {goal(flow_b9pg, 20000, 'steps/s')} |",
        *[
            f"| B9 scale-out: {n} flowd{'s' if n > 1 else ''} sharing one PostgreSQL, on the same {os.cpu_count()} cores "
            f"| {cell(steps_per_second, 'steps/s')} | – | – "
            f"| CPU per step: flowd {statistics.median(flowd_cpu):,.1f} µs, PostgreSQL {statistics.median(postgres_cpu):,.1f} µs; "
            f"{statistics.median(per_core):,.0f} steps per core-second, "
            f"{statistics.median(per_core) / statistics.median(scale[1][1]):,.2f}× one flowd's |"
            for n, (steps_per_second, per_core, flowd_cpu, postgres_cpu) in sorted(scale.items())
        ],
        f"| B7 `flow-lsp` on a 5,000-line file, over stdio, one run of its bench "
        f"(goals: diagnostics p99 ≤ 30 ms; completion p50 ≤ 5 ms, p99 ≤ 16 ms) "
        f"| {b7_cell()} | none: neither has a language server | – | – |",
        f"| B8 cold start to a 1-step run completed | `flow run` {cell(flow_b8, 'ms', 1)} "
        f"| `import langgraph.graph` {cell(import_b8, 'ms', 1)}; a 1-step LangGraph run {cell(langgraph_b8, 'ms', 1)} "
        f"| {ratio(flow_b8, langgraph_b8, False)} | – |",
    ]
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    b6 = checker()
    rows += b6_rows(b6)
    alone = ours_only(b6)
    load_after = os.getloadavg()[0]
    minutes = (time.perf_counter() - started) / 60
    table = "\n".join(
        [
            START,
            f"Measured {date.today().isoformat()} by `bench/run` on {os.cpu_count()} cores ({cpu}), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
            f"the disk's fsync: {fsync:,.0f} µs; load average {load_before:.1f} at the start, {load_after:.1f} at the end; "
            f"the benchmarks took {minutes:.1f} minutes. Median of {REPS} alternated repetitions (min – max).",
            "",
            "| benchmark | flow | peers | flow's lead | its limit: against the disk (rate × fsync time: 1× = one fsync per step, or per run in B3), or the issue's goal |",
            "|---|---|---|---|---|",
            *rows,
            END,
        ]
    )
    table = table.replace(
        END,
        "\nflow's benchmarks with no peer here (one run each; their own sections below have more):\n\n"
        # Each bench prints its own columns: listed, not tabled.
        + "\n".join("- " + " · ".join(c.strip() for c in row.strip("|").split("|")) for row in alone)
        + "\n"
        + END,
    )
    print(table)
    if QUICK:
        return
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as handle:
        text = handle.read()
    if START in text and END in text:
        before, rest = text.split(START, 1)
        _, after = rest.split(END, 1)
        text = before + table + after
    else:
        text = text.rstrip() + "\n\n## Side by side: flow, LangGraph and DBOS\n\n" + table + "\n"
    with open(path, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
