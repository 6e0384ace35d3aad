"""SGLang's ``TokenizerManager`` behind a loop-affine proxy that any thread or loop may use.

A ``TokenizerManager`` is a single-loop object: ``auto_create_handle_loop`` binds it to
the first loop that sends a request and starts ``handle_loop`` there; every request's
``ReqState.event`` is a plain ``asyncio.Event`` that ``handle_loop`` sets on that loop;
``is_pause_cond``, ``model_update_lock`` and ``lora_update_lock`` are asyncio locks, the
control communicators hold asyncio futures, and the ZMQ sockets are ``zmq.asyncio``
sockets of that loop. :func:`tokenizer_manager_proxy` returns a view (an instance of a
generated subclass of ``type(manager)``) that never touches that state from a foreign
thread:

* async members (``pause_generation``, ``update_weights_from_*``, ``flush_cache``, the
  control calls) run on the owner loop;
* ``generate_request`` runs on the owner loop and streams its outputs back through
  loopbridge's batched, back-pressured streams; closing or cancelling the consumer
  closes the generator there, and SGLang aborts the request itself, exactly once;
* a caller's HTTP request (the ``request`` argument) reaches the owner loop as a
  :class:`OwnerSideRequest`: its headers are read directly, and
  ``is_disconnected()`` runs on the loop that owns the request, so SGLang's own
  disconnect checks abort the request in the manager as they do unproxied;
* setup data (``server_args``, ``model_config``, ``tokenizer``, ...) is read directly;
* health reads (``server_status``, ``gracefully_exit``, ``is_pause``, ``is_healthy``,
  ``is_ready``, ``last_receive_tstamp``) are read directly and never wait for the
  owner loop;
* ``abort_request`` is the one sync member that must act on owner-loop state from the
  HTTP thread (SGLang's background abort tasks call it): it is replaced on the
  instance by a thread-safe version that runs the original on the owner loop;
* every other sync member is declared thread-safe below, with the reason, or refused
  with :class:`loopbridge.LoopAffinityError`.

The member list is not written by hand: :func:`surface` derives it from the installed
SGLang (``TokenizerManager`` with its mixins, and the instance's own attributes), and
:data:`RULES` / :data:`SUFFIX_RULES` / :data:`KIND_RULES` classify each member. A member
no rule covers makes :func:`tokenizer_manager_proxy` fail at start-up with
:class:`UnclassifiedMemberError` instead of failing requests later.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from loopbridge import LoopAffinityError, is_proxy, owner_loop, proxy
from loopbridge_adapters.owner import Adoption
from loopbridge_adapters.surface import (
    Member,
    MemberTable,
    Policy,
    Rule,
    UnclassifiedMemberError,
    collect,
)

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

__all__ = [
    "KIND_RULES",
    "RULES",
    "SUFFIX_RULES",
    "Member",
    "OwnerSideRequest",
    "Policy",
    "Rule",
    "UnclassifiedMemberError",
    "adopt_manager",
    "async_generate",
    "bind_owner_loop",
    "classify_surface",
    "is_tokenizer_manager_proxy",
    "surface",
    "tokenizer_manager_proxy",
]

_SET_ONCE = (
    "set in __init__ (or once before serving) and never replaced; SGLang's HTTP layer "
    "reads it on its own thread"
)
_INTERNAL = (
    "owner-side internals called by handle_loop or the request path; the serving layer "
    "never calls them, and they read or mutate per-request state of the owner loop"
)

#: Per-member rules: every sync member and data attribute needs a human decision.
RULES: Mapping[str, Rule] = {
    # -- setup data ------------------------------------------------------------------
    **{
        name: Rule(Policy.STABLE, _SET_ONCE)
        for name in (
            "server_args",
            "model_config",
            "model_path",
            "served_model_name",
            "is_generation",
            "context_len",
            "max_req_input_len",
            "num_reserved_tokens",
            "validate_total_tokens",
            "image_token_id",
            "skip_tokenizer_init",
            "allow_auto_truncate",
            "preferred_sampling_params",
            "incremental_streaming_output",
            "enable_metrics",
            "enable_lora",
            "enable_trace",
            "enable_priority_scheduling",
            "default_priority_value",
            "disaggregation_mode",
            "elastic_worker_count",
            "attn_replica_size",
            "crash_dump_folder",
            "dump_requests_folder",
            "dump_requests_threshold",
            "dump_requests_exclude_meta_keys",
            "tokenizer_ipc_name",
            "sampling_params_class",
            "signal_handler_class",
            "startup_time",
            "initial_weights_loaded",
        )
    },
    "tokenizer": Rule(
        Policy.STABLE,
        "set in __init__; SGLang's OpenAI layer applies chat templates and tokenizes on "
        "the HTTP thread by design (HF tokenizers are thread-safe for encode/decode)",
    ),
    "processor": Rule(Policy.STABLE, "the multimodal processor config, set in __init__"),
    "mm_processor": Rule(
        Policy.STABLE, "set in __init__; the HTTP layer reads its configuration only"
    ),
    "serving_chat_class": Rule(Policy.STABLE, "a property returning a class"),
    "request_logger": Rule(
        Policy.STABLE,
        "set in __init__; the OpenAI layer reads its settings and logs through Python "
        "logging, which is thread-safe",
    ),
    "cuda_vmm_feature_transport": Rule(
        Policy.STABLE, "set last in __init__; the HTTP layer reads whether it is enabled"
    ),
    "positional_embeds_transport": Rule(Policy.STABLE, "set once in __init__"),
    # -- health ------------------------------------------------------------------------
    "server_status": Rule(
        Policy.HEALTH,
        "a plain attribute behind a property; /health and the watchdog read it, so it "
        "must not wait for the owner loop",
    ),
    "gracefully_exit": Rule(Policy.HEALTH, "a bool behind a property, read by /health"),
    "is_pause": Rule(Policy.HEALTH, "a bool behind a property, read by /health"),
    "is_healthy": Rule(Policy.HEALTH, "reads gracefully_exit and server_status"),
    "is_ready": Rule(Policy.HEALTH, "reads is_pause and is_healthy"),
    "last_receive_tstamp": Rule(
        Policy.HEALTH, "a float that handle_loop replaces after every message (atomic)"
    ),
    # -- sync members that are safe from any thread -----------------------------------
    "abort_request": Rule(
        Policy.THREADSAFE,
        "replaced on the instance by tokenizer_manager_proxy: off the owner loop it "
        "schedules SGLang's own abort_request there (call_soon_threadsafe); it returns "
        "None, so nothing is lost by not waiting",
    ),
    "create_abort_task": Rule(
        Policy.THREADSAFE,
        "builds a Starlette BackgroundTasks whose task runs on the HTTP loop, checks "
        "rid membership (atomic) and calls abort_request, which is thread-safe",
    ),
    "config_value": Rule(
        Policy.THREADSAFE,
        "reads an attribute or the process-wide config bags, which are written only "
        "at start-up and by record_config_updates",
    ),
    "get_elastic_ep_state": Rule(Policy.THREADSAFE, "builds a dict from plain attributes"),
    "set_startup_time": Rule(
        Policy.THREADSAFE, "stores one attribute; SGLang's lifespan calls it once"
    ),
    "set_server_stop_hook": Rule(Policy.THREADSAFE, "stores a callback; set before serving"),
    "set_engine_state_changed_callback": Rule(
        Policy.THREADSAFE, "stores a callback; set before serving"
    ),
    # -- sync members and state that belong to the owner loop --------------------------
    "rid_to_state": Rule(
        Policy.REFUSE, "per-request ReqState objects whose events belong to the owner loop"
    ),
    "event_loop": Rule(
        Policy.REFUSE, "the owner loop itself; use loopbridge.owner_loop(proxy) instead"
    ),
    "asyncio_tasks": Rule(Policy.REFUSE, "handle_loop and the watchdog: owner-loop tasks"),
    "is_pause_cond": Rule(Policy.REFUSE, "an asyncio.Condition of the owner loop"),
    "model_update_lock": Rule(Policy.REFUSE, "an asyncio read-write lock of the owner loop"),
    "lora_update_lock": Rule(Policy.REFUSE, "an asyncio lock of the owner loop"),
    "model_update_result": Rule(Policy.REFUSE, "an asyncio.Future set by handle_loop"),
    "model_update_tmp": Rule(Policy.REFUSE, "collects results in handle_loop"),
    "model_update_expected_workers": Rule(Policy.REFUSE, "set per weight update"),
    "session_futures": Rule(Policy.REFUSE, "asyncio futures resolved by handle_loop"),
    "send_to_scheduler": Rule(
        Policy.REFUSE, "a zmq.asyncio socket: not thread-safe, bound to the owner loop"
    ),
    "recv_from_detokenizer": Rule(Policy.REFUSE, "a zmq.asyncio socket read by handle_loop"),
    "soft_watchdog": Rule(Policy.REFUSE, "fed by handle_loop"),
    "encoder_dispatch_ready": Rule(Policy.REFUSE, "per-request events of the request path"),
    "crash_dump_performed": Rule(Policy.REFUSE, "crash-dump state written by handle_loop"),
    "crash_dump_request_list": Rule(Policy.REFUSE, "crash-dump state written by handle_loop"),
    "dump_request_list": Rule(Policy.REFUSE, "request dumps appended by handle_loop"),
    "lora_registry": Rule(Policy.REFUSE, "LoRA state guarded by asyncio locks"),
    "lora_ref_cache": Rule(Policy.REFUSE, "LoRA state of the request path"),
    "pending_lora_unloads": Rule(Policy.REFUSE, "LoRA state of the request path"),
    "load_snapshot_reader": Rule(Policy.REFUSE, "load snapshots refreshed on the owner loop"),
    "metrics_collector": Rule(Policy.REFUSE, "metrics updated by handle_loop"),
    "request_metrics_exporter_manager": Rule(
        Policy.REFUSE, "writes request records from owner-loop tasks"
    ),
    **{
        name: Rule(
            Policy.REFUSE,
            "elastic-EP progress, written by scale_elastic_ep on the owner loop "
            "(get_elastic_ep_state reads them for the HTTP layer)",
        )
        for name in ("elastic_pending_ep_size", "elastic_scale_phase", "elastic_last_error")
    },
    "fake_bootstrap_room_counter": Rule(Policy.REFUSE, "a counter of the request path"),
    "bootstrap_server": Rule(Policy.REFUSE, "PD disaggregation service: engine internals"),
    "encoder_bootstrap_server": Rule(Policy.REFUSE, "encoder service: engine internals"),
    "async_dynamic_batch_tokenizer": Rule(
        Policy.REFUSE, "batches tokenization in owner-loop tasks"
    ),
    "auto_create_handle_loop": Rule(
        Policy.REFUSE,
        "binds the manager to the calling loop: called from another thread it would "
        "start a second handle_loop there (the bug this adapter exists for)",
    ),
    "configure_logging": Rule(
        Policy.REFUSE, "sends on the owner loop's ZMQ socket, which is not thread-safe"
    ),
    "record_config_updates": Rule(
        Policy.REFUSE, "called by weight updates on the owner loop; writes the config bags"
    ),
    "update_active_ranks": Rule(Policy.REFUSE, "sends on the ZMQ socket (handle_loop)"),
    "forward_elastic_scale_update": Rule(Policy.REFUSE, "sends on the ZMQ socket"),
    "update_control_communicator_fan_out": Rule(Policy.REFUSE, "reconfigures communicators"),
    "force_exit_handler": Rule(Policy.REFUSE, "a signal handler of the owner loop"),
    **{
        name: Rule(Policy.REFUSE, _INTERNAL)
        for name in (
            "add_logprob_to_meta_info",
            "collect_metrics",
            "convert_logprob_style",
            "convert_to_span_attrs",
            "detokenize_logprob_tokens",
            "detokenize_top_logprobs_tokens",
            "dump_requests",
            "dump_requests_before_crash",
            "record_request_for_crash_dump",
            "resolved_config_dict",
            "update_request_meta_info",
        )
    },
    **{
        name: Rule(Policy.REFUSE, "construction steps, run once by __init__")
        for name in (
            "init_communicators",
            "init_disaggregation",
            "init_ipc_channels",
            "init_lora",
            "init_metric_collector_watchdog",
            "init_model_config",
            "init_positional_embeds_transport",
            "init_request_dispatcher",
            "init_request_logging_and_dumping",
            "init_running_status",
            "init_tokenizer_and_processor",
            "init_weight_update",
        )
    },
    # -- async members named explicitly (also covered by KIND_RULES) -------------------
    "generate_request": Rule(
        Policy.STREAM,
        "ReqState and its event live on the owner loop; outputs stream back batched with "
        "back-pressure; closing the stream closes the generator there, and SGLang "
        "releases or aborts the request once",
    ),
    "pause_generation": Rule(Policy.MARSHAL, "takes is_pause_cond on the owner loop"),
    "continue_generation": Rule(Policy.MARSHAL, "notifies is_pause_cond on the owner loop"),
    "update_weights_from_disk": Rule(
        Policy.MARSHAL, "takes the model-update writer lock and awaits a handle_loop future"
    ),
}

#: Rules by name suffix, for families of members SGLang grows one at a time.
SUFFIX_RULES: Mapping[str, Rule] = {
    "_communicator": Rule(
        Policy.REFUSE,
        "a FanOutCommunicator: its asyncio events and results are set by handle_loop; "
        "the async member that uses it runs on the owner loop",
    ),
}

#: Rules by member kind, for members without a per-member rule.
KIND_RULES: Mapping[str, Rule] = {
    "async": Rule(
        Policy.MARSHAL,
        "coroutines touch the ZMQ socket, communicator futures and asyncio locks that "
        "belong to the owner loop, so each call runs there",
    ),
    "asyncgen": Rule(Policy.STREAM, "an async generator runs on the owner loop and streams back"),
    "class-level": Rule(
        Policy.CLASS_LEVEL,
        "classmethods, staticmethods and class data hold no per-instance loop state",
    ),
    "private": Rule(
        Policy.REFUSE,
        "private sync members and attributes are manager internals; the serving layer "
        "does not use them and they may touch owner-loop state",
    ),
}


class _Table(MemberTable):
    def rule_for(self, member: Member) -> Rule | None:
        if member.name not in self.rules:
            for suffix, rule in SUFFIX_RULES.items():
                if member.name.endswith(suffix):
                    return rule
        return super().rule_for(member)


_TABLE = _Table(RULES, KIND_RULES, "loopbridge_sglang.manager.RULES")


def surface(manager_cls: type | None = None, instance: object | None = None) -> dict[str, Member]:
    """Every member of the installed ``TokenizerManager`` surface, with its kind.

    Sources: the manager class (``TokenizerManager`` by default, with its mixins) and,
    if given, the instance's own attributes. Dunder members are left out.
    """
    if manager_cls is None:
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        manager_cls = TokenizerManager
    return collect((manager_cls,), instance=instance)


def classify_surface(
    manager_cls: type | None = None, instance: object | None = None
) -> dict[str, tuple[Member, Rule | None]]:
    """Each member of :func:`surface` with its rule (``None``: unclassified)."""
    return _TABLE.classify(surface(manager_cls, instance))


# -------------------------------------------------------------- owner loop
def _handler_loop(manager: Any) -> asyncio.AbstractEventLoop | None:
    """The loop ``handle_loop`` runs (or ran) on, if SGLang started it."""
    loop = vars(manager).get("event_loop")
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


def _threadsafe_abort(manager: Any) -> Callable[..., None]:
    """``abort_request`` that, off the owner loop, schedules SGLang's own there."""
    original = type(manager).abort_request.__get__(manager)

    @functools.wraps(original)
    def abort_request(rid: str = "", abort_all: bool = False) -> None:
        try:
            owner = owner_loop(manager)
        except LoopAffinityError:
            owner = None
        if owner is None:
            original(rid, abort_all)  # nothing started: no loop state yet
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is owner:
            original(rid, abort_all)
            return
        # The manager's socket and ReqState belong to the owner loop: the abort runs
        # there, after whatever that loop is doing now. A closed owner has no requests.
        if not owner.is_closed():
            owner.call_soon_threadsafe(original, rid, abort_all)

    return abort_request


