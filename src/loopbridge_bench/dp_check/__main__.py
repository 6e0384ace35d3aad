"""``python -m loopbridge_bench.dp_check check --variant c --ranks 2 ...``"""

from __future__ import annotations

import argparse
import sys

from ._checker import check
from ._model import VARIANTS, Config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loopbridge_bench.dp_check")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="explore every interleaving within the bounds")
    c.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    c.add_argument("--ranks", type=int, default=2)
    c.add_argument("--requests", type=int, default=1)
    c.add_argument("--req-len", type=int, default=1, help="forwards a request needs")
    c.add_argument(
        "--when",
        choices=["any", "before", "during", "after"],
        default="any",
        help="when requests may be sent relative to the pause",
    )
    c.add_argument("--pauses", type=int, default=1)
    c.add_argument("--mode", choices=["keep", "abort", "wait"], default="keep")
    c.add_argument("--weight-updates", type=int, default=1)
    c.add_argument("--resumes", type=int, default=1, help="2 = a duplicate resume")
    c.add_argument("--duplicate-resume", action="store_true", help="same as --resumes 2")
    c.add_argument("--aborts", type=int, default=0, help="client aborts")
    c.add_argument("--sync-interval", type=int, default=2)
    c.add_argument(
        "--prompt-first-req",
        action="store_true",
        help="the stats task forwards FIRST_REQ at once (no starved task)",
    )
    c.add_argument(
        "--pause-targets",
        default="",
        help="ranks each pause reaches, as successive pauses: '0' or '0;1' (default: all)",
    )
    c.add_argument("--max-states", type=int, default=2_000_000)
    c.add_argument("--no-heal-check", action="store_true")
    a = p.parse_args(argv)
    try:
        cfg = Config(
            VARIANTS[a.variant],
            ranks=a.ranks,
            requests=a.requests,
            req_len=a.req_len,
            pauses=a.pauses,
            weight_updates=a.weight_updates,
            resumes=2 if a.duplicate_resume else a.resumes,
            mode=a.mode,
            sync_interval=a.sync_interval,
            aborts=a.aborts,
            when=a.when,
            prompt_first_req=a.prompt_first_req,
            pause_targets=tuple(
                tuple(int(r) for r in group.split(","))
                for group in a.pause_targets.split(";")
                if group
            ),
        )
    except ValueError as e:
        p.error(str(e))
    res = check(cfg, max_states=a.max_states, heal_check=not a.no_heal_check)
    print(res.summary())
    for v in res.violations.values():
        heals = {None: "not checked", True: "yes", False: "no"}[v.heals]
        print(f"\n== {v.kind}: {v.detail}\n   heals with more client traffic: {heals}")
        print(f"   shortest counterexample ({len(v.trace)} steps):\n")
        print(v.timeline(cfg.ranks))
    return 0 if res.ok and res.complete else 1


if __name__ == "__main__":
    sys.exit(main())
