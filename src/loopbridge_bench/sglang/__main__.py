from __future__ import annotations

from loopbridge_bench.sglang import main

if __name__ == "__main__":  # the load generator and the stand-in start processes
    main()
