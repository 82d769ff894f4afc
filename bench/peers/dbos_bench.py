"""DBOS's side of the side-by-side benchmarks (issue 7): durable workflows on
SQLite, the same in-process fake model and 1 KB of state as flow's B1.
  b1 N     N workflows x 10 sequential steps
Prints one JSON object on stdout.
"""

import json
import os
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
        DBOS(
            config={
                "name": "flow-bench",
                "system_database_url": f"sqlite:///{os.path.join(directory, 'dbos.sqlite')}",
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
