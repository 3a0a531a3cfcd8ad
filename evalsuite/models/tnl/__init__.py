"""The TNL family: TransNormerLLM with Lightning Attention (arXiv:2405.17381), plus the released HF layout."""

from evalsuite.models.registry import CheckpointLayout, Family, register_family
from evalsuite.models.tnl import released
from evalsuite.models.tnl.model import TNLConfig, TransNormerLLM, alibi_slopes, decay_slopes

ARCHITECTURES = {"tnl": {}}  # the paper's "Mix" block (LRPE-d in layer 0, exponential decay elsewhere)

FAMILY = register_family(
    Family(
        name="tnl",
        config_cls=TNLConfig,
        model_cls=TransNormerLLM,
        architectures=ARCHITECTURES,
        layouts=(CheckpointLayout("transnormer", released.detect, released.convert),),
        description="TransNormerLLM: Lightning Attention (decayed linear attention), fixed recurrent state",
        tiny=dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, glu_dim=64),
    )
)

__all__ = ["ARCHITECTURES", "FAMILY", "TNLConfig", "TransNormerLLM", "alibi_slopes", "decay_slopes"]
