"""The report of bench/profile: where flow's B1 spends its time.

  python3 bench/profile.py DIR [PERF]

DIR holds what bench/profile recorded: cpu.data (on-CPU samples with DWARF
call graphs), sync.data (fsync/fdatasync tracepoints) and each session's bench
output (cpu.txt, sync.txt). Each CPU sample goes to the first phase below
whose pattern matches a frame of its stack, so a malloc or a memcpy counts
for the work that called it; the shares add up to 100 % of the process's
on-CPU time in the timed part.
"""

import re
import statistics
import subprocess
import sys
from collections import Counter

DIR = sys.argv[1]
PERF = sys.argv[2] if len(sys.argv) > 2 else "perf"

# The journal writer thread (SQLite's, or PostgreSQL's task): samples with
# `write_batches` or `write_batch` on their stack (the first may be inlined).
WRITER_FRAME = r"::writer::write_batch"
WRITER = [
    ("writer: fsync (its on-CPU part)", r"fdatasync|\bfsync|ext4_sync_file|file_write_and_wait"),
    ("writer: JSON (records were encoded here before 2026-12-03)", r"flow_runtime::store::record::encode|flow_runtime::store::json::|serde_json::ser"),
    ("writer: SQLite commit (WAL frames written)", r"sqlite3VdbeHalt|CommitPhase|pagerWalFrames"),
    ("writer: SQLite insert statements", r"sqlite3|rusqlite"),
    ("writer: freeing the batch's records (allocated by the runs' threads)", r"drop_in_place"),
    ("writer: batching, waking the runs", r"."),
]
# Every other thread: tokio's workers (the runs), the bench's main thread.
RUNS = [
    ("runs: opening journals (SQLite reads)", r"open_journal"),
    # Records reach the store's writer encoded (`EncodedWrite`, store::json).
    ("runs: step records to JSON", r"flow_runtime::store::record::|flow_runtime::store::json::"),
    (
        "runs: copies and drops of JSON values and records",
        r"serde_json::value::Value as core::clone::Clone|BTreeMap<K,V,A> as core::clone::Clone"
        r"|StepRecord as core::clone::Clone|drop_in_place<serde_json|drop_in_place<flow_engine::journal::StepRecord"
        r"|BTreeMap<K,V,A> as core::ops::drop::Drop|IntoIter<K,V,A>::dying_next|drop_in_place<alloc::collections::btree",
    ),
    ("runs: serde (other)", r"serde_json|serde_core"),
    ("runs: schema validation of outputs", r"flow_engine::schema::"),
    ("runs: expressions and templates", r"flow_engine::eval::"),
    ("runs: journal handoff (remember, append, await the commit)", r"JournalMemory|StoreJournal|write_journal"),
    ("runs: the fake model", r"Instant0"),
    ("runs: interpreter (the rest of interp.rs, scope.rs)", r"flow_engine::|flow_runtime::"),
    ("runs: tokio (scheduling, wake-ups, timers)", r"tokio::"),
    ("runs: bench harness (spawning runs, input copies)", r"runs::"),
    ("runs: other", r"."),
]
# flowd's own process in B9 (`bench/profile b9`): what its threads were
# doing. A run's task polls `spawn_run`'s future; a request's, axum's and
# hyper's (the handler stores the run and spawns its task).
FLOWD = [
    ("flowd: journal writer (SQLite's thread, PostgreSQL's task)", WRITER_FRAME),
    ("flowd: driving runs (interpreter, steps, journal handoff)", r"Daemon>?::spawn_run|flow_runtime::runner::|flow_engine::"),
    ("flowd: outbox (events of run status changes)", r"flow_daemon::webhooks|events_wake"),
    ("flowd: HTTP handlers (auth, input, storing and spawning the run)", r"flow_daemon::"),
    ("flowd: HTTP (hyper, axum, the sockets)", r"hyper|axum|tower|mio::|tokio::net"),
    ("flowd: tokio (scheduling, wake-ups, timers)", r"tokio::"),
    # glibc's malloc has no unwind tables that perf follows: its stacks end there.
    ("flowd: malloc and free (glibc), caller unknown", r"malloc|_int_free|__libc_free|cfree|tcache_|unlink_chunk"),
    ("flowd: other (mostly the kernel: sockets, futexes, fsync)", r"."),
]
MALLOC = re.compile(r"^(_?mi_|malloc|free|realloc|cfree|__libc_malloc|__libc_free)")


