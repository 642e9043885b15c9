"""Text that must stay text: tokenizing tool output (and demonstration text) without special tokens.

A sandbox prints whatever the model's code prints. If that output says `<|im_end|>` (or
`<|endoftext|>`), an ordinary tokenizer call turns it into the special token, and the turn (or
the sequence) ends inside the interpreter's answer: the model is shown a conversation it never
had, and an RL rollout can be ended by the code it wrote. Here the text's special-token
spellings stay ordinary tokens (`split_special_tokens=True`), and the result is checked, so a
tokenizer that ignores the flag fails loudly instead of silently.

Used by the rollout (tool output appended to a live trajectory) and by demonstrations
(`tirl.tasks.demos`), so both tokenize the same text to the same ids (architecture.md invariant 1).
Prompts are not tokenized here: a chat prompt's special tokens are real (its ids come from the
chat template).
"""

from __future__ import annotations

import re


def encode_literal(tokenizer, text: str) -> list[int]:
    """The ids of `text` with no special token in them: a special token's spelling in `text`
    becomes the ordinary tokens of that spelling. Raises ValueError for a tokenizer that cannot
    do this (one that ignores `split_special_tokens`)."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    special = set(tokenizer.all_special_ids)
    if special.intersection(ids):
        raise ValueError(
            f"{type(tokenizer).__name__} turned text into special tokens even with"
            " split_special_tokens=True; tool output cannot be tokenized safely with it"
        )
    return list(ids)


def encode_wrapped(tokenizer, head: str, text: str, tail: str) -> list[int]:
    """The ids of `head + text + tail`, where `text` is literal (`encode_literal`) and a
    special token spelt in `head` or `tail` (markers a protocol writes, such as a chat
    template's `<|im_end|>`) is that special token. The pieces between special tokens are
    tokenized on their own, as a tokenizer splits a whole text at its special tokens, so
    when `text` spells no special token the ids are `tokenizer(head + text + tail)`'s.
    Without special tokens in `head` and `tail` this is `encode_literal` of the whole."""
    specials = sorted(
        {t for t in tokenizer.all_special_tokens if t and (t in head or t in tail)},
        key=len,
        reverse=True,
    )
    if not specials:
        return encode_literal(tokenizer, head + text + tail)
    split = re.compile("(" + "|".join(map(re.escape, specials)) + ")").split
    before, after = split(head), split(tail)  # [text, special, text, ..., text] each
    pieces = [*before[:-1], before[-1] + text + after[0], *after[1:]]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i % 2:  # a special token of the markers
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            ids += encode_literal(tokenizer, piece)
    return ids
