"""The latency benchmark's plan, without engines: prompts, lengths, arrivals, devices, metrics."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from loopbridge_bench.common.load import (
    ID_TOKENS,
    Job,
    Sample,
    arrival_times,
    length_bounds,
    prompt_tokens,
    request_lengths,
)
from loopbridge_bench.common.record import Cell, JobRecord, job_seed
from loopbridge_bench.vllm._devices import (
    Gpu,
    parse_fake_gpus,
    place_engines,
    startup_order,
)
from loopbridge_bench.vllm._report import headlines, markdown, summarize, target_checks
from loopbridge_bench.vllm._run import (
    Scenario,
    _open_scenarios,
    _scenarios,
    check_kv,
    expected_hit_rate,
    parse_args,
    requests_for,
)

from .records import job_record


def _job(**kw: Any) -> Job:
    base: dict[str, Any] = {
        "url": "http://x",
        "model": "m",
        "requests": 16,
        "concurrency": 4,
        "prompt_len": 32,
        "output_len": 32,
        "stream": True,
        "timeout_s": 1.0,
    }
    base.update(kw)
    return Job(**base)


def _run_jobs(argv: list[str]) -> list[Job]:
    """The jobs a run sends, numbered as ``run`` numbers them: every round, scenario, mode."""
    args = parse_args(argv)
    jobs, next_id = [], 2 * args.race_requests  # the correctness phase goes first
    closed, open_ = _scenarios(args), _open_scenarios(args)
    for rnd in range(args.warmup_rounds + args.rounds):
        for si, sc in enumerate(closed + open_):
            c = sc.concurrency if sc.rate_fraction is None else max(args.concurrency)
            n = requests_for(args, c, rnd < args.warmup_rounds)
            for _mode in args.modes:
                jobs.append(
                    _job(
                        requests=n,
                        prompt_len=args.prompt_len,
                        output_len=args.output_len,
                        seed=job_seed(args.seed, Cell(rnd, False, si, sc, ()), sc.workload),
                        first_id=next_id,
                        lengths=args.lengths,
                        shared_prefix=args.shared_prefix,
                        endpoint=sc.endpoint,
                    )
                )
                next_id += n
    return jobs


@pytest.mark.parametrize(
    "argv",
    [
        [],  # the default run: 4 rounds x 6 scenarios x 4 modes
        ["--lengths", "lognormal", "--endpoint", "both", "--rate-fractions", "0.5,0.9"],
    ],
)
def test_no_two_requests_share_a_prompt_or_its_first_block(argv: list[str]) -> None:
    prompts = [tuple(prompt_tokens(j, i)) for j in _run_jobs(argv) for i in range(j.requests)]
    assert len(prompts) > 2000
    assert len(set(prompts)) == len(prompts)
    # Nor a prefix-cache block (16 tokens, vLLM's default; or a shorter prompt whole).
    firsts = [p[:16] for p in prompts]
    assert len(set(firsts)) == len(firsts)


def test_the_old_seed_scheme_would_have_repeated_prompts() -> None:
    """The regression: a job's prompts depend on its request numbers, not its seed alone."""
    a = _job(seed=0, first_id=0)
    b = _job(seed=1000, first_id=16)  # round 1 of the old scheme: seed + 1000
    assert {tuple(prompt_tokens(a, i)) for i in range(16)}.isdisjoint(
        tuple(prompt_tokens(b, i)) for i in range(16)
    )
    # The same request number is the same prompt: lengths and content are a function of it.
    assert prompt_tokens(a, 3) == prompt_tokens(_job(seed=0, first_id=2), 1)


def test_shared_prefix_and_its_stated_hit_rate() -> None:
    job = _job(shared_prefix=24, prompt_len=64, requests=50)
    prompts = [prompt_tokens(job, i) for i in range(50)]
    assert all(p[:24] == prompts[0][:24] for p in prompts)
    assert len({tuple(p[24 : 24 + ID_TOKENS]) for p in prompts}) == 50
    # 24 shared tokens hold one whole 16-token block: 16 of every 64 prompt tokens.
    assert expected_hit_rate([job], 16) == 16 / 64
    assert expected_hit_rate([_job(requests=50)], 16) == 0.0
    args = parse_args(["--shared-prefix", "24", "--prompt-len", "64"])
    assert args.prefix_caching == "auto"
    from loopbridge_bench.vllm._run import prefix_caching

    assert prefix_caching(args) and not prefix_caching(parse_args([]))
    assert not prefix_caching(parse_args(["--shared-prefix", "24", "--prefix-caching", "off"]))


