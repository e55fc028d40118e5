"""The shape registry under real crashes: a writer process killed with SIGKILL at random
moments never leaves a file that fails to load or holds a state nobody wrote."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tidemark.shapes.registry import ShapeRegistry

WRITER = textwrap.dedent(
    """
    import sys
    from tidemark.shapes.model import ShapeDefinition
    from tidemark.shapes.registry import ShapeRegistry

    registry = ShapeRegistry.open(sys.argv[1])
    step = max((int(s.name[1:]) for s in registry.shapes()), default=-1) + 1
    while True:
        # state(step): the five shapes s<step-4> .. s<step>, one durable write per step
        registry.reconcile(
            [ShapeDefinition(name=f"s{j}", table="orders", where=f"id > {j}")
             for j in range(max(0, step - 4), step + 1)]
        )
        print(step, flush=True)
        step += 1
    """
)


def state(step: int) -> set[str]:
    return {f"s{j}" for j in range(max(0, step - 4), step + 1)}


def test_sigkill_during_writes_leaves_a_whole_registry(tmp_path: Path) -> None:
    path = tmp_path / "shapes.json"
    rng = random.Random(20240601)
    last = -1
    for _ in range(6):
        # given a process rewriting the registry as fast as it can
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        first = writer.stdout.readline()  # it is running and has committed once
        assert first.strip(), writer.stderr.read() if writer.stderr else ""
        # when it is killed without warning at a random moment
        time.sleep(rng.uniform(0.0, 0.3))
        writer.send_signal(signal.SIGKILL)
        output, _ = writer.communicate(timeout=30)
        printed = [int(line) for line in (first + output).split()]
        assert writer.returncode == -signal.SIGKILL
        assert printed[0] == last + 1  # it resumed where the previous run stopped
        last = printed[-1]
        # then the file loads, and holds the last state reported durable, or the one
        # whose write had already been renamed into place when the kill came
        loaded = {s.name for s in ShapeRegistry.open(path).shapes()}
        assert loaded in (state(last), state(last + 1)), (last, sorted(loaded))
        if loaded == state(last + 1):
            last += 1
        # and no temporary file survives the next open
        assert [p.name for p in tmp_path.iterdir()] == ["shapes.json"]