def _install_threadsafe_abort(manager: Any) -> None:
    # Installed before adoption: the proxy's pass-through reads the instance's.
    manager.abort_request = _threadsafe_abort(manager)


_ADOPTION = Adoption(
    noun="manager",
    handler="handle_loop",
    moving="a TokenizerManager cannot change loops once it has started",
    declarers="adopt_manager()/tokenizer_manager_proxy()",
    handler_loop=_handler_loop,
    declarations=lambda manager: _TABLE.declarations(surface(type(manager), manager)),
    prepare=_install_threadsafe_abort,
)


def adopt_manager(
    manager: TokenizerManager, loop: asyncio.AbstractEventLoop | None = None
) -> TokenizerManager:
    """Declare ``manager``'s owner loop and its member table (once per manager).

    ``loop`` defaults to the loop ``handle_loop`` already runs on, else the running
    loop; with neither, the manager has no owner until :func:`bind_owner_loop`.
    Calling it again is a no-op (same loop) or an error (another loop).
    """
    return _ADOPTION.adopt(manager, loop)


def bind_owner_loop(manager: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Record (or move) the owner loop of a manager that has not started yet.

    Call it on the loop that will own the manager (``loop`` defaults to the running
    one); ``handle_loop`` then starts there with the first request sent through a
    proxy, whoever sends it.
    """
    _ADOPTION.bind_owner_loop(manager, loop)


# ------------------------------------------------------- the caller's request
class OwnerSideRequest:
    """A caller's Starlette request as the owner loop sees it.

    SGLang's request path reads ``request.headers`` and awaits
    ``request.is_disconnected()``; the latter talks to the server's connection, which
    belongs to the server's loop. Here it runs there, and the owner loop awaits the
    answer. Other attributes are read from the request (plain data); its coroutines
    (``body``, ``json``, ``receive``) are not for the owner loop and are refused.
    """

    __slots__ = ("_loop", "_request")

    def __init__(self, request: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._request = request
        self._loop = loop

    @property
    def headers(self) -> Any:
        return self._request.headers

    async def is_disconnected(self) -> bool:
        if self._loop.is_closed():
            return True  # the server is gone, and the client with it
        future = asyncio.run_coroutine_threadsafe(self._request.is_disconnected(), self._loop)
        return bool(await asyncio.wrap_future(future))

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._request, name)
        if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
            raise LoopAffinityError(
                f"request.{name} belongs to the server's loop; the owner loop may only read "
                "the request's data and ask is_disconnected()"
            )
        return value


def _request_index(fn: Any) -> int | None:
    """Position of the ``request`` parameter (self excluded), or None."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    if "request" not in params:
        return None
    return params.index("request") - 1


def _with_owner_side_request(name: str, base: Any, index: int) -> Any:
    """``base`` (a generated proxy member) with its ``request`` made owner-side."""

    @functools.wraps(base)
    def member(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = kwargs.get("request") if "request" in kwargs else None
        positional = len(args) > index
        if positional:
            request = args[index]
        if request is not None and not isinstance(request, OwnerSideRequest):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None and loop is not owner_loop(self):
                wrapped = OwnerSideRequest(request, loop)
                if positional:
                    args = (*args[:index], wrapped, *args[index + 1 :])
                else:
                    kwargs["request"] = wrapped
        return base(self, *args, **kwargs)

    member.__name__ = name
    # What this member stands for is SGLang's method (as for the member it wraps):
    # the blocking face, for plain threads that have no request to wrap, runs that.
    member.__wrapped__ = getattr(base, "__wrapped__", base)
    return member


_served_classes: dict[type, type] = {}
_served_lock = threading.Lock()


def _served_class(pcls: type, manager_cls: type) -> type:
    """The proxy class with every ``request``-taking marshalled member wrapped."""
    with _served_lock:
        cls = _served_classes.get(pcls)
        if cls is not None:
            return cls
        ns: dict[str, Any] = {"__slots__": ()}
        for name, (_, rule) in classify_surface(manager_cls).items():
            if rule is None or rule.policy not in (Policy.MARSHAL, Policy.STREAM):
                continue
            index = _request_index(getattr(manager_cls, name))
            if index is not None:
                ns[name] = _with_owner_side_request(name, getattr(pcls, name), index)
        cls = type(pcls)(pcls.__name__, (pcls,), ns)
        cls.__module__ = pcls.__module__
        cls.__qualname__ = pcls.__qualname__
        _served_classes[pcls] = cls
        return cls


def tokenizer_manager_proxy(
    manager: TokenizerManager,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    stream_window: int = 32,
    cancel_grace: float = 5.0,
) -> TokenizerManager:
    """A ``TokenizerManager`` for SGLang's serving layer that is safe on any thread or loop.

    The result is an instance of a generated subclass of ``type(manager)``, so
    ``isinstance(p, TokenizerManager)`` holds. ``loop`` names the owner loop if the
    manager has not been declared yet (see :func:`adopt_manager`); ``stream_window`` is
    how many outputs of one request may be buffered ahead of a slow consumer;
    ``cancel_grace`` bounds how long a cancelled caller waits for the owner side to
    finish the abort. Raises :class:`UnclassifiedMemberError` if the installed SGLang
    has a member no rule covers.
    """
    if is_tokenizer_manager_proxy(manager):
        return manager
    adopt_manager(manager, loop)
    # Attributes set since adoption (SGLang sets some lazily) must be classified too.
    _TABLE.declarations(surface(type(manager), manager))
    p = proxy(manager, stream_window=stream_window, cancel_grace=cancel_grace)
    # Same slots, one more layer of members: the class of the proxy becomes its
    # subclass that makes each caller's request owner-side.
    object.__setattr__(p, "__class__", _served_class(type(p), type(manager)))
    return p


def is_tokenizer_manager_proxy(obj: object) -> bool:
    """True for objects made by :func:`tokenizer_manager_proxy` (or ``loopbridge.proxy``)."""
    return is_proxy(obj)


# ---------------------------------------------------------- typed generation
@overload
def async_generate(
    manager: TokenizerManager, obj: GenerateReqInput, *, stream: Literal[True]
) -> AsyncIterator[dict[str, Any]]: ...
@overload
def async_generate(
    manager: TokenizerManager, obj: GenerateReqInput, *, stream: Literal[False] = ...
) -> Coroutine[Any, Any, dict[str, Any]]: ...
def async_generate(
    manager: TokenizerManager, obj: GenerateReqInput, *, stream: bool = False
) -> AsyncIterator[dict[str, Any]] | Coroutine[Any, Any, dict[str, Any]]:
    """One generate request through ``manager`` (a proxy, or the manager on its own loop).

    ``stream=True``: an async iterator of SGLang's output dicts, one per chunk (closing
    it aborts the request). ``stream=False``: a coroutine for the final output, as
    SGLang's ``Engine.async_generate`` returns. ``obj.stream`` is set to ``stream``.
    """
    obj.stream = stream
    if stream:
        return _stream(manager, obj)
    return _final(manager, obj)


async def _stream(manager: Any, obj: Any) -> AsyncIterator[dict[str, Any]]:
    agen = manager.generate_request(obj)
    try:
        async for out in agen:
            yield out
    finally:
        await agen.aclose()


async def _final(manager: Any, obj: Any) -> dict[str, Any]:
    agen = manager.generate_request(obj)
    try:
        out: dict[str, Any] = await agen.__anext__()
        return out
    finally:
        await agen.aclose()