def test_prompt_too_short_for_its_number_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--prompt-len", "3"])
    assert "request's number in the run" in capsys.readouterr().err


def test_each_cell_meets_its_first_refit_at_its_own_drawn_offset() -> None:
    """Every mode of a cell the same offset, within one refit period; cells independent."""
    from loopbridge_bench.common.record import Cell
    from loopbridge_bench.vllm._run import busy_load_of
    from loopbridge_bench.vllm._stack import BusyLoad

    load = BusyLoad(slice_s=0.004, period_s=0.01, refit_every_s=1.0, refit_pause_s=0.05)
    cells = [
        Cell(r, False, i, "stream-c16-busy", ("per-hop", "loopbridge"))
        for r in range(4)
        for i in range(3)
    ]
    offsets = [busy_load_of(load, 0, cell).first_refit_s for cell in cells]
    assert offsets == [busy_load_of(load, 0, cell).first_refit_s for cell in cells]
    assert all(o is not None and 0.0 <= o < 1.0 for o in offsets)
    assert len(set(offsets)) == len(offsets)
    assert busy_load_of(load, 1, cells[0]).first_refit_s != offsets[0]  # another --seed
    assert busy_load_of(load, 0, cells[0]).refit_pause_s == 0.05  # the rest as it was


def test_switch_interval_option(capsys: pytest.CaptureFixture[str]) -> None:
    """The servers' own default unless told: a number of ms, or off (the interpreter's)."""
    assert parse_args([]).switch_interval_ms == 1.0
    assert parse_args(["--switch-interval-ms", "0.5"]).switch_interval_ms == 0.5
    assert parse_args(["--switch-interval-ms", "off"]).switch_interval_ms is None
    for bad in ("0", "-1", "fast"):
        with pytest.raises(SystemExit):
            parse_args(["--switch-interval-ms", bad])
        assert f"a positive number of ms or off, not '{bad}'" in capsys.readouterr().err


def test_the_records_are_frozen_between_jobs_unless_told() -> None:
    assert parse_args([]).gc_freeze is True
    assert parse_args(["--no-gc-freeze"]).gc_freeze is False


def test_lognormal_lengths_are_seeded_bounded_and_right_skewed() -> None:
    job = _job(lengths="lognormal", prompt_len=256, output_len=128, requests=4000, seed=7)
    lengths = [request_lengths(job, i) for i in range(4000)]
    assert lengths == [request_lengths(_job(**{**job.__dict__}), i) for i in range(4000)]
    prompts, outputs = zip(*lengths)
    assert min(prompts) >= length_bounds(256, "lognormal")[0] == 64
    assert max(prompts) <= length_bounds(256, "lognormal")[1] == 1024
    assert 230 <= statistics.median(prompts) <= 280
    assert statistics.mean(prompts) > statistics.median(prompts)  # a long right tail
    assert 115 <= statistics.median(outputs) <= 141
    assert len(set(prompts)) > 100
    # Another seed (round or scenario) draws another sequence.
    other = _job(lengths="lognormal", prompt_len=256, output_len=128, seed=8)
    assert [request_lengths(other, i) for i in range(50)] != lengths[:50]
    assert request_lengths(_job(), 5) == (32, 32)


