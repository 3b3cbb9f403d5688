"""Small local tokenizers, one per chat-template family, each carrying that family's real chat template
(tests/data/chat_templates/; ChatML's is our own, trainer/chat_template.py) and its control tokens.

Nothing is downloaded: a byte-level BPE is trained on a few lines of text, like trainer/tiny_model.py.
Byte-level, without a prefix space, as the families' real tokenizers are (Qwen, Llama 3, Mistral's
Tekken), so text tokenized between control tokens gives the template's own ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from core.renderers import CHATML, LLAMA3, MISTRAL, Renderer, mistral_call_id
from trainer.chat_template import CHAT_TEMPLATE

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CORPUS = [
    "You are a careful agent. Read the file and submit the number you find.",
    '{"name": "bash", "arguments": {"command": "cat /work/number.txt"}}',
    '{"name": "submit", "parameters": {"answer": "42"}}',
    "Given the following functions, please respond with a JSON for a function call.",
    "total 0\nnumber.txt\n42\nls -la /tmp; echo done\n",
] * 4


@dataclass(frozen=True)
class Family:
    renderer: Renderer
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    template: str

    def call_text(self, name: str, arguments: dict[str, Any], *, turn: int) -> str:
        """A completion calling `name` exactly as the family's template renders an assistant tool call,
        end of turn included."""
        import json

        if self.renderer is CHATML:
            return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call><|im_end|>'
        if self.renderer is LLAMA3:
            return f'{{"name": "{name}", "parameters": {json.dumps(arguments)}}}<|eot_id|>'
        call = json.dumps({"name": name, "arguments": arguments})[:-1]
        return f'[TOOL_CALLS][{call}, "id": "{mistral_call_id(turn)}"}}]</s>'


FAMILIES = {
    "chatml": Family(CHATML, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", CHAT_TEMPLATE),
    "llama3": Family(LLAMA3, ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
                     "<|begin_of_text|>", "<|eot_id|>", (TEMPLATES / "llama3.2.jinja").read_text()),
    "mistral": Family(MISTRAL, ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
                      "<s>", "</s>", (TEMPLATES / "mistral_nemo.jinja").read_text()),
}


@cache
def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    family = FAMILIES[name]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(family.specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=family.bos, eos_token=family.eos,
                                   chat_template=family.template, clean_up_tokenization_spaces=False)


def encoders(name: str) -> tuple[Any, Any]:
    """(control text → ids, plain text → ids): the two tokenizers a PolicyClient uses."""
    tokenizer = family_tokenizer(name)
    return (lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
            lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)))
