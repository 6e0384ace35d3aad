"""Executable model of vLLM's data-parallel (MoE) engine-core protocol.

The model is pure and deterministic: a :class:`World` is an immutable value
and :func:`successors` lists every state one atomic action can lead to.  It
knows nothing of threads; the nondeterminism of the real system (the input
thread merging the client and coordinator sockets in any order, slow stats
tasks, the client fanning utilities out concurrently) is expressed as a
choice between enabled actions.

Granularity.  A rank's busy loop is cut at the points where the real code
can block or where another component can observe it:

* the input phase handles one message at a time (either channel's head);
* a forward (real or dummy) enters the ``fwd`` collective; the finish-sync
  all-reduce, the resume barrier and a user ``collective_rpc`` are the
  ``sync``, ``barrier`` and ``rpc`` collectives;
* a collective completes atomically once every rank has entered it, and the
  code that runs after it up to the next blocking point runs with it.

Everything between two such points touches only the rank's own state and
appends to FIFO channels, so running it atomically hides no behaviour.

The single-rank transition functions (:func:`handle_message`,
:func:`begin_step`, :func:`after_forward`, :func:`after_sync`,
:func:`after_barrier`, :func:`fire_idle_callbacks`) are public so that the
conformance tests can replay them against the real ``DPEngineCoreProc``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal, TypeVar, Union

from loopbridge_vllm.dp import Decision, FilterView, decide

_T = TypeVar("_T")
_SLOTS: dict[type, tuple[str, ...]] = {}


def replace(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the frozen, slotted state classes, without
    re-running ``__init__`` (the search spends most of its time here)."""
    cls = type(obj)
    names = _SLOTS.get(cls)
    if names is None:
        names = _SLOTS[cls] = tuple(cls.__slots__)  # type: ignore[attr-defined]
    new = object.__new__(cls)
    for name in names:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(obj, name))
    return new


PauseMode = Literal["keep", "abort", "wait"]
Kind = Literal["fwd", "sync", "barrier", "rpc"]
Method = Literal["pause", "resume", "rpc"]


class Pause(IntEnum):
    """Mirror of vLLM's ``PauseState``."""

    UNPAUSED = 0
    PAUSED_NEW = 1
    PAUSED_ALL = 2


# --------------------------------------------------------------------------
# Variants


@dataclass(frozen=True, kw_only=True)
class Variant:
    """Which protocol the ranks, coordinator and client follow (fields by keyword only)."""

    name: str
    description: str
    #: pause completes at once on an idle rank (pre two-phase)
    fast_path_pause: bool
    #: START_DP_WAVE guard: none, ``pause_state != UNPAUSED`` or the consensus latch
    start_guard: Literal["none", "pause_state", "latch"]
    #: the front-end sends FIRST_REQ through its stats task (0.32 and older)
    first_req: bool
    #: ``DPEngineCoreProc.add_request`` of 0.32 (arm only for a stale wave) or 0.33
    add_rule: Literal["v032", "v033"]
    #: ``abort``/``wait`` pauses reject new requests (0.33 ``pause_generation``)
    admission_reject: bool
    #: resume: local unpause, 0.32/0.33 barrier, or barrier keyed on pause state
    resume: Literal["local", "barrier", "idempotent"]
    #: the pause-aware filter sits in front of the request handler
    filtered: bool = False

    @property
    def two_phase(self) -> bool:
        return not self.fast_path_pause

    @property
    def pause_method(self) -> str:
        return "pause_generation" if self.admission_reject else "pause_scheduler"


_A = Variant(
    name="a",
    description="pre two-phase: idle fast-path pause",
    fast_path_pause=True,
    start_guard="none",
    first_req=True,
    add_rule="v032",
    admission_reject=False,
    resume="local",
)
_C = Variant(
    name="c",
    description="vLLM 0.32.0 as installed",
    fast_path_pause=False,
    start_guard="latch",
    first_req=True,
    add_rule="v032",
    admission_reject=False,
    resume="barrier",
)
_C33 = Variant(
    name="c33",
    description="vLLM 0.33.0 two-phase",
    fast_path_pause=False,
    start_guard="latch",
    first_req=False,
    add_rule="v033",
    admission_reject=True,
    resume="barrier",
)
# The others are one of these with one change, as their descriptions say.
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        _A,
        dataclasses.replace(
            _A,
            name="b",
            description="(a) + ignore START_DP_WAVE while paused",
            start_guard="pause_state",
        ),
        _C,
        _C33,
        dataclasses.replace(
            _C, name="d", description="(c) + idempotent resume", resume="idempotent"
        ),
        dataclasses.replace(
            _C33, name="d33", description="(c33) + idempotent resume", resume="idempotent"
        ),
        dataclasses.replace(
            _C, name="e", description="vLLM 0.32.0 + pause-aware filter", filtered=True
        ),
        # Checked in the model only: install_filter() refuses 0.33 (see _patch).
        dataclasses.replace(
            _C33,
            name="e33",
            description="vLLM 0.33.0 + pause-aware filter (model only)",
            filtered=True,
        ),
    )
}


