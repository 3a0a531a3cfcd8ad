"""Parameters of a model card by component, to explain a count that differs from a paper's.

A paper's "760M" or "385M" is one number; which parameters it counts (the input embedding, an untied head, a
retriever's encoder) is often unsaid. :func:`breakdown` counts a card's parameters (built on the meta device: no
memory, no weights) per component, so a README can say which sum the paper's number is.
"""

from __future__ import annotations

from collections import Counter

# Components by parameter name, the first match wins (a chunk encoder's norms belong to the encoder).
COMPONENTS = (
    ("input embedding", ("embed.",)),
    ("LM head", ("lm_head.",)),
    ("chunk encoder", ("encoder.", "enc_prenorm", "chunk_k_proj", "chunk_v_proj", "lmk_norms")),
    ("grouped cross-attention", (".gca.",)),
    ("MLP", (".mlp.", ".channel_mixer.")),
    ("norms", ("norm",)),
    ("token mixer", ("",)),  # attention, GSA, Lightning: what is left
)


def component(name: str) -> str:
    return next(label for label, keys in COMPONENTS if any(key in name for key in keys))


def breakdown(card) -> dict[str, int]:
    """``{component: parameters}`` of a :class:`~evalsuite.cards.ModelCard`, in :data:`COMPONENTS` order (a tied
    head has no parameters of its own, so no ``LM head`` entry)."""
    import torch

    with torch.device("meta"):
        model = card.build_module()
    counts = Counter()
    for name, parameter in model.named_parameters():
        counts[component(name)] += parameter.numel()
    return {label: counts[label] for label, _ in COMPONENTS if counts[label]}


def breakdown_markdown(names: list[str]) -> str:
    """A Markdown table of the cards ``names``: millions of parameters per component, the non-embedding count and
    the total."""
    from evalsuite.cards import load_card

    rows = {name: breakdown(load_card(name)) for name in names}
    labels = [label for label, _ in COMPONENTS if any(label in r for r in rows.values())]
    out = ["| card | " + " | ".join(labels) + " | non-embedding | total |",
           "|:---|" + "---:|" * (len(labels) + 2)]  # fmt: skip
    for name, parts in rows.items():
        total = sum(parts.values())
        cells = [f"{parts.get(label, 0) / 1e6:.2f}M" for label in labels]
        cells += [f"{(total - parts.get('input embedding', 0)) / 1e6:.2f}M", f"{total / 1e6:.2f}M"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
