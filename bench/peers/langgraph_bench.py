"""LangGraph's side of the side-by-side benchmarks (issue 7).

The same shapes as flow's benches, in-process fake model, 1 KB of state:
  b1 N     N runs x 10 sequential model steps, SQLite checkpointer, durability="sync"
  b2 N     one run through an N-iteration loop, in memory: engine overhead per step
  b3 N     park N runs at an approval (interrupt), then resume them all
  b8       one 1-step run, from process start (cold start)
Prints one JSON object on stdout.
"""

import json
import os
import sqlite3
import sys
import tempfile
import time
from typing import TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

STATE = "x" * 1000


def fake_model(question: str) -> str:
    """Answers at once: the engine is what is measured, as in flow's B1."""
    return "x" * 100


class Steps(TypedDict):
    q: str
    a: str


def ten_steps():
    graph = StateGraph(Steps)
    previous = START
    for i in range(10):
        name = f"step{i}"
        graph.add_node(name, lambda state: {"a": fake_model(state["q"])})
        graph.add_edge(previous, name)
        previous = name
    graph.add_edge(previous, END)
    return graph


def saver(path):
    connection = sqlite3.connect(path, check_same_thread=False)
    # SQLite's own default, said explicitly: every commit is synced.
    connection.execute("PRAGMA synchronous=FULL")
    return SqliteSaver(connection)


def b1(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        app = ten_steps().compile(checkpointer=saver(os.path.join(directory, "b1.db")))
        started = time.perf_counter()
        for run in range(runs):
            app.invoke(
                {"q": STATE, "a": ""},
                {"configurable": {"thread_id": f"run-{run}"}},
                durability="sync",
            )
        elapsed = time.perf_counter() - started
    return {"steps_per_second": runs * 10 / elapsed, "seconds": elapsed}


class Counter(TypedDict):
    i: int
    a: str


def b2(items: int) -> dict:
    graph = StateGraph(Counter)
    graph.add_node("step", lambda state: {"i": state["i"] + 1, "a": fake_model(STATE)})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: END if state["i"] >= items else "step")
    app = graph.compile()
    started = time.perf_counter()
    app.invoke({"i": 0, "a": ""}, {"recursion_limit": items + 10})
    elapsed = time.perf_counter() - started
    return {"us_per_step": elapsed * 1e6 / items, "seconds": elapsed}


class Gate(TypedDict):
    q: str
    approved: bool


def b3(runs: int) -> dict:
    graph = StateGraph(Gate)
    graph.add_node("ask", lambda state: {"q": fake_model(state["q"])})
    graph.add_node("approval", lambda state: {"approved": interrupt("approve?")})
    graph.add_node("after", lambda state: {"q": fake_model(state["q"])})
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "approval")
    graph.add_edge("approval", "after")
    graph.add_edge("after", END)
    with tempfile.TemporaryDirectory() as directory:
        app = graph.compile(checkpointer=saver(os.path.join(directory, "b3.db")))
        started = time.perf_counter()
        for run in range(runs):
            app.invoke(
                {"q": STATE, "approved": False},
                {"configurable": {"thread_id": f"run-{run}"}},
                durability="sync",
            )
        parked = time.perf_counter() - started
        started = time.perf_counter()
        for run in range(runs):
            app.invoke(
                Command(resume=True),
                {"configurable": {"thread_id": f"run-{run}"}},
                durability="sync",
            )
        resumed = time.perf_counter() - started
    return {"park_seconds": parked, "resume_seconds": resumed}


def b8() -> dict:
    graph = StateGraph(Steps)
    graph.add_node("only", lambda state: {"a": fake_model(state["q"])})
    graph.add_edge(START, "only")
    graph.add_edge("only", END)
    with tempfile.TemporaryDirectory() as directory:
        app = graph.compile(checkpointer=saver(os.path.join(directory, "b8.db")))
        app.invoke({"q": STATE, "a": ""}, {"configurable": {"thread_id": "one"}}, durability="sync")
    return {}


if __name__ == "__main__":
    which = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    result = {"b1": b1, "b2": b2, "b3": b3}.get(which)
    print(json.dumps(result(size) if result else b8()))