# --------------------------------------------------------------------------
# Messages


@dataclass(frozen=True, slots=True)
class Add:
    """Client -> engine ADD, stamped with the client's (possibly stale) wave."""

    req: int
    wave: int


@dataclass(frozen=True, slots=True)
class Abort:
    """Client -> engine ABORT."""

    req: int


@dataclass(frozen=True, slots=True)
class Utility:
    """Client -> engine UTILITY; ``op`` indexes the client's script."""

    op: int
    method: Method
    mode: PauseMode = "keep"


@dataclass(frozen=True, slots=True)
class StartDPWave:
    """Coordinator -> engines START_DP_WAVE(wave, exclude_engine_index)."""

    wave: int
    exclude: int | None


@dataclass(frozen=True, slots=True)
class WaveComplete:
    """Engine (rank 0) -> coordinator ``wave_complete``."""

    wave: int


@dataclass(frozen=True, slots=True)
class StartWave:
    """Engine -> coordinator ``start_wave``."""

    wave: int


@dataclass(frozen=True, slots=True)
class FirstReq:
    """Front-end stats task -> coordinator FIRST_REQ(engine, client wave)."""

    engine: int
    wave: int


@dataclass(frozen=True, slots=True)
class Publication:
    """Coordinator -> front-end ``(counts, wave, running)``."""

    wave: int
    running: bool


ClientMsg = Union[Add, Abort, Utility]  # noqa: UP007  (runtime alias on 3.10)
EngineMsg = Union[WaveComplete, StartWave]  # noqa: UP007
InMsg = Union[Add, Abort, Utility, StartDPWave]  # noqa: UP007


# --------------------------------------------------------------------------
# State


@dataclass(frozen=True, slots=True)
class Req:
    """A request in a rank's scheduler."""

    id: int
    remaining: int
    started: bool = False


@dataclass(frozen=True, slots=True)
class Blocked:
    """A rank blocked in a collective, with what it contributed to it."""

    kind: Kind
    unfinished: bool = False
    pending: bool = False
    op: int = -1
    real: bool = False


@dataclass(frozen=True, slots=True)
class Rank:
    running: bool = False  # engines_running
    was_running: bool = False  # captured at the top of the busy loop
    wave: int = 0  # current_wave
    step: int = 0  # step_counter (canonicalised, see _canon_step)
    pause: Pause = Pause.UNPAUSED
    pending_pause: bool = False
    ignore_wave: bool = False  # ignore_start_dp_wave (the consensus latch)
    reject_new: bool = False  # reject_new_requests (0.33)
    reqs: tuple[Req, ...] = ()
    callbacks: tuple[int, ...] = ()  # idle callbacks: ops of pending pause replies
    blocked: Blocked | None = None
    cin: tuple[ClientMsg, ...] = ()  # client socket, FIFO
    coin: tuple[StartDPWave, ...] = ()  # coordinator socket, FIFO
    held: tuple[InMsg, ...] = ()  # set aside by the filter, FIFO


@dataclass(frozen=True, slots=True)
class Coordinator:
    wave: int = 0
    running: bool = False
    front: tuple[FirstReq, ...] = ()
    back: tuple[tuple[EngineMsg, ...], ...] = ()  # one FIFO per engine


# Request status as the client sees it.
UNSENT, IN_ENGINE, FINISHED, ABORTED, REJECTED = range(5)


@dataclass(frozen=True, slots=True)
class Client:
    wave: int = 0
    running: bool = False
    stage: int = 0  # script ops issued
    waiting: frozenset[int] = frozenset()  # ranks yet to reply to the last op
    errors: tuple[str, ...] = ()
    req_status: tuple[int, ...] = ()
    req_rank: tuple[int, ...] = ()
    aborts_left: int = 0
    first_req: tuple[int, ...] = ()  # inproc socket to the stats task
    pub: tuple[Publication, ...] = ()  # coordinator publications not yet read


@dataclass(frozen=True, slots=True)
class World:
    ranks: tuple[Rank, ...]
    coord: Coordinator
    client: Client


