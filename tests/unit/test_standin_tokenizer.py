"""The stand-in's shipped Hugging Face tokenizer counts tokens as the stand-in does."""

from __future__ import annotations

import json
import subprocess

import jinja2
import pytest

from toolkit.facts.engines import STANDIN, TRTLLM
from toolkit.resources import package_path
from toolkit.standin import model as M

tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ["", "one", "To be, or not to be: that is the question", "  spaced \t out\nlines  ",
           "naïve café — unicode, punctuation!?", " ".join(f"w{i}" for i in range(500)),
           " ".join(M.decode_token(i) for i in range(0, 32000, 997))]
CHATS = [[{"role": "user", "content": "hello there"}],
         [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"},
          {"role": "assistant", "content": "once upon a time"}, {"role": "user", "content": "more"}]]


@pytest.fixture(scope="module")
def tok_dir():
    return package_path(STANDIN.tokenizer_dir)


@pytest.fixture(scope="module")
def tok(tok_dir):
    return tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def test_the_engine_profile_names_a_shipped_tokenizer(tok_dir):
    assert TRTLLM.tokenizer_dir is None
    names = {p.name for p in tok_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= names
    assert sum(p.stat().st_size for p in tok_dir.iterdir()) < 1 << 20
    ignored = subprocess.run(["git", "check-ignore", "-q", str(tok_dir / "tokenizer.json")], cwd=tok_dir,
                             check=False)
    assert ignored.returncode == 1  # not git-ignored: hatch puts it into the wheel with the toolkit package


@pytest.mark.parametrize("prompt", PROMPTS)
def test_counts_equal_the_stand_ins(tok, prompt):
    assert len(tok.encode(prompt).ids) == len(M.encode(prompt))


@pytest.mark.parametrize("messages", CHATS)
def test_the_chat_template_counts_equal_the_servers_prompt_tokens(tok, tok_dir, messages):
    template = json.loads((tok_dir / "tokenizer_config.json").read_text())["chat_template"]
    rendered = jinja2.Template(template).render(messages=messages, add_generation_prompt=True)
    assert len(tok.encode(rendered).ids) == len(M.encode(M.chat_prompt(messages)))
    # aiperf counts only the content: ISL = server prompt_tokens - (one role marker per message + <|assistant|>)
    content = " ".join(m["content"] for m in messages)
    assert len(M.encode(M.chat_prompt(messages))) - len(tok.encode(content).ids) == len(messages) + 1


def test_generated_words_and_english_are_in_the_vocabulary(tok):
    vocab = tok.get_vocab()
    assert all(M.decode_token(i) in vocab for i in range(M.VOCAB_SIZE))
    assert {"the", "and", "function", "value"} <= set(vocab)
    english = list(range(len(vocab) - 10, len(vocab)))  # the last ids are English words: they decode as such
    text = tok.decode(english)
    assert len(text.split()) == 10 and "[UNK]" not in text and text.replace(" ", "").isalpha()
    word = M.decode_token(123)
    assert tok.decode(tok.encode(f"the value of {word}").ids) == f"the value of {word}"
