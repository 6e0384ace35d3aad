"""Run the real vLLM ``AsyncLLM`` on a machine without a GPU.

Everything except the forward pass is real: the ``AsyncLLM`` front end, the
spawned EngineCore process and its ZMQ sockets, the scheduler, the KV-cache
manager, the output processor, the detokenizer and the OpenAI serving layer.
The forward pass is replaced by :class:`StandInExecutor`, which emits one
deterministic token per scheduled decode step. This is what the test suite and
the benchmarks run on CPU; it proves wiring, scheduling, streaming,
cancellation and HTTP behaviour, not model numerics.

Call :func:`cpu_engine_env` before vLLM starts (it selects the CPU platform and
keeps vLLM's caches and IPC sockets out of the user's home and ``/tmp``), then
build an engine with :func:`make_async_llm`. Scripts that construct an
``AsyncLLM`` need an ``if __name__ == "__main__":`` guard: vLLM spawns the
EngineCore with the ``spawn`` start method.

Per-step latency of the stand-in forward pass is read from the environment
variable ``LOOPBRIDGE_STANDIN_STEP_S`` (seconds, default 0) in the EngineCore
process, so a benchmark can emulate a GPU's step time.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from loopbridge_vllm._standin import StandInExecutor as StandInExecutor

__all__ = [
    "STANDIN_BACKEND",
    "STEP_ENV",
    "StandInExecutor",
    "build_tiny_model",
    "cpu_engine_env",
    "engine_args",
    "make_async_llm",
    "standin_weights",
]

#: The value for ``distributed_executor_backend`` that selects the stand-in.
STANDIN_BACKEND = "loopbridge_vllm.cpu_engine.StandInExecutor"
#: Environment variable with the stand-in's per-step sleep in seconds.
STEP_ENV = "LOOPBRIDGE_STANDIN_STEP_S"

_MODEL_VERSION = "1"  # bump when the model layout below changes
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. "
    "Hello world! Loops, threads and engines talk to each other. "
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ "
    "user assistant system: what is two plus two? It is four.\n"
)
# Small enough to build in seconds and to read from many processes.
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def __getattr__(name: str) -> Any:
    # The executor imports vLLM; load it only when vLLM resolves the backend
    # name (also in the spawned EngineCore process), so that importing this
    # module stays cheap and environment set-up can run first.
    if name == "StandInExecutor":
        from loopbridge_vllm._standin import StandInExecutor

        # Published here, where __all__ lists it (and where STANDIN_BACKEND names it).
        StandInExecutor.__module__ = __name__
        return StandInExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_tiny_model(path: str | os.PathLike[str], *, head_dim: int = 16) -> Path:
    """Build (once) a 2-layer Llama with random weights and a local tokenizer.

    ``head_dim`` 16 (4 heads) is the stand-in's model; vLLM's real CPU attention
    kernels need a larger head, such as 64 (one head).

    The directory holds a Hugging Face ``config.json``, ``safetensors`` weights
    and a byte-level BPE tokenizer trained locally, so that vLLM's model
    inspection, renderer and detokenizer work without network access. A
    directory that already holds a complete build is reused as is.
    """
    root = Path(path)
    stamp = root / "loopbridge-tiny-model.json"
    if stamp.is_file():
        try:
            built = json.loads(stamp.read_text())
            if built.get("version") == _MODEL_VERSION and built.get("head_dim", 16) == head_dim:
                return root
        except (OSError, ValueError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    # Build into a sibling directory and rename: concurrent builders (two test
    # processes) then never see a half-written model.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=root.parent))
    try:
        _write_tiny_model(staging, head_dim)
        for item in staging.iterdir():
            os.replace(item, root / item.name)
        (root / stamp.name).write_text(
            json.dumps({"version": _MODEL_VERSION, "head_dim": head_dim})
        )
    finally:
        for item in staging.iterdir():
            item.unlink()
        staging.rmdir()
    return root


def _write_tiny_model(out: Path, head_dim: int = 16) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=max(64, head_dim),
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=max(1, 64 // head_dim),
        num_key_value_heads=max(1, 64 // head_dim),
        max_position_embeddings=1024,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out, safe_serialization=True)


def standin_weights(model_dir: str | os.PathLike[str], base: int) -> dict[str, Any]:
    """New weights for the stand-in worker: it then emits ``base, base + 1, ...``.

    The ``{name: tensor}`` mapping a trainer sends through vLLM's native
    weight-transfer API (see :func:`loopbridge_vllm.weight_transfer.inline_update`);
    ``model_dir`` is the served model (its vocabulary sizes the tensor).
    """
    from loopbridge_vllm._standin import StandInModel

    vocab = int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    return {"token_table": StandInModel.table_for(base, vocab)}


def _source_root() -> str:
    # The directory that holds the ``loopbridge_vllm`` package.
    return str(Path(__file__).resolve().parent.parent)


# torch modules that warn on every import on a CPU machine: torch 2.14 (vLLM 0.33)
# about its own deprecated internals that vLLM calls, and that no CUDA runtime is
# found. Nothing a user can act on; errors from these modules still show.
_NOISY_TORCH_MODULES = (
    "torch._opaque_base",
    "torch._library.opaque_object",
    "torch.utils.cpp_extension",
)


def _quiet_torch_logs() -> str:
    # TORCH_LOGS value lowering those modules to errors. torch refuses to import
    # when TORCH_LOGS names a module it does not have, so only existing ones are
    # named, found on disk without importing torch (which reads TORCH_LOGS once).
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return ""
    root = Path(spec.origin).parent.parent
    present = [
        name for name in _NOISY_TORCH_MODULES if (root / (name.replace(".", "/") + ".py")).is_file()
    ]
    return ",".join("-" + name for name in present)


def cpu_engine_env(cache_root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Set (and return) the environment for a CPU-only vLLM engine.

    Must run before vLLM resolves its platform, i.e. before the first engine
    is built. It selects the CPU platform through loopbridge's platform plugin
    (``LOOPBRIDGE_CPU_PLATFORM=1``, see :mod:`loopbridge_vllm._cpu_platform`):
    vLLM's own CPU platform, whose x86 Triton requirement (vLLM 0.34) is
    lifted, and which vLLM 0.24 would not select by itself; it removes
    ``VLLM_TARGET_DEVICE``, with which vLLM 0.34 would bypass the plugin.
    ``VLLM_CACHE_ROOT`` goes to ``cache_root`` (default: a temporary
    directory), ``VLLM_RPC_BASE_PATH`` to a fresh temporary directory so that
    IPC socket files do not pile up in ``/tmp``. Unless ``TORCH_LOGS`` is set,
    torch's import-time warnings that do not apply on CPU are lowered to errors. The directory holding this
    package is added to ``PYTHONPATH`` so that the spawned EngineCore can
    import the stand-in executor even when the package is not installed.
    Existing values of ``VLLM_CACHE_ROOT`` and ``VLLM_RPC_BASE_PATH`` win.
    """
    env = {
        # vLLM's CPU platform without its x86 Triton requirement (the stand-in
        # runs no kernels): see loopbridge_vllm._cpu_platform.
        "LOOPBRIDGE_CPU_PLATFORM": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    os.environ.update(env)
    os.environ.pop("VLLM_TARGET_DEVICE", None)
    if "VLLM_CACHE_ROOT" not in os.environ:
        root = (
            Path(cache_root)
            if cache_root is not None
            else Path(tempfile.mkdtemp(prefix="loopbridge-vllm-cache-"))
        )
        root.mkdir(parents=True, exist_ok=True)
        os.environ["VLLM_CACHE_ROOT"] = str(root)
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="loopbridge-rpc-")
    src = _source_root()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([src, *paths])
    if src not in sys.path:
        sys.path.insert(0, src)
    quiet = _quiet_torch_logs()
    if quiet and "TORCH_LOGS" not in os.environ:
        os.environ["TORCH_LOGS"] = quiet
        env["TORCH_LOGS"] = quiet
    env["VLLM_CACHE_ROOT"] = os.environ["VLLM_CACHE_ROOT"]
    env["VLLM_RPC_BASE_PATH"] = os.environ["VLLM_RPC_BASE_PATH"]
    env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 64,
    "distributed_executor_backend": STANDIN_BACKEND,
    "disable_log_stats": True,
    "served_model_name": ["tiny"],
    # The stand-in worker's weights take vLLM's native weight-transfer API
    # through the in-request backend (loopbridge_vllm.weight_transfer).
    "weight_transfer_config": {"backend": "loopbridge_inline"},
}


def engine_args(model_dir: str | os.PathLike[str], **overrides: Any) -> AsyncEngineArgs:
    """``AsyncEngineArgs`` for the tiny model on the stand-in executor.

    Keyword arguments override the defaults (float32, eager, 512-token context,
    64 concurrent sequences, stand-in executor, served name ``tiny``, and the
    ``loopbridge_inline`` weight-transfer backend, see
    :mod:`loopbridge_vllm.weight_transfer`).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = dict(_DEFAULTS)
    kwargs.update(overrides)
    return AsyncEngineArgs(model=str(model_dir), **kwargs)


async def make_async_llm(model_dir: str | os.PathLike[str], **overrides: Any) -> AsyncLLM:
    """Build a real ``AsyncLLM`` on the running loop (which becomes its owner).

    Sets up the CPU environment first (see :func:`cpu_engine_env`). Building
    takes several seconds: it spawns and handshakes the EngineCore process.
    """
    cpu_engine_env()
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine_args(model_dir, **overrides))
