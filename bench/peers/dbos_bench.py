"""DBOS's side of the side-by-side benchmarks (issue 7): durable workflows on
SQLite, the same in-process fake model and 1 KB of state as flow's B1 and B3.
  b1 N     N workflows x 10 sequential steps
  b3 N     N workflows parked at an approval (a step, then `DBOS.recv`), one
           after another; then each decided (`DBOS.send`) and driven to its
           end, one after another
Prints one JSON object on stdout.
"""

import json
import os
import sqlite3
import sys
import tempfile
import threading
import time

from dbos import DBOS, SetWorkflowID

STATE = "x" * 1000
# On SQLite, DBOS has no LISTEN/NOTIFY: a workflow waiting in `DBOS.recv` is
# woken by a listener thread that polls the database for every waiter, every
# `notification_listener_polling_interval_sec` (1 s by default, 1 ms at the
# least). B3 sets it to DBOS_POLL (default 0.001, the minimum): the fastest
# wake-up DBOS offers after a `send`.
POLL = float(os.environ.get("DBOS_POLL", "0.001"))


def fake_model(question: str) -> str:
    return "x" * 100


@DBOS.step()
def step(question: str) -> str:
    return fake_model(question)


@DBOS.workflow()
def ten_steps(question: str) -> str:
    answer = question
    for _ in range(10):
        answer = step(question)
    return answer


# Set by each B3 workflow once its first step is durable and it is about to
# wait for the decision: in process, so that waiting for it writes nothing.
PARKING = {}


@DBOS.workflow()
def gated(question: str) -> str:
    answer = step(question)
    PARKING[DBOS.workflow_id].set()
    approved = DBOS.recv("approval", timeout_seconds=3600)
    if not approved:
        return "rejected"
    return step(answer)


def launch(directory: str, **config) -> None:
    # WAL, as flow's and LangGraph's stores run: one sync per commit, not
    # the rollback journal's two. The mode stays with the database file.
    # synchronous stays SQLite's default, FULL.
    database = os.path.join(directory, "dbos.sqlite")
    connection = sqlite3.connect(database)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.close()
    DBOS(
        config={
            "name": "flow-bench",
            "system_database_url": f"sqlite:///{database}",
            **config,
        }
    )
    DBOS.launch()


def b1(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        launch(directory)
        started = time.perf_counter()
        for _ in range(runs):
            ten_steps(STATE)
        elapsed = time.perf_counter() - started
        DBOS.destroy()
    return {"steps_per_second": runs * 10 / elapsed, "seconds": elapsed}


def b3(runs: int) -> dict:
    """The shape of LangGraph's B3 and flow's B3seq: each run started and
    driven until it waits for its approval, one after another; then each
    decided and driven to its end, one after another. A parked DBOS workflow
    is a thread blocked in `recv` (its step's output is in the database); the
    decision is a message, durable when `send` returns."""
    with tempfile.TemporaryDirectory() as directory:
        launch(directory, notification_listener_polling_interval_sec=POLL)
        handles = []
        started = time.perf_counter()
        for run in range(runs):
            workflow_id = f"run-{run}"
            PARKING[workflow_id] = threading.Event()
            with SetWorkflowID(workflow_id):
                handles.append(DBOS.start_workflow(gated, STATE))
            # Its step is committed and it is in `recv` (the recv's own
            # setup, a read and a durable timeout record, overlaps the next
            # run's start: all but the last run's are inside the timer).
            PARKING[workflow_id].wait()
        parked = time.perf_counter() - started
        started = time.perf_counter()
        for run, handle in enumerate(handles):
            DBOS.send(f"run-{run}", True, "approval")
            assert handle.get_result() == "x" * 100
        resumed = time.perf_counter() - started
        DBOS.destroy()
    return {"park_seconds": parked, "resume_seconds": resumed, "poll_seconds": POLL}


if __name__ == "__main__":
    which = sys.argv[1]
    print(json.dumps({"b1": b1, "b3": b3}[which](int(sys.argv[2]))))
