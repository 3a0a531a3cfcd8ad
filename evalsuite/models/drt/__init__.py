"""The DRT family: the Differentiable Retrieval-based Transformer with Grouped Cross-Attention (arXiv:2410.01651),
with a chunk-memory decode state and the authors' released checkpoint layout."""

from evalsuite.models.drt import released
from evalsuite.models.drt.layers import sliding_window_attention, sliding_window_attention_dense
from evalsuite.models.drt.memory import ChunkMemory, ChunkMemoryState
from evalsuite.models.drt.model import DRTConfig, DRTForCausalLM
from evalsuite.models.registry import CheckpointLayout, Family, register_family

# DRT_retrieval×1 and ×2 of the paper (§4.1.2): one retrieval over the 6 upper layers, or two groups of 3.
ARCHITECTURES = {"drt": {}, "drt-x2": {"retrieval_groups": 2}}

FAMILY = register_family(
    Family(
        name="drt",
        config_cls=DRTConfig,
        model_cls=DRTForCausalLM,
        architectures=ARCHITECTURES,
        layouts=(CheckpointLayout("drt-official", released.detect, released.convert),),
        description="DRT: sliding-window ALiBi decoder + chunk retrieval with Grouped Cross-Attention, chunk memory",
        # 40 tokens = 10 chunks of 4 tokens + landmark, window 12 < 50 positions: retrieval and the window both act
        tiny=dict(
            vocab_size=97,
            hidden_size=32,
            num_layers=4,
            num_heads=4,
            intermediate_size=64,
            chunk_size=5,
            top_k=2,
            window=12,
            encoder_layers=1,
        ),
    )
)

__all__ = [
    "ARCHITECTURES",
    "FAMILY",
    "ChunkMemory",
    "ChunkMemoryState",
    "DRTConfig",
    "DRTForCausalLM",
    "sliding_window_attention",
    "sliding_window_attention_dense",
]