def samples(path):
    """(period, frames leaf first as (symbol, dso), pid) of each sample."""
    script = subprocess.run(
        [PERF, "script", "-i", path, "-F", "comm,pid,tid,period,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for block in script.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        header = lines[0].split()
        period = int(header[-1])
        pid = next((int(f.split("/")[0]) for f in header if re.fullmatch(r"[0-9]+/[0-9]+", f)), 0)
        frames = []
        for line in lines[1:]:
            found = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
            if found:
                frames.append((found.group(1), found.group(2)))
        yield period, frames, pid


def classify(frames, rules):
    for name, pattern in rules:
        matcher = re.compile(pattern)
        if any(matcher.search(symbol) for symbol, _ in frames):
            return name
    return rules[-1][0]


def walls(path):
    """Each repetition's wall time, from the bench's rows: `N steps in 0.123
    s` (B1, B1seq) or `park 0.1 s, resume 0.2 s` (B3seq)."""
    with open(path) as handle:
        text = handle.read()
    found = [float(s) for s in re.findall(r"steps in ([0-9.]+) s", text)]
    return found or [float(p) + float(r) for p, r in re.findall(r"park ([0-9.]+) s, resume ([0-9.]+) s", text)]


def work(path):
    """What the repetitions did: (count, unit)."""
    with open(path) as handle:
        text = handle.read()
    found = re.findall(r"\| ([0-9]+) steps in", text)
    if found:
        return sum(int(n) for n in found), "step"
    return sum(int(n) for n in re.findall(r"park ([0-9]+) runs", text)), "run (parked, then resumed)"


def cpu_report():
    phases, leaves = Counter(), Counter()
    total = writer = malloc = kernel = 0
    every = [sample for sample in samples(f"{DIR}/cpu.data") if sample[1]]
    # B9: the processes running flowd's binary, known by their frames.
    flowd = {pid for _, frames, pid in every if any(dso.endswith("/flowd") for _, dso in frames)}
    for period, frames, pid in every:
        total += period
        on_writer = any(re.search(WRITER_FRAME, symbol) for symbol, _ in frames)
        writer += period if on_writer else 0
        if pid in flowd:
            phases[classify(frames, FLOWD)] += period
        elif flowd:
            phases["load generator (the bench process)"] += period
        else:
            phases[classify(frames, WRITER if on_writer else RUNS)] += period
        leaf, dso = frames[0]
        leaves[leaf] += period
        if MALLOC.match(leaf):
            malloc += period
        if "kernel" in dso:
            kernel += period
    wall = walls(f"{DIR}/cpu.txt")
    print(f"## CPU: {total / 1e9:.2f} s on-CPU in {sum(wall):.2f} s of timed wall time ({len(wall)} repetitions, under perf)")
    print(f"(on average {total / 1e9 / sum(wall):.2f} of the machine's cores busy)\n")
    print("| phase | share of on-CPU time |")
    print("|---|---|")
    for name, _ in WRITER + RUNS + FLOWD + [("load generator (the bench process)", "")]:
        if phases[name]:
            print(f"| {name} | {100 * phases[name] / total:.1f} % |")
    print(f"\njournal writer thread: {100 * writer / total:.1f} %, the runs' threads: {100 * (total - writer) / total:.1f} %")
    print(f"of all, in malloc/free (mimalloc): {100 * malloc / total:.1f} %, in the kernel: {100 * kernel / total:.1f} %\n")
    print("top functions by self time:\n")
    for leaf, period in leaves.most_common(20):
        print(f"  {100 * period / total:5.1f} %  {leaf[:110]}")


def sync_report():
    try:
        script = subprocess.run(
            [PERF, "script", "-i", f"{DIR}/sync.data", "-F", "tid,time,event"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        print("\n## the disk: no sync.data (no syscall tracepoints)")
        return
    entered, waits = {}, []
    for line in script.splitlines():
        found = re.match(r"\s*(\d+)\s+([0-9.]+):\s+syscalls:sys_(enter|exit)_", line)
        if not found:
            continue
        tid, at, which = int(found.group(1)), float(found.group(2)), found.group(3)
        if which == "enter":
            entered[tid] = at
        elif tid in entered:
            waits.append(at - entered.pop(tid))
    wall = walls(f"{DIR}/sync.txt")
    done, unit = work(f"{DIR}/sync.txt")
    print(f"\n## the disk: {len(wall)} repetitions, {done:,} × {unit} in {sum(wall):.3f} s ({done / sum(wall):,.0f} per second, perf counting syscalls only)")
    if not waits:
        print("no fsync seen")
        return
    waits.sort()
    print(
        f"{len(waits):,} fsyncs ({len(waits) / len(wall):,.0f} per repetition, {len(waits) / done:,.3f} per {unit}); "
        f"each {statistics.median(waits) * 1e6:,.0f} µs median, p99 {waits[int(len(waits) * 0.99)] * 1e6:,.0f} µs; "
        f"waiting for them: {sum(waits):.3f} s, {100 * sum(waits) / sum(wall):.0f} % of the wall time"
    )


if __name__ == "__main__":
    cpu_report()
    sync_report()
    print(f"\n(perf data in {DIR}: `perf report -i {DIR}/cpu.data --children`)")
