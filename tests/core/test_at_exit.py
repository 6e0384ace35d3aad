"""Interpreter exit with proxies, blocking faces and unfinished streams still alive.

At exit the interpreter clears the modules' globals and then frees what is left;
a finaliser that reads a global then fails, and Python prints "Exception ignored
in: <function _no_del ...>" on stderr.  3.13t freed the last proxies and streams
after their modules' globals were gone (a proxy's, a blocking stream's and a
stream's finaliser each failed so), so every finaliser of loopbridge's (those
three, and the weak-reference callbacks of the metrics and of ownership records)
first checks ``sys.is_finalizing``, bound when it was defined, and does nothing
then: the process is ending, and no loop will run what it would hand over.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import loopbridge as lb

    @lb.loop_affine
    class Engine:
        async def echo(self, x: int) -> int:
            return x

        async def count(self, n: int):
            for i in range(n):
                yield i

    async def make() -> Engine:
        return Engine()

    owner = lb.LoopThread("owner").start()
    p = lb.proxy(owner.run(make))
    face = lb.blocking(p)
    assert face.echo(1) == 1
    open_blocking = face.count(10)  # a blocking stream, one item read
    assert next(iter(open_blocking)) == 0

    async def main():
        agen = p.count(10)  # a stream, one item read, kept past its loop's end
        assert await agen.__anext__() == 0
        return agen

    open_async = asyncio.run(main())
    if sys.argv[1] == "stopped":
        owner.stop()
    print("exiting")
    """
)


@pytest.mark.parametrize("owner", ["stopped", "running"])
def test_exit_with_proxies_and_open_streams_prints_nothing(owner: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, owner], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "exiting\n", "")
