#!/usr/bin/env python
"""loopbridge's Python frames, modules and module changes in one steady-state call.

Counts what one ``await proxy(e).generate("hi")`` made from a second loop runs of
loopbridge's own code, in both threads (the caller's loop and the owner's),
with ``sys.setprofile``/``threading.setprofile``:

* **frames**: every frame of loopbridge's code entered, a coroutine's resumption
  included (the profiler reports each as a ``call``);
* **modules**: the distinct modules those frames belong to (a generated proxy
  member counts as the module it was generated for, by its code's file name);
* **module changes**: in each thread, how often the next loopbridge frame entered
  belongs to another module than the one before it, summed over the threads.
  Counted per thread, the figure does not depend on how the two threads'
  steps interleave.

The owner's member itself (``Engine.generate``), asyncio and the rest of the
standard library are not counted.  The call is measured after warm-up calls,
back to back with them (the caller loop's liveness tick is already scheduled, as
under load).  ``--src`` puts a source tree first on ``sys.path``; ``--trace``
prints the frames in order::

    python benchmarks/bench_frames.py --trace
    python benchmarks/bench_frames.py --src /tmp/before/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

WARMUP = 50


def measure() -> list[tuple[int, str, str]]:
    """(thread, module, function) of every loopbridge frame entered, in order."""
    import loopbridge as lb

    package = Path(lb.__file__).resolve().parent

    @lb.loop_affine
    class Engine:
        async def generate(self, prompt: str) -> str:
            return prompt

    events: list[tuple[int, str, str]] = []
    recording = [False]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not recording[0]:
            return
        code = frame.f_code
        module = _module(code.co_filename, package)
        if module is not None:
            # Python 3.10's code objects have no co_qualname: the bare name there (an
            # AttributeError raised here would surface inside the measured call).
            name = getattr(code, "co_qualname", code.co_name)
            events.append((threading.get_ident(), module, name))

    threading.setprofile(profile)  # the owner's thread starts after this
    sys.setprofile(profile)
    try:
        with lb.LoopThread(name="owner", use_uvloop=False) as owner:

            async def build() -> Engine:
                return Engine()

            engine = owner.run(build)

            async def main() -> None:
                p = lb.proxy(engine)
                for _ in range(WARMUP):
                    await p.generate("hi")
                recording[0] = True
                await p.generate("hi")
                recording[0] = False

            asyncio.run(main())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return events


def _module(filename: str, package: Path) -> str | None:
    """The loopbridge module a code object belongs to, or None for anyone else's."""
    if filename.startswith("<loopbridge"):  # generated: "<loopbridge proxy member of ...>"
        return filename.strip("<>").split(" of ")[0]
    path = Path(filename).resolve()
    if package not in path.parents:
        return None
    return ".".join(path.relative_to(package.parent).with_suffix("").parts)


def summary(events: list[tuple[int, str, str]]) -> dict[str, Any]:
    changes = 0
    last: dict[int, str] = {}
    entered: dict[str, int] = {}
    for thread, module, _ in events:
        if thread in last and last[thread] != module:
            changes += 1
        last[thread] = module
        entered[module] = entered.get(module, 0) + 1
    return {
        "frames": len(events),
        "modules": len(entered),
        "module_changes": changes,
        "frames_by_module": entered,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--src", help="a source tree to measure, put first on sys.path")
    ap.add_argument("--trace", action="store_true", help="print every frame, in order")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
    events = measure()
    threads = {t: f"thread {i}" for i, t in enumerate(dict.fromkeys(t for t, _, _ in events))}
    if args.trace:
        for thread, module, name in events:
            print(f"{threads[thread]:>9}  {module:<36} {name}")
        print()
    result = summary(events)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['frames']} frames in {result['modules']} modules, "
        f"{result['module_changes']} module changes"
    )
    for module, n in sorted(result["frames_by_module"].items(), key=lambda kv: -kv[1]):
        print(f"  {n:3d}  {module}")


if __name__ == "__main__":
    main()
