"""Any adapter as an OpenAI-compatible HTTP API (``evalsuite serve --model M``): a Starlette app under uvicorn, the
``serve`` extra (``pip install 'evalsuite[serve]'``; without it this package imports, and serving says what is missing).

Routes: ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``, ``POST /v1/chat/completions``; the
tokenizer as vLLM serves it (``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``:
:mod:`evalsuite.serve.tokenizer_api`); and ``GET /health``, ``GET /stats`` (JSON) and ``GET /metrics`` (Prometheus
text, :mod:`evalsuite.serve.metrics`) for operators.

**BOS**: token-id prompts are taken as given; a string prompt gets the tokenizer's BOS when its convention adds one,
unless it already begins with the BOS token (:func:`~evalsuite.serve.tokenizer_api.encode_text`).

**Completions**: ``prompt`` is a string, a list of strings, or token ids (a list of ints, or a list of such lists;
token-tier models only); ``max_tokens`` (default 16, as OpenAI; 0 with ``echo`` scores the prompt only),
``temperature`` (default 1, as OpenAI; 0 is greedy), ``stop`` (a string or a list), ``seed``, ``n`` (choices per
prompt, choice i sampled with seed ``seed + i`` as vLLM does; ``best_of`` only equal to it), ``echo``, ``logprobs``
(0..5: the log-probability of each token and the top ones; token-tier models only) and ``stream``. The sampler's
fields, OpenAI's and vLLM's (:class:`~evalsuite.generation.types.GenerationConfig` defines each): ``top_p``,
``top_k``, ``min_p``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``,
``min_tokens``, ``stop_token_ids`` (the stop token ends a choice: counted, not in the text; ``stop_reason`` is its
id) and ``ignore_eos``; an adapter that does not honour one (``TextAdapter.sampler_extras``) refuses it. vLLM's
``prompt_logprobs`` (0..20, token-tier models): per prompt token after the first, ``{token id: {"logprob", "rank",
"decoded_token"}}`` of the prompt's token and the likeliest ones. With ``echo=True, max_tokens=0, logprobs=N`` the
reply gives the prompt's per-token log-probabilities, the first token's ``null`` as OpenAI does; every prompt token
is listed and scored, and ``tokens`` join back to the choice's text (a BOS token the tokenizer put before a text
prompt has the string ``""``); ``text_offset`` counts characters of the echoed text, so a client finds a
continuation by offset.

**Fields**: every field of a request is implemented, accepted at the one value that asks for nothing more (e.g.
``tools: []``, ``add_generation_prompt: true``), accepted because it cannot change a reply (``user``), or refused
with a 400 naming it -- guided decoding, ``response_format`` other than text, tools, chat ``echo``, beam search,
and any field the server does not know (:mod:`evalsuite.serve.fields` lists them).

**Chat**: ``messages`` become one prompt: the tokenizer's chat template when it has one (HF models), else this
plain template, documented here and in the README::

    System: <content>\\n  User: <content>\\n  Assistant: <content>\\n ... then "Assistant:"

(one ``Role: content`` line per message, the role capitalised, then ``Assistant:`` for the reply to follow).
``max_tokens`` (or ``max_completion_tokens``) defaults to 256; the sampler's fields, ``n`` and ``prompt_logprobs``
(beside the choices) as for completions.

**Streaming** (``stream: true``): server-sent events, ``data: {chunk}`` as tokens are made
(:class:`~evalsuite.serve.live.LiveText`) and a final chunk with the ``finish_reason``, then ``data: [DONE]``;
``stream_options.include_usage`` adds a usage chunk. Their concatenation is the non-streamed text. With ``n`` or
several prompts, every choice generates from the start and they are sent choice after choice.

**Scheduling**: :mod:`evalsuite.serve.scheduler` -- one model thread, continuous batching one step at a time
(requests join between decode steps and leave when they end or their client disconnects), every model call
(generation, scoring) in that thread, so the event loop keeps accepting requests. On the suite's own models greedy
and sampled requests share a batch, each row chosen and ended by the native adapter's own rules
(:class:`~evalsuite.generation.sampling.TokenChooser`, :class:`~evalsuite.generation.finish.Finisher`) with its own
settings and its own seeded generator, so a request gets the tokens it gets alone, whatever else is in flight. Other
adapters run a batch of requests with the same length, stop strings and EOS rule as one generate call; there a
sampled request runs alone.

**Errors** have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for invalid JSON or fields
and for a request over the context length (the message gives the limit; code ``context_length_exceeded``), 404 for
an unknown model or route, 405 for a wrong method, 500 (logged with its traceback) for anything else; the server
never goes down with a request.
"""

from evalsuite.serve.app import build_app, require_serve, serve
from evalsuite.serve.handlers import OpenAIServer
from evalsuite.serve.protocol import APIError, ServeConfig, chat_prompt, split_text, token_pieces

__all__ = [
    "APIError",
    "OpenAIServer",
    "ServeConfig",
    "build_app",
    "chat_prompt",
    "require_serve",
    "serve",
    "split_text",
    "token_pieces",
]
