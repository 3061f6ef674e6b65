"""Train the zoo's byte-level BPE tokenizer and wrap it as a transformers fast tokenizer.

Contract: :func:`train_tokenizer` is deterministic for a given text list and settings. The result
has ``<|endoftext|>`` as EOS and pad token, a chat template from ``decoder.models.templates`` (so
``apply_chat_template`` and our own ``render`` agree), and is saved with ``save_pretrained`` next
to every zoo model, so all zoo pairs share byte-identical tokenizer files.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from decoder.models.templates import get_template, jinja_chat_template

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def train_tokenizer(
    texts: Sequence[str], vocab_size: int, min_frequency: int, template: str
) -> PreTrainedTokenizerFast:
    """A ByteLevel BPE over ``texts`` with the template's EOS as the only special token."""
    eos = get_template(template).eos_text
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    log.info("trained BPE: %d tokens from %d texts", tok.get_vocab_size(), len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=eos, bos_token=None, unk_token=None
    )
    fast.chat_template = jinja_chat_template(template)
    fast.model_max_length = 4096
    return fast


def tokenizer_digest(model_dir: Path | str) -> str:
    """SHA-256 over the tokenizer files in a model folder (equal digest = same tokenizer)."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(model_dir) / name
        h.update(name.encode())
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()
