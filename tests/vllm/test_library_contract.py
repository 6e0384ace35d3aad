"""The library API fails the way a trainer or a Ray actor can catch, as ``serve`` refuses.

* ``start_openai_server(serve_argv=...)`` honours or refuses each option with the
  command's table: a refusal is a ``ValueError`` naming the option and the fix, an
  engine field that contradicts the engine is :class:`ServeArgsMismatch`, and no
  call raises ``SystemExit`` or prints usage.
* A control member (pause, resume, ``collective_rpc``, ...) called through the
  engine proxy from a trainer thread that forgot ``blocking()`` is refused at once,
  naming ``blocking(proxy)``; nothing is left half-done.
* A busy port is a :class:`ServerStartError` naming the address and the fix.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopbridge_vllm
from loopbridge import blocking, unwrap
from loopbridge_vllm import ServeArgsMismatch, ServerStartError, start_openai_server

#: Release-sensitive (each release's own parser and members): every release's lane.
pytestmark = pytest.mark.every_release


def _refused(engine_proxy: Any, capsys: pytest.CaptureFixture[str], **kwargs: Any) -> str:
    """The message of the ``ValueError`` a start with ``kwargs`` raises; nothing
    started, nothing printed."""
    threads = set(threading.enumerate())
    try:
        start_openai_server(engine_proxy, start_timeout=60, **kwargs).stop()
    except SystemExit as exc:  # what a library call must never do
        pytest.fail(f"SystemExit({exc.code}) out of start_openai_server")
    except ValueError as exc:
        assert set(threading.enumerate()) <= threads  # nothing was started
        out, err = capsys.readouterr()
        assert "usage:" not in out + err  # no usage printed
        return str(exc)
    pytest.fail(f"start_openai_server({kwargs}) served instead of refusing")


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--api-server-count", "2"], "--api-server-count"),
        (["--headless"], "--headless"),
        (["--data-parallel-size", "2"], "--data-parallel-size"),
        (["--data-parallel-rank", "1"], "--data-parallel-rank"),
    ],
)
def test_what_serve_refuses_the_library_refuses(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str], argv: list[str], option: str
) -> None:
    message = _refused(engine_proxy, capsys, serve_argv=argv)
    assert message.startswith(f"serve_argv: {option}:"), message
    assert "stock `vllm serve`" in message  # what to do instead


def test_grpc_is_refused_where_the_release_has_it(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopbridge_vllm.server import _make_parser

    if "grpc" not in {a.dest for a in _make_parser()._actions}:
        pytest.skip("this vLLM release has no --grpc")
    message = _refused(engine_proxy, capsys, serve_argv=["--grpc"])
    assert "--grpc" in message and "HTTP only" in message


def test_the_data_parallel_refusal_names_the_option_given(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(engine_proxy, capsys, serve_argv=["--data-parallel-size", "2"])
    # It leads with the option the user gave; --api-server-count 1 is the fix.
    assert message.startswith("serve_argv: --data-parallel-size:")
    assert "--api-server-count:" not in message and "--api-server-count 1" in message


@pytest.mark.parametrize(
    ("argv", "kwargs", "says"),
    [
        (["--port", "1234"], {"port": 0}, "--port is given in serve_argv and as port="),
        (["--host", "127.0.0.2"], {"host": "127.0.0.1"}, "--host is given in serve_argv and as"),
        (["--uds", "/tmp/x.sock"], {"port": 0}, "--uds listens on a Unix socket"),
    ],
)
def test_an_address_given_twice_is_refused(
    engine_proxy: Any,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    kwargs: dict[str, Any],
    says: str,
) -> None:
    assert says in _refused(engine_proxy, capsys, serve_argv=argv, **kwargs)


def test_an_unknown_option_is_a_value_error_not_system_exit(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(engine_proxy, capsys, serve_argv=["--no-such-option"])
    assert "--no-such-option" in message and "vllm serve --help" in message
    assert isinstance(_error("ServeOptionError"), type)
    bad_value = _refused(engine_proxy, capsys, serve_argv=["--max-model-len", "lots"])
    assert "--max-model-len" in bad_value
    assert "--help" in _refused(engine_proxy, capsys, serve_argv=["--help"])


def test_an_engine_field_that_contradicts_the_engine_is_a_mismatch(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    built = engine_proxy.model_config.max_model_len
    with pytest.raises(ServeArgsMismatch, match="--max-model-len") as caught:
        start_openai_server(
            engine_proxy, serve_argv=["--max-model-len", str(built // 4)], start_timeout=60
        )
    assert str(built) in str(caught.value) and "build it with this value" in str(caught.value)


def test_serve_argv_options_are_honoured_with_their_stock_effect(engine_proxy: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    built = engine_proxy.model_config.max_model_len
    # --port binds (no port= given); an engine field that says what the engine has
    # is accepted; --api-server-count 1 is stock's one server.
    argv = ["--port", str(port), "--max-model-len", str(built), "--api-server-count", "1"]
    server = start_openai_server(engine_proxy, serve_argv=argv, grace=1.0, start_timeout=60)
    try:
        assert server.port == port
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 200
    finally:
        server.stop()


def test_serve_argv_and_args_together_are_refused(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopbridge_vllm.server import serve_args

    message = _refused(
        engine_proxy, capsys, serve_argv=["--api-key", "k"], args=serve_args(engine_proxy)
    )
    assert "serve_argv and args=" in message


def _error(name: str) -> Any:
    return getattr(loopbridge_vllm, name)


def _from_trainer_thread(call: Any) -> BaseException | None:
    """What ``call()`` raises on a plain thread that runs no loop (None: nothing)."""
    raised: list[BaseException | None] = [None]

    def trainer() -> None:
        try:
            made = call()
        except BaseException as exc:
            raised[0] = exc
        else:
            close = getattr(made, "close", None)
            if close is not None:
                close()  # a coroutine nobody will run: don't leave it to the collector

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    thread.join(60)
    return raised[0]


@pytest.mark.parametrize(
    "member",
    ["pause_generation", "resume_generation", "collective_rpc", "generate", "is_paused"],
)
def test_a_control_member_from_a_trainer_thread_is_refused_at_once(
    engine_proxy: Any, member: str
) -> None:
    if not hasattr(type(unwrap(engine_proxy)), member):
        pytest.skip(f"this vLLM release's AsyncLLM has no {member}")
    args: dict[str, tuple[Any, ...]] = {
        "collective_rpc": ("standin_active_requests",),
        "generate": ("x", None, "r-trainer"),
    }
    exc = _from_trainer_thread(lambda: getattr(engine_proxy, member)(*args.get(member, ())))
    assert exc is not None, f"{member}() from a trainer thread built something nobody runs"
    assert isinstance(exc, _error("OffLoopCall")) and isinstance(exc, RuntimeError)
    message = str(exc)
    assert f"blocking(proxy).{member}(" in message and "'trainer'" in message
    assert message.index("blocking(proxy)") < 260  # in the first sentence


def test_the_blocking_face_still_pauses_and_resumes_from_a_trainer_thread(
    engine_proxy: Any,
) -> None:
    if not hasattr(type(unwrap(engine_proxy)), "is_paused"):
        pytest.skip("this vLLM release has no is_paused")
    seen: list[bool] = []

    def trainer() -> None:
        b = blocking(engine_proxy)
        b.pause_generation()
        seen.append(bool(b.is_paused()))
        b.resume_generation()
        seen.append(bool(b.is_paused()))

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    thread.join(120)
    assert seen == [True, False]


def test_a_busy_port_is_a_start_error_naming_the_address(engine_proxy: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ServerStartError) as caught:
            start_openai_server(engine_proxy, port=port, start_timeout=60)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "already in use" in message
    assert "port=0 picks a free one" in message


def test_the_model_path_option_is_refused_as_the_engines(
    engine_proxy: Any, capsys: pytest.CaptureFixture[str], tiny_model: Path
) -> None:
    message = _refused(engine_proxy, capsys, serve_argv=[str(tiny_model)])
    assert "the model is the engine's" in message


@pytest.mark.parametrize("on_engine_loop", [False, True], ids=["own-thread", "on-engine-loop"])
def test_how_to_tell_a_server_has_stopped_in_each_topology(
    engine_proxy: Any, on_engine_loop: bool
) -> None:
    """docs/vllm.md: running and wait_stopped() tell it in both topologies; thread
    only on a thread of its own; exit_reason stays None after a requested stop."""
    server = start_openai_server(
        engine_proxy, grace=1.0, on_engine_loop=on_engine_loop, start_timeout=60
    )
    assert server.running and not server.wait_stopped(0)
    server.stop()
    assert not server.running and server.wait_stopped(0)
    assert server.exit_reason is None
    # On the engine's loop the server's thread is the engine's, which runs on.
    assert server.thread.is_alive() is on_engine_loop


def test_the_openai_client_retries_a_refusal_twice_by_default() -> None:
    """docs/vllm.md's refit section: the official client's default retry budget."""
    openai = pytest.importorskip("openai")
    assert openai.DEFAULT_MAX_RETRIES == 2
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
    assert client.max_retries == 2
