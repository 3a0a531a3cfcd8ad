"""The GSA family: Gated Slot Attention LMs (arXiv:2409.07146), plus fla's released checkpoint layouts."""

from evalsuite.models.gsa import fla_layout
from evalsuite.models.gsa.model import GatedSlotAttention, GSAConfig, GSAForCausalLM
from evalsuite.models.registry import CheckpointLayout, Family, register_family

ARCHITECTURES = {"gsa": {}}  # the paper's block; sizes come from cards

FAMILY = register_family(
    Family(
        name="gsa",
        config_cls=GSAConfig,
        model_cls=GSAForCausalLM,
        architectures=ARCHITECTURES,
        layouts=(CheckpointLayout("fla-gsa", fla_layout.detect, fla_layout.convert),),
        description="Gated Slot Attention (two-pass gated slot memory, fixed recurrent state)",
        tiny=dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=2, num_slots=8),
    )
)

__all__ = ["ARCHITECTURES", "FAMILY", "GSAConfig", "GSAForCausalLM", "GatedSlotAttention"]