def test_a_busy_scenario_serves_its_idle_twins_lengths_in_each_round() -> None:
    """The busy-versus-idle ratio compares one draw of lengths: the load is the only
    difference.  Another round, workload or ``--seed`` draws another."""
    args = parse_args(["--busy", "all", "--lengths", "lognormal", "--concurrency", "16,64"])
    scenarios = _scenarios(args)
    assert {s.workload for s in scenarios} == {
        "stream-c16",
        "stream-c64",
        "nostream-c16",
        "nostream-c64",
    }

    def lengths(rnd: int, sc: Scenario, seed: int = 0) -> list[tuple[int, int]]:
        cell = Cell(rnd, False, scenarios.index(sc), sc, ("stock",))
        job = _job(lengths="lognormal", seed=job_seed(seed, cell, sc.workload), requests=64)
        return [request_lengths(job, i) for i in range(64)]

    idle = Scenario(True, 64, False)
    for twin in (Scenario(True, 64, True), Scenario(True, 64, True, own_loop=True)):
        assert twin in scenarios and twin.workload == idle.key
        assert lengths(1, twin) == lengths(1, idle)
    assert lengths(2, idle) != lengths(1, idle)
    assert lengths(1, Scenario(True, 16, True)) != lengths(1, idle)
    assert lengths(1, idle, seed=1) != lengths(1, idle)


def test_poisson_arrivals() -> None:
    job = _job(rate=20.0, requests=4000, seed=3)
    times = arrival_times(job)
    assert times == arrival_times(job) and times[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= 0 for g in gaps)
    assert 0.045 <= statistics.mean(gaps) <= 0.055  # 1 / rate
    assert 0.9 <= statistics.stdev(gaps) / statistics.mean(gaps) <= 1.1  # exponential: CV 1


def test_open_loop_scenarios() -> None:
    args = parse_args(["--rate-fractions", "0.5,0.9", "--concurrency", "1,8", "--stream", "on"])
    opened = _open_scenarios(args)
    assert [s.key for s in opened] == ["stream-r0.5", "stream-r0.9"]
    assert all(s.concurrency == 2 * args.max_num_seqs for s in opened)
    assert Scenario(False, 4, True, "chat").key == "nostream-chat-c4-busy"
    with pytest.raises(SystemExit):
        parse_args(["--rate-fractions", "0"])


def _gpus(n: int, free: int = 70000) -> list[Gpu]:
    return [Gpu(str(i), "GPU", 80000, free) for i in range(n)]


def test_startup_order() -> None:
    modes = ["stock", "unsafe", "per-hop", "loopbridge"]
    assert startup_order(modes, True) == ["correctness", "stock", "threaded"]
    assert startup_order(modes, False) == ["stock", "threaded"]
    assert startup_order(["loopbridge"], True) == ["correctness", "threaded"]
    assert startup_order(["stock"], False) == ["stock"]


def test_device_placement() -> None:
    order = ["correctness", "stock", "threaded"]
    # One GPU: shared, each engine 0.9 of half the free memory, as a share of the total.
    one = place_engines(_gpus(1), order, 1, None)
    assert {p.devices for p in one.values()} == {("0",)}
    assert {p.gpu_memory_utilization for p in one.values()} == {0.39}
    assert all(p.shared for p in one.values())
    assert one["stock"].env == {"CUDA_VISIBLE_DEVICES": "0"}
    # The user's share wins.
    assert place_engines(_gpus(1), order, 1, 0.3)["threaded"].gpu_memory_utilization == 0.3
    # Two GPUs: one each, vLLM's default share; the correctness engine on the threaded one's.
    two = place_engines(_gpus(2), order, 1, None)
    assert two["stock"].devices == ("0",) and two["threaded"].devices == ("1",)
    assert two["correctness"].devices == ("1",)
    assert all(p.gpu_memory_utilization is None and not p.shared for p in two.values())
    # Tensor parallel 2 on 4 GPUs: two each; on 3 GPUs: shared.
    four = place_engines(_gpus(4), order, 2, None)
    assert four["stock"].devices == ("0", "1") and four["threaded"].devices == ("2", "3")
    assert four["threaded"].env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    three = place_engines(_gpus(3), order, 2, None)
    assert three["stock"].devices == three["threaded"].devices == ("0", "1")
    # The fullest device decides the share.
    mixed = [Gpu("0", "A", 80000, 70000), Gpu("1", "A", 80000, 40000)]
    assert place_engines(mixed, order, 2, None)["stock"].gpu_memory_utilization == 0.22
    # One latency engine: it takes the device, with vLLM's default share.
    alone = place_engines(_gpus(1), ["correctness", "threaded"], 1, None)
    assert alone["threaded"].devices == ("0",) and alone["threaded"].gpu_memory_utilization is None
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        place_engines(_gpus(1), order, 2, None)
    with pytest.raises(ValueError, match="too little free GPU memory"):
        place_engines(_gpus(1, free=8000), order, 1, None)
    # No GPU (the stand-in, or a dry run on CPU): no placement.
    assert place_engines([], order, 1, None)["stock"].env == {}


