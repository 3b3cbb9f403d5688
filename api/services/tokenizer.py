"""Decode token ids for the token view, with the tokenizer in the run's model directory if it has one.

Only `tokenizer.json` is read (the `tokenizers` library: no model weights, no transformers import).
A run whose model is a served name rather than a directory shows ids without text.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.settings import get_settings

logger = logging.getLogger("crucible.api")


def model_directory(model: str) -> Path | None:
    """`model` itself when it is a directory with a tokenizer, else the same name under data_dir/models."""
    if not model or "\x00" in model:
        return None
    for candidate in (Path(model), get_settings().data_dir / "models" / model):
        try:
            if (candidate / "tokenizer.json").is_file():
                return candidate
        except OSError:
            continue
    return None


@lru_cache(maxsize=8)
def _load(path: str) -> Any | None:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as error:  # a corrupt or foreign tokenizer.json: show ids only
        logger.warning("cannot load tokenizer %s: %s", path, error)
        return None


def decode_pieces(*, model: str, token_ids: list[int]) -> list[str] | None:
    """Each token decoded on its own (special tokens kept), or None without a tokenizer."""
    directory = model_directory(model)
    tokenizer = _load(str(directory / "tokenizer.json")) if directory else None
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    pieces = tokenizer.decode_batch([[i] if 0 <= i < vocab else [] for i in token_ids], skip_special_tokens=False)
    return [piece if 0 <= i < vocab else f"<{i}?>" for i, piece in zip(token_ids, pieces, strict=True)]
