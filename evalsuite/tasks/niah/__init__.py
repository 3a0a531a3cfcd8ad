"""Needle in a haystack (FoX paper, arXiv:2503.02130, §4.3, Appendix B.3 and F.5), plus the text 2-hop test.

**Easy and standard modes** reproduce the FoX test (``eval/niah``, adapted from LongAlign's ``Needle_test``,
itself from gkamradt's tester) prompt for prompt. For a cell (context length ``L`` tokens, depth ``d`` %):

1. the haystack (:mod:`evalsuite.data.haystack`) is cut to its first ``L`` tokens, BOS counted, and decoded;
2. that text is re-encoded without BOS, cut to ``L - 200 - len(needle)`` tokens when text + needle would
   exceed ``L - 200`` (the 200-token buffer), and the needle goes in at token ``int(len * d / 100)``, moved
   back to just after the previous ``.`` token (id 13 in GPT-2); at ``d = 100`` it is appended;
3. the result is decoded, and the prompt is ``context + QUIZ + question``: the quiz sentence and the
   completion cue "... Answer: The best thing to do in San Francisco is". No chat template.

Standard mode hides the plain San Francisco needle; easy mode's needle also carries the question, so the
model can answer by copying. With the FoX tokenizer (JSON-escaped GPT-2, BOS counted) and the haystack files
in sorted order, :func:`~.prompts.build_prompt` returns exactly the text FoX's ``prompt.py`` writes for the cell.

**2-hop** (:mod:`evalsuite.tasks.multihop`) hides two chained facts and a distractor chain (the same insertion
rule, generalised to several needles) and asks a question that needs both hops, with a 1-hop control over the
same context. The DRT paper's token-level multi-hop passkey is its own task, :mod:`evalsuite.tasks.drt_passkey`.

Runs write ``records.jsonl`` (one line per cell: length, depth, prompt hash, prediction, scores, the raw judge
reply) and, when done, ``results.json`` (long-format summary records). Rerunning resumes: finished cells are
skipped, cells whose judge call failed are judged again, and adding ``--judge`` to a finished run judges its
stored predictions without generating again.

Its parts, by job: :mod:`.prompts` (the needle insertion and prompt text), :mod:`.grid` (the configuration, its
presets and the cells), :mod:`.jobs` (a cell's prompts and their scoring) and :mod:`.task` (:class:`NiahTask` on the
runner). Importing this package registers the ``niah`` task.
"""

from evalsuite.tasks.niah.grid import (
    AUTO,
    MODES,
    Cell,
    NiahConfig,
    cells_by_length,
    grid_cells,
    items_by_length,
    load_presets,
    preset_for,
    resolve_config,
    split_by_max_length,
    subtasks,
)
from evalsuite.tasks.niah.prompts import (
    EASY_NEEDLE,
    JUDGE_QUESTION,
    JUDGE_REFERENCE,
    KEY_PHRASES,
    QUESTION,
    QUIZ,
    STANDARD_NEEDLE,
    build_prompt,
    insert_needles,
    needle_prompt,
    prompt_sha256,
    two_hop_prompts,
)
from evalsuite.tasks.niah.task import NiahPlan, NiahTask, run_niah

__all__ = [
    "AUTO",
    "EASY_NEEDLE",
    "JUDGE_QUESTION",
    "JUDGE_REFERENCE",
    "KEY_PHRASES",
    "MODES",
    "QUESTION",
    "QUIZ",
    "STANDARD_NEEDLE",
    "Cell",
    "NiahConfig",
    "NiahPlan",
    "NiahTask",
    "build_prompt",
    "cells_by_length",
    "grid_cells",
    "insert_needles",
    "items_by_length",
    "load_presets",
    "needle_prompt",
    "preset_for",
    "prompt_sha256",
    "resolve_config",
    "run_niah",
    "split_by_max_length",
    "subtasks",
    "two_hop_prompts",
]