@dataclass(frozen=True)
class Config:
    """Bounds and knobs of one model instance."""

    variant: Variant
    ranks: int = 2
    requests: int = 1
    req_len: int = 1
    pauses: int = 1
    weight_updates: int = 1
    resumes: int = 1  # resumes per pause; 2 = one duplicate resume
    mode: PauseMode = "keep"
    sync_interval: int = 2
    aborts: int = 0
    #: when requests may be sent: any, before, during or after the pause
    when: Literal["any", "before", "during", "after"] = "any"
    #: the front-end's stats task forwards FIRST_REQ at once (no starved task)
    prompt_first_req: bool = False
    #: which ranks each pause reaches, as successive pause utilities (each
    #: waited for before the next); empty = one pause to every rank.  The
    #: weight update and resume go to the union: the ranks this orchestrator
    #: manages (a hybrid/external-LB API server manages only its own).
    pause_targets: tuple[tuple[int, ...], ...] = ()
    script: tuple[Utility, ...] = field(init=False)
    #: the ranks each script op is sent to
    targets: tuple[frozenset[int], ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.ranks < 2:
            raise ValueError("a DP group needs at least 2 ranks")
        if self.sync_interval < 1 or self.req_len < 1:
            raise ValueError("sync_interval and req_len must be >= 1")
        if min(self.requests, self.pauses, self.weight_updates, self.aborts) < 0:
            raise ValueError("bounds must be non-negative")
        if self.resumes < 0 or self.mode not in ("keep", "abort", "wait"):
            raise ValueError(f"bad resumes/mode: {self.resumes!r}/{self.mode!r}")
        everyone = frozenset(range(self.ranks))
        groups = [frozenset(g) for g in self.pause_targets] or [everyone]
        if any(not g or not g <= everyone for g in groups):
            raise ValueError(f"pause targets must be non-empty sets of ranks: {self.pause_targets}")
        managed = frozenset().union(*groups)
        ops: list[Utility] = []
        targets: list[frozenset[int]] = []
        for _ in range(self.pauses):
            for g in groups:
                ops.append(Utility(len(ops), "pause", self.mode))
                targets.append(g)
            for _ in range(self.weight_updates):
                ops.append(Utility(len(ops), "rpc"))
                targets.append(managed)
            for _ in range(self.resumes):
                ops.append(Utility(len(ops), "resume"))
                targets.append(managed)
        object.__setattr__(self, "script", tuple(ops))
        object.__setattr__(self, "targets", tuple(targets))

    @property
    def symmetric(self) -> bool:
        """Ranks 1..N-1 are interchangeable (not when pauses single some out)."""
        return not self.pause_targets

    def may_send(self, stage: int, waiting: bool) -> bool:
        """Whether the request window is open at this point of the script."""
        if self.when == "any" or not self.script:
            return True
        first_resume = next((u.op for u in self.script if u.method == "resume"), len(self.script))
        if self.when == "before":
            return stage == 0
        if self.when == "during":
            return 1 <= stage <= first_resume
        return stage > first_resume and not waiting  # after: first resume done


def initial(cfg: Config) -> World:
    n = cfg.ranks
    return World(
        ranks=tuple(Rank() for _ in range(n)),
        coord=Coordinator(back=tuple(() for _ in range(n))),
        client=Client(
            req_status=(UNSENT,) * cfg.requests,
            req_rank=(-1,) * cfg.requests,
            aborts_left=cfg.aborts,
        ),
    )


# --------------------------------------------------------------------------
# Single-rank semantics


@dataclass(frozen=True, slots=True)
class Effects:
    """What a rank transition sends to other components."""

    to_coord: tuple[EngineMsg, ...] = ()
    replies: tuple[tuple[int, bool], ...] = ()  # (op, ok)
    req_done: tuple[tuple[int, int], ...] = ()  # (req, status)

    def __add__(self, other: Effects) -> Effects:
        return Effects(
            self.to_coord + other.to_coord,
            self.replies + other.replies,
            self.req_done + other.req_done,
        )


NO_EFFECTS = Effects()


def has_unfinished(r: Rank) -> bool:
    """``scheduler.has_unfinished_requests()``: a paused scheduler hides its queue."""
    if r.pause == Pause.UNPAUSED:
        return bool(r.reqs)
    if r.pause == Pause.PAUSED_NEW:
        return any(q.started for q in r.reqs)
    return False


def has_work(r: Rank) -> bool:
    return r.running or has_unfinished(r)


def is_sync_step(step: int, interval: int) -> bool:
    return step == 1 or step % interval == 0


def _canon_step(step: int, interval: int) -> int:
    # Only "== 1" and "mod interval" are observable, so fold large counters.
    if step > interval:
        return interval + (step - interval) % interval
    return step


def handle_message(
    v: Variant, idx: int, r: Rank, msg: InMsg, req_len: int = 1
) -> tuple[Rank, Effects]:
    """``DPEngineCoreProc._handle_client_request`` for one message."""
    if isinstance(msg, StartDPWave):
        if v.start_guard == "latch" and r.ignore_wave:
            return r, NO_EFFECTS
        if v.start_guard == "pause_state" and r.pause != Pause.UNPAUSED:
            return r, NO_EFFECTS
        if msg.exclude != idx and msg.wave >= r.wave:
            return replace(r, wave=msg.wave, running=True), NO_EFFECTS
        return r, NO_EFFECTS
    if isinstance(msg, Add):
        return _add(v, r, msg, req_len)
    if isinstance(msg, Abort):
        kept = tuple(q for q in r.reqs if q.id != msg.req)
        if len(kept) == len(r.reqs):
            return r, NO_EFFECTS
        return replace(r, reqs=kept), Effects(req_done=((msg.req, ABORTED),))
    return _utility(v, r, msg)


def _add(v: Variant, r: Rank, msg: Add, req_len: int) -> tuple[Rank, Effects]:
    if v.admission_reject and r.reject_new:
        return r, Effects(req_done=((msg.req, REJECTED),))
    r = replace(r, reqs=r.reqs + (Req(msg.req, req_len),))
    if v.add_rule == "v032":
        if msg.wave > r.wave:
            return replace(r, wave=msg.wave), NO_EFFECTS
        if msg.wave < r.wave and not r.running and r.pause == Pause.UNPAUSED:
            return replace(r, running=True), Effects(to_coord=(StartWave(r.wave),))
        return r, NO_EFFECTS
    if msg.wave > r.wave:
        r = replace(r, wave=msg.wave)
    if not r.running and r.pause == Pause.UNPAUSED:
        return replace(r, running=True), Effects(to_coord=(StartWave(r.wave),))
    return r, NO_EFFECTS


def _utility(v: Variant, r: Rank, u: Utility) -> tuple[Rank, Effects]:
    ok = Effects(replies=((u.op, True),))
    if u.method == "rpc":
        return replace(r, blocked=Blocked("rpc", op=u.op)), NO_EFFECTS
    if u.method == "pause":
        eff = NO_EFFECTS
        if u.mode == "abort" and r.reqs:
            eff = Effects(req_done=tuple((q.id, ABORTED) for q in r.reqs))
            r = replace(r, reqs=())
        state = Pause.PAUSED_ALL if u.mode == "keep" else Pause.PAUSED_NEW
        r = replace(r, pause=state, reject_new=v.admission_reject and u.mode != "keep")
        if v.fast_path_pause:
            if not has_work(r):
                return r, eff + ok
            return replace(r, callbacks=r.callbacks + (u.op,)), eff
        r = replace(r, pending_pause=True, running=True, callbacks=r.callbacks + (u.op,))
        return r, eff
    # resume
    if v.resume == "local":
        return replace(r, pause=Pause.UNPAUSED, reject_new=False), ok
    if v.resume == "idempotent" and r.pause == Pause.UNPAUSED:
        return r, ok
    if r.pending_pause or (r.running and r.ignore_wave):
        return r, Effects(replies=((u.op, False),))
    if r.running:
        return r, ok
    r = replace(r, pause=Pause.UNPAUSED, reject_new=False, ignore_wave=False)
    return replace(r, blocked=Blocked("barrier", unfinished=has_unfinished(r), op=u.op)), NO_EFFECTS


def fire_idle_callbacks(r: Rank) -> tuple[Rank, Effects]:
    """``_notify_idle_state_callbacks``: every pending pause completes."""
    # The real list is popped from the end; replies carry their op so order is moot.
    return replace(r, callbacks=()), Effects(replies=tuple((op, True) for op in r.callbacks))


def begin_step(r: Rank) -> Rank:
    """Leave the input phase with work: enter a real or a dummy forward."""
    return replace(r, blocked=Blocked("fwd", real=has_unfinished(r)))


def after_forward(v: Variant, idx: int, r: Rank, interval: int) -> tuple[Rank, Effects]:
    """Forward done: finish requests, count the step, maybe enter the sync."""
    assert r.blocked is not None and r.blocked.kind == "fwd"
    eff = NO_EFFECTS
    if r.blocked.real:
        reqs: list[Req] = []
        done: list[tuple[int, int]] = []
        for q in r.reqs:
            scheduled = r.pause == Pause.UNPAUSED or (r.pause == Pause.PAUSED_NEW and q.started)
            if not scheduled:
                reqs.append(q)
            elif q.remaining <= 1:
                done.append((q.id, FINISHED))
            else:
                reqs.append(Req(q.id, q.remaining - 1, True))
        r = replace(r, reqs=tuple(reqs))
        eff = Effects(req_done=tuple(done))
    step = r.step + 1
    if is_sync_step(step, interval):
        blocked = Blocked("sync", unfinished=has_unfinished(r), pending=r.pending_pause)
        return replace(r, step=step, blocked=blocked), eff
    r = replace(r, step=_canon_step(step, interval), running=True, blocked=None)
    return _edges(idx, r, eff, mirror=v.two_phase)


def sync_result(contrib: list[tuple[bool, bool]]) -> tuple[bool, bool]:
    """``ParallelConfig.sync_dp_state``: (global unfinished, pause consensus)."""
    n = len(contrib)
    s0 = sum(1 for u, _ in contrib if u)
    s1 = sum(1 for _, p in contrib if p)
    return s0 > 0 or s1 % n != 0, s1 == n


def after_sync(
    v: Variant, idx: int, r: Rank, result: tuple[bool, bool], interval: int
) -> tuple[Rank, Effects]:
    unfinished, consensus = result
    if consensus:
        r = replace(r, ignore_wave=True, pending_pause=False)
    r = replace(r, running=unfinished, blocked=None, step=_canon_step(r.step, interval))
    return _edges(idx, r, NO_EFFECTS, mirror=v.two_phase)


def _edges(idx: int, r: Rank, eff: Effects, mirror: bool) -> tuple[Rank, Effects]:
    """End of a busy-loop iteration: wave end or running edge, then loop top."""
    if not r.running:
        if idx == 0:
            eff = eff + Effects(to_coord=(WaveComplete(r.wave),))
        r = replace(r, wave=r.wave + 1, step=0)
    elif mirror and idx == 0 and not r.was_running and not r.pending_pause:
        eff = eff + Effects(to_coord=(StartWave(r.wave),))
    return replace(r, was_running=r.running), eff


def after_barrier(r: Rank, any_unfinished: bool) -> tuple[Rank, Effects]:
    assert r.blocked is not None
    op = r.blocked.op
    r = replace(r, blocked=None, running=r.running or any_unfinished)
    return r, Effects(replies=((op, True),))


def after_rpc(r: Rank) -> tuple[Rank, Effects]:
    assert r.blocked is not None
    return replace(r, blocked=None), Effects(replies=((r.blocked.op, True),))


def filter_view(r: Rank) -> FilterView:
    return FilterView(
        paused=r.pause != Pause.UNPAUSED,
        pending_pause=r.pending_pause,
        ignore_start_dp_wave=r.ignore_wave,
        engines_running=r.running,
    )


def filter_message(v: Variant, r: Rank, msg: InMsg) -> Decision:
    """What the pause-aware filter does with ``msg`` (always deliver if absent)."""
    if not v.filtered:
        return Decision.DELIVER
    if isinstance(msg, Utility):
        method = {"pause": v.pause_method, "resume": "resume_scheduler", "rpc": "collective_rpc"}[
            msg.method
        ]
        return decide("UTILITY", method, filter_view(r))
    if isinstance(msg, StartDPWave):
        return decide("START_DP_WAVE", None, filter_view(r))
    return decide("ADD" if isinstance(msg, Add) else "ABORT", None, filter_view(r))


# --------------------------------------------------------------------------
# Global transitions

Label = tuple[str, str]  # (actor, what happened)


def _apply(w: World, idx: int, r: Rank, eff: Effects) -> World:
    ranks = w.ranks[:idx] + (r,) + w.ranks[idx + 1 :]
    return _effects(replace(w, ranks=ranks), idx, eff)


def _effects(w: World, idx: int, eff: Effects) -> World:
    coord, client = w.coord, w.client
    if eff.to_coord:
        back = list(coord.back)
        back[idx] = back[idx] + eff.to_coord
        coord = replace(coord, back=tuple(back))
    if eff.replies:
        errors = client.errors
        for op, ok in eff.replies:
            if not ok:
                errors = errors + (f"op {op} failed on rank {idx}",)
        client = replace(client, waiting=client.waiting - {idx}, errors=errors)
    if eff.req_done:
        st = list(client.req_status)
        for req, status in eff.req_done:
            st[req] = status
        client = replace(client, req_status=tuple(st))
    return replace(w, coord=coord, client=client)


def _broadcast(w: World, msg: StartDPWave) -> World:
    return replace(w, ranks=tuple(replace(r, coin=r.coin + (msg,)) for r in w.ranks))


def _publish(c: Client, coord: Coordinator) -> Client:
    p = Publication(coord.wave, coord.running)
    last = c.pub[-1] if c.pub else None
    return c if last == p else replace(c, pub=c.pub + (p,))


def _describe(msg: InMsg | EngineMsg | FirstReq) -> str:
    if isinstance(msg, Add):
        return f"ADD r{msg.req} w{msg.wave}"
    if isinstance(msg, Abort):
        return f"ABORT r{msg.req}"
    if isinstance(msg, Utility):
        return f"{msg.method}" + (f"({msg.mode})" if msg.method == "pause" else "")
    if isinstance(msg, StartDPWave):
        ex = "-" if msg.exclude is None else str(msg.exclude)
        return f"START_DP_WAVE w{msg.wave} x{ex}"
    if isinstance(msg, WaveComplete):
        return f"wave_complete w{msg.wave}"
    if isinstance(msg, StartWave):
        return f"start_wave w{msg.wave}"
    return f"FIRST_REQ e{msg.engine} w{msg.wave}"


def _rank_summary(r: Rank) -> str:
    bits = []
    if r.running:
        bits.append("run")
    if r.pause != Pause.UNPAUSED:
        bits.append("P" + ("all" if r.pause == Pause.PAUSED_ALL else "new"))
    if r.pending_pause:
        bits.append("pend")
    if r.ignore_wave:
        bits.append("latch")
    return f"w{r.wave}" + ("," + ",".join(bits) if bits else "")


def successors(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """Every atomic action enabled in ``w`` and the state it leads to.

    Two kinds of action are forced (they are returned alone): completing a
    collective that every rank has entered, and firing idle callbacks on an
    idle rank.  Both are deterministic, local to the ranks involved, and
    commute with every other action (channel appends, coordinator and client
    steps), so running them first loses no reachable quiescent state.
    """
    forced = _forced(cfg, w)
    if forced:
        return forced
    return _rank_steps(cfg, w) + _coordinator_steps(cfg, w) + _client_steps(cfg, w)


def _forced(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """The forced action, alone, if one is enabled (see :func:`successors`); else none."""
    # A collective everyone has entered.
    kinds = {r.blocked.kind if r.blocked else None for r in w.ranks}
    if len(kinds) == 1 and None not in kinds:
        return [_complete(cfg, w)]
    for i, r in enumerate(w.ranks):
        if r.blocked is None and r.callbacks and not has_work(r):
            nr, eff = fire_idle_callbacks(r)
            ops = ",".join(str(o) for o in r.callbacks)
            return [((f"r{i}", f"idle: pause reply op{ops}"), _apply(w, i, nr, eff))]
    return []


def _rank_steps(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """Each rank's next message (from each of its channels) and its next step."""
    v = cfg.variant
    out: list[tuple[Label, World]] = []
    for i, r in enumerate(w.ranks):
        if r.blocked is not None:
            continue
        for chan in ("cin", "coin", "held"):
            queue: tuple[InMsg, ...] = getattr(r, chan)
            if not queue:
                continue
            msg = queue[0]
            r2 = replace(r, **{chan: queue[1:]})
            d = filter_message(v, r2, msg)
            if d is Decision.HOLD:
                if chan != "held":
                    out.append(
                        (
                            (f"r{i}", f"filter holds {_describe(msg)}"),
                            _apply(w, i, replace(r2, held=r2.held + (msg,)), NO_EFFECTS),
                        )
                    )
                continue
            if d is Decision.DROP:
                eff = Effects(replies=((msg.op, True),)) if isinstance(msg, Utility) else NO_EFFECTS
                out.append(((f"r{i}", f"filter drops {_describe(msg)}"), _apply(w, i, r2, eff)))
                continue
            nr, eff = handle_message(v, i, r2, msg, cfg.req_len)
            text = ("filter releases " if chan == "held" else "") + _describe(msg)
            if nr.blocked is not None:
                text += f" -> enter {nr.blocked.kind}"
            else:
                text += f" [{_rank_summary(nr)}]"
            out.append(((f"r{i}", text), _apply(w, i, nr, eff)))
        if has_work(r):
            nr = begin_step(r)
            assert nr.blocked is not None
            what = "real fwd" if nr.blocked.real else "dummy fwd"
            out.append(
                ((f"r{i}", f"enter {what} (step {r.step + 1})"), _apply(w, i, nr, NO_EFFECTS))
            )

    return out


def _coordinator_steps(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """The coordinator's next message from the front-end and from each engine, and its
    publication when it tells the client something new."""
    n = cfg.ranks
    out: list[tuple[Label, World]] = []
    c, co = w.client, w.coord
    if co.front:
        fr, rest_f = co.front[0], co.front[1:]
        nw = replace(w, coord=replace(co, front=rest_f))
        if not co.running:
            excl = None if fr.wave < co.wave else fr.engine
            nw = _broadcast(nw, StartDPWave(co.wave, excl))
            text = f"{_describe(fr)} -> START_DP_WAVE w{co.wave}"
        else:
            text = f"{_describe(fr)} ignored (running)"
        out.append((("coord", text), nw))
    for e in range(n):
        if not co.back[e]:
            continue
        m = co.back[e][0]
        back = co.back[:e] + (co.back[e][1:],) + co.back[e + 1 :]
        nco = replace(co, back=back)
        text = f"{_describe(m)} from r{e}"
        bcast: StartDPWave | None = None
        if isinstance(m, WaveComplete):
            if co.wave <= m.wave:
                nco = replace(nco, wave=m.wave + 1, running=False)
                text += f" -> w{m.wave + 1} idle"
        elif m.wave > co.wave or (m.wave == co.wave and not co.running):
            nco = replace(nco, wave=m.wave, running=True)
            bcast = StartDPWave(m.wave, e)
            text += f" -> START_DP_WAVE w{m.wave} x{e}"
        nw = replace(w, coord=nco)
        if (nco.wave, nco.running) != (co.wave, co.running):
            nw = replace(nw, client=_publish(nw.client, nco))
        if bcast is not None:
            nw = _broadcast(nw, bcast)
        out.append((("coord", text), nw))
    # A periodic publication matters only when it tells the client something new.
    view = c.pub[-1] if c.pub else Publication(c.wave, c.running)
    if view != Publication(co.wave, co.running):
        out.append(
            (
                ("coord", f"publish w{co.wave} run={int(co.running)}"),
                replace(w, client=_publish(c, co)),
            )
        )

    return out


def _client_steps(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """The client's script, its stats task, then its optional requests and aborts."""
    c, co, n = w.client, w.coord, cfg.ranks
    out: list[tuple[Label, World]] = []
    if not c.waiting and c.stage < len(cfg.script):
        u, to = cfg.script[c.stage], cfg.targets[c.stage]
        nw = replace(
            w,
            ranks=tuple(
                replace(r, cin=r.cin + (u,)) if i in to else r for i, r in enumerate(w.ranks)
            ),
            client=replace(c, stage=c.stage + 1, waiting=to),
        )
        whom = "all" if len(to) == n else ",".join(f"r{i}" for i in sorted(to))
        out.append((("client", f"send {_describe(u)} to {whom}"), nw))
    # The stats task polls the FIRST_REQ socket and the publication socket
    # together (``core_client.py``, run_engine_stats_update_task): while the
    # client believes the engines idle and both are ready it forwards the
    # FIRST_REQ first; otherwise the poller lists the publication socket
    # first and the publications are drained first.
    both = bool(c.first_req) and bool(c.pub)
    if c.first_req and (not both or not c.running):
        e = c.first_req[0]
        nc = replace(c, first_req=c.first_req[1:], running=True)
        nco = replace(co, front=co.front + (FirstReq(e, c.wave),))
        out.append(
            (("client", f"stats task: FIRST_REQ e{e} w{c.wave}"), replace(w, client=nc, coord=nco))
        )
    if c.pub and (not both or c.running):
        p = c.pub[0]
        out.append(
            (
                ("client", f"stats task: got w{p.wave} run={int(p.running)}"),
                replace(w, client=replace(c, pub=c.pub[1:], wave=p.wave, running=p.running)),
            )
        )
    out.extend(_optional_client(cfg, w))
    return out


def _optional_client(cfg: Config, w: World) -> list[tuple[Label, World]]:
    """Client actions it may or may not take: sending requests and aborts."""
    c, v = w.client, cfg.variant
    out: list[tuple[Label, World]] = []
    # Requests are interchangeable, so only the lowest unsent one is sent.
    req = next((i for i, s in enumerate(c.req_status) if s == UNSENT), None)
    if req is not None and cfg.may_send(c.stage, bool(c.waiting)):
        for e in range(cfg.ranks):
            st = c.req_status[:req] + (IN_ENGINE,) + c.req_status[req + 1 :]
            rk = c.req_rank[:req] + (e,) + c.req_rank[req + 1 :]
            nc = replace(c, req_status=st, req_rank=rk)
            fr = ""
            coord = w.coord
            if v.first_req and not c.running:
                if cfg.prompt_first_req:
                    nc = replace(nc, running=True)
                    coord = replace(coord, front=coord.front + (FirstReq(e, c.wave),))
                    fr = " +FIRST_REQ fwd"
                else:
                    nc = replace(nc, first_req=nc.first_req + (e,))
                    fr = " +FIRST_REQ"
            r = w.ranks[e]
            ranks = w.ranks[:e] + (replace(r, cin=r.cin + (Add(req, c.wave),)),) + w.ranks[e + 1 :]
            out.append(
                (
                    ("client", f"ADD r{req} w{c.wave} -> e{e}{fr}"),
                    replace(w, ranks=ranks, client=nc, coord=coord),
                )
            )
    if c.aborts_left:
        for req, s in enumerate(c.req_status):
            if s != IN_ENGINE:
                continue
            e = c.req_rank[req]
            r = w.ranks[e]
            ranks = w.ranks[:e] + (replace(r, cin=r.cin + (Abort(req),)),) + w.ranks[e + 1 :]
            out.append(
                (
                    ("client", f"ABORT r{req} -> e{e}"),
                    replace(w, ranks=ranks, client=replace(c, aborts_left=c.aborts_left - 1)),
                )
            )
    return out


def is_optional(label: Label) -> bool:
    """Actions nothing forces: new requests, aborts, timer-driven publications."""
    actor, text = label
    if actor == "client":
        return text.startswith(("ADD", "ABORT"))
    return actor == "coord" and text.startswith("publish")


def _complete(cfg: Config, w: World) -> tuple[Label, World]:
    first = w.ranks[0].blocked
    assert first is not None
    kind = first.kind
    v = cfg.variant
    blocked = [r.blocked for r in w.ranks]
    ranks: list[Rank] = []
    effs: list[Effects] = []
    text: str = kind
    if kind == "sync":
        res = sync_result([(b.unfinished, b.pending) for b in blocked if b is not None])
        text = f"sync -> unfinished={int(res[0])} consensus={int(res[1])}"
    elif kind == "barrier":
        anyu = any(b.unfinished for b in blocked if b is not None)
        text = f"resume barrier -> unfinished={int(anyu)}"
    elif kind == "fwd":
        text = "fwd " + "/".join("real" if b is not None and b.real else "dummy" for b in blocked)
    else:
        text = "collective_rpc done"
    for i, r in enumerate(w.ranks):
        if kind == "fwd":
            nr, eff = after_forward(v, i, r, cfg.sync_interval)
        elif kind == "sync":
            nr, eff = after_sync(v, i, r, res, cfg.sync_interval)
        elif kind == "barrier":
            nr, eff = after_barrier(r, anyu)
        else:
            nr, eff = after_rpc(r)
        ranks.append(nr)
        effs.append(eff)
    nw = replace(w, ranks=tuple(ranks))
    for i, eff in enumerate(effs):
        nw = _effects(nw, i, eff)
    return (("*", text), nw)


# --------------------------------------------------------------------------
# Canonical form


def _shift_msg(m: object, d: int) -> object:
    if isinstance(m, (Add, StartDPWave, WaveComplete, StartWave, FirstReq, Publication)):
        return replace(m, wave=m.wave - d)
    return m


def canonical(w: World, by_symmetry: bool = True) -> World:
    """The representative of ``w``: waves shifted to start at 0, ranks 1.. sorted
    (only when ``by_symmetry``: the ranks run identical code and scripts)."""
    shifted = _shift_waves(w)
    return symmetric(shifted) if by_symmetry else shifted


def _shift_waves(w: World) -> World:
    """Shift every wave number so that the smallest is 0 (only differences matter)."""
    waves = [w.coord.wave, w.client.wave]
    for r in w.ranks:
        waves.append(r.wave)
        waves.extend(m.wave for m in r.cin if isinstance(m, Add))
        waves.extend(m.wave for m in r.coin)
        waves.extend(m.wave for m in r.held if isinstance(m, (Add, StartDPWave)))
    for q in w.coord.back:
        waves.extend(m.wave for m in q)
    waves.extend(m.wave for m in w.coord.front)
    waves.extend(p.wave for p in w.client.pub)
    d = min(waves)
    if d == 0:
        return w
    ranks = tuple(
        replace(
            r,
            wave=r.wave - d,
            cin=tuple(_shift_msg(m, d) for m in r.cin),
            coin=tuple(replace(m, wave=m.wave - d) for m in r.coin),
            held=tuple(_shift_msg(m, d) for m in r.held),
        )
        for r in w.ranks
    )
    coord = replace(
        w.coord,
        wave=w.coord.wave - d,
        front=tuple(replace(m, wave=m.wave - d) for m in w.coord.front),
        back=tuple(tuple(replace(m, wave=m.wave - d) for m in q) for q in w.coord.back),
    )
    client = replace(
        w.client,
        wave=w.client.wave - d,
        pub=tuple(replace(p, wave=p.wave - d) for p in w.client.pub),
    )
    return World(ranks, coord, client)


def _rank_key(r: Rank) -> tuple[int, ...]:
    b = r.blocked
    return (
        r.running,
        r.was_running,
        r.wave,
        r.step,
        int(r.pause),
        r.pending_pause,
        r.ignore_wave,
        r.reject_new,
        len(r.reqs),
        len(r.callbacks),
        -1 if b is None else ("fwd", "sync", "barrier", "rpc").index(b.kind),
        len(r.cin),
        len(r.coin),
        len(r.held),
        sum(q.remaining for q in r.reqs),
    )


def _relabel_msg(m: InMsg, perm: tuple[int, ...]) -> InMsg:
    if isinstance(m, StartDPWave) and m.exclude is not None:
        return StartDPWave(m.wave, perm[m.exclude])
    return m


def symmetric(w: World) -> World:
    """Sort ranks 1..N-1 into a canonical order (rank 0 alone reports waves).

    Ranks other than 0 run identical code and are addressed only by index, so
    renaming them, consistently everywhere an index appears, gives a state
    with the same behaviour.  Ties in the sort key only cost reduction.
    """
    n = len(w.ranks)
    if n < 3:
        return w
    order = sorted(range(1, n), key=lambda i: _rank_key(w.ranks[i]))
    if order == list(range(1, n)):
        return w
    # perm[old] = new
    perm_l = [0] * n
    for new, old in enumerate(order, 1):
        perm_l[old] = new
    perm = tuple(perm_l)
    ranks = tuple(
        replace(
            w.ranks[old],
            coin=tuple(_relabel_msg(m, perm) for m in w.ranks[old].coin),
            held=tuple(_relabel_msg(m, perm) for m in w.ranks[old].held),
        )
        for old in [0] + order
    )
    coord = replace(
        w.coord,
        back=tuple(w.coord.back[old] for old in [0] + order),
        front=tuple(replace(f, engine=perm[f.engine]) for f in w.coord.front),
    )
    c = w.client
    client = replace(
        c,
        waiting=frozenset(perm[i] for i in c.waiting),
        req_rank=tuple(-1 if e < 0 else perm[e] for e in c.req_rank),
        first_req=tuple(perm[e] for e in c.first_req),
        errors=c.errors,
    )
    return World(ranks, coord, client)
