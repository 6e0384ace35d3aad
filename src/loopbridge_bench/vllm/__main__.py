from __future__ import annotations

from loopbridge_bench.vllm import main

if __name__ == "__main__":  # vLLM and the load generator spawn processes
    main()
