"""Check the latency benchmark's load generator against vLLM's own `vllm bench serve`.

Both drive one stock `vllm serve` (the CPU stand-in engine, as the main job runs it)
with the same workload: streaming /v1/completions, fixed prompt and output lengths,
`ignore_eos`, closed loop at one concurrency. They alternate, the order swapped every
pair, after one warm-up job, and the table gives each run's TTFT, ITL and TPOT.

    .venv/bin/python scripts/check-load-generator.py [--pairs 3] [--requests 128]

Definitions differ in two details: vLLM counts every streamed event that has choices
(ours: every event with non-empty text), and it ends a request at its last token event
(ours: at the end of the stream).  Neither changes TTFT; ITL differs only when a token
decodes to no text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def ours(lp: Any, url: str, args: argparse.Namespace, first_id: int) -> dict[str, float]:
    from loopbridge_bench.common.load import Job
    from loopbridge_bench.common.summary import percentile

    job = Job(
        url, "bench", args.requests, args.concurrency, args.prompt_len, args.output_len,
        True, 120.0, first_id=first_id,
    )  # fmt: skip
    samples = lp.run(job).samples
    ok = [s for s in samples if s.error is None]
    itl = [x for s in ok for x in s.itl]
    tpot = [(s.e2e - s.ttft) / (s.tokens - 1) for s in ok if s.tokens > 1]
    ttft = [s.ttft for s in ok]
    return {
        "ok": len(ok),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(itl, 50),
        "itl_p99": percentile(itl, 99),
        "tpot_p50": percentile(tpot, 50),
    }


def vllms(url: str, model: Path, args: argparse.Namespace, out: Path, n: int) -> dict[str, float]:
    name = f"vllm-{n}.json"
    cmd = [
        *(sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve"),
        *("--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions"),
        *("--model", "bench", "--tokenizer", str(model), "--dataset-name", "random"),
        *("--random-input-len", str(args.prompt_len), "--random-output-len", str(args.output_len)),
        *("--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency)),
        *("--ignore-eos", "--save-result", "--result-dir", str(out), "--result-filename", name),
        *("--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"),
        *("--disable-tqdm", "--seed", str(n)),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    r = json.loads((out / name).read_text())
    return {
        "ok": r["completed"],
        **{f"{m}_p{q}": r[f"p{q}_{m}_ms"] / 1e3 for m in ("ttft", "itl") for q in (50, 99)},
        "tpot_p50": r["p50_tpot_ms"] / 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    args = ap.parse_args()

    from loopbridge_bench.common.load import LoadProcess
    from loopbridge_bench.vllm._stock import StockServer
    from loopbridge_vllm.cpu_engine import STEP_ENV, build_tiny_model, cpu_engine_env, engine_args

    cpu_engine_env(args.cache_dir / "vllm")
    os.environ[STEP_ENV] = repr(args.step_ms / 1e3)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    model = build_tiny_model(args.cache_dir / "tiny-model")
    eargs = engine_args(
        model,
        served_model_name=["bench"],
        max_num_seqs=args.concurrency,
        enable_prefix_caching=False,
    )
    out = Path(tempfile.mkdtemp(prefix="check-load-generator-"))
    stock = StockServer(eargs, out / "stock-server.log").start(dict(os.environ))
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        stock.wait_ready(600)
        with LoadProcess() as lp:
            ours(lp, stock.url, args, 0)  # warm-up
            first = args.requests
            for pair in range(args.pairs):
                order = ("ours", "vllm") if pair % 2 == 0 else ("vllm", "ours")
                for who in order:
                    if who == "ours":
                        rows.append(("ours", ours(lp, stock.url, args, first)))
                        first += args.requests
                    else:
                        rows.append(("vllm bench serve", vllms(stock.url, model, args, out, pair)))
    finally:
        stock.stop()
    print(
        f"{args.requests} streaming requests per run, c = {args.concurrency}, prompt "
        f"{args.prompt_len}, output {args.output_len}, stand-in step {args.step_ms} ms; ms\n"
    )
    print("| run | client | ok | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (who, r) in enumerate(rows):
        cells = " | ".join(
            f"{r[k] * 1e3:.1f}" for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50")
        )
        print(f"| {i + 1} | {who} | {r['ok']:.0f} | {cells} |")


if __name__ == "__main__":
    main()
