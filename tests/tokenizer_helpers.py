"""Tokenizers trained here, from a small corpus (no hub access), and their ids by hand: what
the tests of ``atlas_fast.convert.tokenize`` compare with."""

from __future__ import annotations

from pathlib import Path


def train_bpe(path: Path, texts: list, vocab_size: int = 400) -> Path:
    """A byte-level BPE of at most ``vocab_size`` ids (over 256: uint16), "<eos>" id 0 and
    "<bos>" id 1, saved at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    assert 256 < tok.get_vocab_size() <= vocab_size
    tok.save(str(path))
    return path


def by_hand(path, texts, eos=None, special=False) -> list:
    """The ids of each text, as the tokenizer at ``path`` gives them (``eos`` appended)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tail = [] if eos is None else [eos]
    return [tok.encode(t, add_special_tokens=special).ids + tail for t in texts]
