#!/usr/bin/env python3
"""Build toolkit/standin/tokenizer/: a Hugging Face tokenizer whose counts equal the CPU stand-in's.

The stand-in tokenizes by splitting on whitespace (toolkit/standin/model.py `encode`), so this tokenizer is a
`tokenizers` WordLevel model with a WhitespaceSplit pre-tokenizer (one token per whitespace-separated word; a word
outside the vocabulary is `[UNK]`, still one token) and a WordPiece decoder (tokens joined by single spaces): the
recipe that gave aiperf 0.13 exact ISL/OSL (tests/unit/test_standin_tokenizer.py holds it). Its vocabulary:

- `[UNK]`, `[PAD]` and the chat template's role markers (`<|system|>`, `<|user|>`, `<|assistant|>`, `<|tool|>`);
- every word the stand-in generates (`model.decode_token(i)` for its 32000 ids);
- the most frequent ordinary English words of Python's own documentation (`pydoc_data.topics`), so that synthetic
  prompts decoded from random ids read as real words.

`tokenizer_config.json` carries the stand-in's chat template (`<|role|> content` per message, newline-joined,
then `<|assistant|>`). Only the `tokenizers` package is needed (no transformers).

usage: python scripts/build_standin_tokenizer.py [OUT_DIR]   (default toolkit/standin/tokenizer)
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

from toolkit.standin import model as M  # noqa: E402

ENGLISH_WORDS = 6000
SPECIAL = ["[UNK]", "[PAD]"]
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def english_words(n: int) -> list[str]:
    import pydoc_data.topics as topics
    text = " ".join(topics.topics.values())
    counts = collections.Counter(w.lower() for w in re.findall(r"\b[A-Za-z]{2,}\b", text))
    return [w for w, _ in counts.most_common(n)]


def build(out: Path) -> int:
    vocab: dict[str, int] = {}
    for w in [*SPECIAL, *ROLES, *(M.decode_token(i) for i in range(M.VOCAB_SIZE)), *english_words(ENGLISH_WORDS)]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # whitespace only, punctuation stays attached
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # tokens joined by single spaces
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[UNK]", "pad_token": "[PAD]"}, indent=2)
                                                 + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    return len(vocab)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "toolkit" / "standin" / "tokenizer"
    n = build(target)
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"{n} entries in the vocabulary; {size} bytes in {target}")
