"""DBOS's side of the side-by-side benchmarks (issue 7): durable workflows on
SQLite, the same in-process fake model and 1 KB of state as flow's B1.
  b1 N     N workflows x 10 sequential steps
Prints one JSON object on stdout.
"""

import json
import os
import sqlite3
import sys
import tempfile
import time

from dbos import DBOS

STATE = "x" * 1000


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


def b1(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        # WAL, as flow's and LangGraph's stores run: one sync per commit, not
        # the rollback journal's two. The mode stays with the database file.
        database = os.path.join(directory, "dbos.sqlite")
        connection = sqlite3.connect(database)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.close()
        DBOS(
            config={
                "name": "flow-bench",
                "system_database_url": f"sqlite:///{database}",
            }
        )
        DBOS.launch()
        started = time.perf_counter()
        for _ in range(runs):
            ten_steps(STATE)
        elapsed = time.perf_counter() - started
        DBOS.destroy()
    return {"steps_per_second": runs * 10 / elapsed, "seconds": elapsed}


if __name__ == "__main__":
    print(json.dumps(b1(int(sys.argv[2]))))
