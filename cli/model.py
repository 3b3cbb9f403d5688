"""`crucible model init-tiny DIR` makes a local test model; `crucible serve DIR` serves one with vLLM.

Heavy imports (torch, transformers) happen inside the commands, so `crucible --help` stays fast.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import typer

from cli.console import console, readable_errors

app = typer.Typer(help="Make policy models.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Make policy models."""  # a callback keeps `model` a command group even with one command


@app.command("init-tiny")
def init_tiny(
    directory: Path = typer.Argument(..., help="Where to write the model (new or empty)."),
    seed: int = typer.Option(0, help="Weight init seed; the same seed gives identical files."),
    hidden: int = typer.Option(128, help="Hidden size."),
    layers: int = typer.Option(2, help="Decoder layers."),
    heads: int = typer.Option(4, help="Attention heads; hidden / heads must be at least 32."),
    kv_heads: int = typer.Option(2, help="Key/value heads; must divide --heads."),
    intermediate: int = typer.Option(256, help="MLP width."),
    vocab_size: int = typer.Option(2048, help="Tokenizer vocabulary (512-32768)."),
    max_position: int = typer.Option(4096, help="Longest sequence the model accepts."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a directory that has files."),
) -> None:
    """Make a tiny Qwen2 model with a locally trained tokenizer and a tool-calling chat template."""
    from trainer.tiny_model import TinyModelSpec, make_tiny_model

    spec = TinyModelSpec(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                         intermediate=intermediate, vocab_size=vocab_size, max_position=max_position)
    with readable_errors():
        info = make_tiny_model(out_dir=directory, seed=seed, spec=spec, overwrite=overwrite)
    console.print(
        f"[green]tiny model[/] {info.path}: {info.parameters:,} parameters, vocab {info.vocab_size}, "
        f"{info.weight_bytes / 1e6:.1f} MB of weights"
    )


def serve(
    model_dir: Path = typer.Argument(..., help="A model directory (config.json, safetensors, tokenizer)."),
    port: int = typer.Option(8000, help="Port to listen on; 0 picks a free one."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    max_model_len: int = typer.Option(2048, help="Longest prompt + completion, in tokens."),
    served_model_name: str | None = typer.Option(None, help="Model name clients send; default: the path."),
    dtype: str = typer.Option("float32", help="float32 keeps logprobs equal to the trainer's; bfloat16 is faster."),
    kv_cache_gib: int = typer.Option(1, help="KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE on CPU)."),
    log_file: Path | None = typer.Option(None, help="Server log; default: a new temp file."),
) -> None:
    """Serve a model with vLLM's OpenAI API and the weight-sync routes, until Ctrl-C."""
    from trainer.serving import VllmServer

    with readable_errors():
        server = VllmServer(
            model_dir=model_dir, host=host, port=port, max_model_len=max_model_len,
            served_model_name=served_model_name, dtype=dtype, kv_cache_gib=kv_cache_gib, log_path=log_file,
        )
    console.print(f"starting vLLM on {server.base_url} (log {server.log_path}) ...")
    with readable_errors():
        server.start()
    console.print(f"[green]serving[/] {server.model_name!r} at {server.api_url}; Ctrl-C stops it")
    # vLLM runs in its own process group, so a SIGTERM to this process would orphan it: turn it
    # into the same clean stop as Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = server.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        server.stop()
    if code:
        console.print(f"[red]vLLM exited with code {code}[/]; log {server.log_path}:\n{server.log_tail()}",
                      highlight=False)
        raise typer.Exit(1)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
