"""The FoX family: Forgetting Transformer and the Transformer baselines (arXiv:2503.02130), registered as the
four architectures of the paper plus the official release layout."""

from evalsuite.models.fox import official
from evalsuite.models.fox.cache import KVCache
from evalsuite.models.fox.model import ForgettingTransformer, FoxConfig, decay_time_bias
from evalsuite.models.registry import CheckpointLayout, Family, register_family

# The paper's four block designs as FoxConfig overrides (FoX paper §4.1 and Appendix A).
_PRO = dict(qk_norm=True, use_output_gate=True, use_output_norm=True, use_k_shift=True, use_v_shift=True)
_LLAMA = dict(qk_norm=False, use_output_gate=False, use_output_norm=False, use_k_shift=False, use_v_shift=False)
ARCHITECTURES = {
    "fox-pro": dict(fgate_type="full", use_rope=False, hidden_ratio=3.5, **_PRO),
    "fox-llama": dict(fgate_type="full", use_rope=False, hidden_ratio=4, **_LLAMA),
    "transformer-pro": dict(fgate_type="none", use_rope=True, hidden_ratio=3.5, **_PRO),
    "transformer-llama": dict(fgate_type="none", use_rope=True, hidden_ratio=4, **_LLAMA),
}

FAMILY = register_family(
    Family(
        name="fox",
        config_cls=FoxConfig,
        model_cls=ForgettingTransformer,
        architectures=ARCHITECTURES,
        layouts=(CheckpointLayout("fox-official", official.detect, official.convert),),
        description="Forgetting Transformer (LLaMA and Pro blocks) and the Transformer baselines",
        tiny=dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4),
    )
)

__all__ = ["ARCHITECTURES", "FAMILY", "ForgettingTransformer", "FoxConfig", "KVCache", "decay_time_bias"]
