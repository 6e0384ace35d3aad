from __future__ import annotations

from loopbridge_vllm.bench import main

if __name__ == "__main__":  # vLLM and the load generator spawn processes
    main()