def test_fake_gpus() -> None:
    gpus = parse_fake_gpus("NVIDIA H100 80GB HBM3:81559:80000,NVIDIA H100 80GB HBM3:81559:1000")
    assert [g.id for g in gpus] == ["0", "1"] and gpus[1].free_mib == 1000
    for bad in ("H100:80000", "H100:80000:90000", "H100:x:1"):
        with pytest.raises(ValueError):
            parse_fake_gpus(bad)
    with pytest.raises(SystemExit):
        parse_args(["--fake-gpus", "H100:80000:70000"])  # a dry run only


def test_kv_cache_sizes_must_match() -> None:
    diff = check_kv({"stock": {"tokens": 100_000}, "threaded": {"tokens": 100_500}})
    assert diff is not None and math.isclose(diff, 500 / 100_500)
    assert check_kv({"stock": {"tokens": None}, "threaded": {"tokens": 5}}) is None
    assert check_kv({"threaded": {"tokens": 5}}) is None
    with pytest.raises(RuntimeError, match=r"differ by 2\.0%"):
        check_kv({"stock": {"tokens": 98_000}, "threaded": {"tokens": 100_000}})


def _rec(mode: str, ttft: float, gap: float, cpu: float, *, own_loop: bool = False) -> JobRecord:
    """Ten streamed samples at concurrency 2; ``own_loop``: the busy actor on its own
    loop (the ``-busy-own-loop`` scenario)."""
    samples = [
        Sample(
            start=0.0,
            ttft=ttft,
            e2e=ttft + 3 * gap,
            tokens=4,
            error=None,
            itl=[gap, gap, gap * (3 if i == 9 else 1)],
        )
        for i in range(10)
    ]
    return job_record(mode, samples, busy=own_loop, own_loop=own_loop, server_cpu_s=cpu)


def test_the_busy_actor_on_its_own_loop_is_checked_against_the_idle_scenario() -> None:
    """Each mode of ours: a ``-busy-own-loop`` row's TTFT p99 within 1.10x of the same
    mode's idle row; a mode's idle row never stands in for another mode's."""
    rows = summarize(
        [
            _rec("loopbridge", 0.020, 0.01, 1.0),
            _rec("loopbridge", 0.021, 0.01, 1.0, own_loop=True),  # 1.05x its idle: met
            _rec("on-engine-loop", 0.010, 0.01, 1.0),
            _rec("on-engine-loop", 0.020, 0.01, 1.0, own_loop=True),  # 2x its idle: missed
        ]
    )
    checks = {
        (t["scenario"], t["value"]): t["met"]
        for t in target_checks(rows)
        if t["what"] == "TTFT p99 ≤ 1.10x idle"
    }
    assert checks == {
        ("stream-c2-busy-own-loop", "1.05x"): True,
        ("stream-c2-busy-own-loop (on-engine-loop)", "2.00x"): False,
    }


def test_tpot_itl_cpu_and_their_ratios() -> None:
    rows = summarize([_rec("stock", 0.1, 0.01, 0.5), _rec("loopbridge", 0.1, 0.02, 1.0)])
    stock, ours = rows
    assert math.isclose(stock["tpot_p50"], 0.01) and math.isclose(ours["tpot_p50"], 0.02)
    assert math.isclose(stock["itl_p50"], 0.01) and math.isclose(stock["itl_max"], 0.03)
    assert math.isclose(ours["itl_max_vs_stock"], 2.0)
    assert math.isclose(ours["tpot_p99_vs_stock"], 2.0)
    assert math.isclose(stock["cpu_per_request"], 0.05)
    assert math.isclose(ours["cpu_per_request_vs_stock"], 2.0)
    assert math.isclose(ours["ttft_p50_vs_stock"], 1.0)
    # A baseline of (about) zero, such as the ITL p50 of events read together: no ratio.
    zeros = _rec("stock", 0.1, 0.0, 0.5)
    assert math.isnan(summarize([zeros, _rec("loopbridge", 0.1, 0.01, 1.0)])[1]["itl_p50_vs_stock"])
    (line,) = headlines(rows)
    assert line.startswith("stream-c2: loopbridge vs stock: TTFT p50 1.00x")
    assert "ITL p99 2.00x" in line and "CPU/req 2.00x" in line and "0 errors" in line
    table = markdown(rows, _meta())
    assert "2 GPUs (NVIDIA H100)" in table and line in table
    assert "| stream-c2 | loopbridge | 10.00 | 100 / 100 / 100 | 20.0 / 20.0 / 20.0 |" in table


def _meta() -> dict[str, Any]:
    return {
        "versions": {"vllm": "0.0", "torch": "0"},
        "python": "3",
        "prompt_len": 8,
        "output_len": 4,
        "requests": 10,
        "rounds": 1,
        "argv": [],
        "gpus": [{"name": "NVIDIA H100"}, {"name": "NVIDIA H100"}],
    }


def test_max_model_len_default_with_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def model(context: int) -> str:
        d = tmp_path / f"m{context}"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
        return str(d)

    long = parse_args(["--model", model(131072)])
    assert long.max_model_len == 4096
    assert "max_model_len 4096 (the model's own is 131072" in capsys.readouterr().err
    short = parse_args(["--model", model(1024)])
    assert short.max_model_len == 1024 and capsys.readouterr().err == ""
    assert parse_args(["--model", model(131072), "--max-model-len", "9000"]).max_model_len == 9000
    # Lognormal lengths reach 4x their medians: the default makes room for the longest.
    wide = parse_args(["--model", model(32768), "--lengths", "lognormal", "--prompt-len", "2048"])
    assert wide.max_model_len == 4 * 2048 + 4 * 32
    with pytest.raises(SystemExit):
        parse_args(["--model", model(512), "--prompt-len", "600"])
    assert "exceeds the model's context (512)" in capsys.readouterr().err


def test_each_jobs_ttft_is_reported_in_round_order() -> None:
    """A mode whose second job ran a step slower throughout: the pooled p99 takes the
    slow job's tail, and the job table shows which job it was."""
    from loopbridge_bench.common.summary import job_lines

    def job(round_: int, ttft: float, cpu: float, client: float | None) -> JobRecord:
        r = _rec("loopbridge", ttft, 0.01, cpu)
        r.round = round_
        r.client_cpu_s = client
        return r

    slow = job(1, 0.016, 0.055, 0.012)  # ten requests: 5.5 ms and 1.2 ms of CPU each
    rows = summarize([_rec("stock", 0.011, 0.01, 1.0), job(0, 0.011, 0.044, None), slow])
    ours = rows[1]
    assert ours["ttft_rounds"] == [[0.011, 0.011], [0.016, 0.016]]
    assert math.isnan(ours["cpu_rounds"][0][1])  # the client's CPU was not measured
    assert [round(x, 6) for x in ours["cpu_rounds"][1]] == [0.0055, 0.0012]
    assert math.isclose(ours["cpu_rounds"][0][0], 0.0044)
    assert math.isclose(ours["ttft_p99"], 0.016)
    lines = job_lines(rows)
    assert lines[0] == "" and lines[1].startswith("Each job in round order: TTFT p50 / p99")
    expected = "| stream-c2 | loopbridge | 11.0 / 11.0 (4.4, -), 16.0 / 16.0 (5.5, 1.2) |"
    assert lines[-1] == expected
    assert not any("| stock |" in line for line in lines)  # one job: nothing to compare
    assert expected in markdown(rows, _meta())
    # A job with no CPU figure at all gets no brackets.
    slow.server_cpu_s = slow.client_cpu_s = None
    assert job_lines(summarize([job(0, 0.011, 0.044, None), slow]))[-1].endswith(
        "11.0 / 11.0 (4.4, -), 16.0 / 16.0 |"
    )
