"""Checkpoints: our format round-trips; the official FoX release layout loads to the same logits."""

import json

import pytest
import torch
from safetensors.torch import save_file

from evalsuite.errors import UserError
from evalsuite.models.checkpoint import load_checkpoint, save_checkpoint
from evalsuite.models.fox import ARCHITECTURES, ForgettingTransformer, FoxConfig

D, H, LAYERS, V = 32, 4, 2, 101


def build(arch: str, **over) -> ForgettingTransformer:
    cfg = FoxConfig.from_dict(
        {**ARCHITECTURES[arch], "vocab_size": V, "hidden_size": D, "num_layers": LAYERS, "num_heads": H, **over}
    )
    model = ForgettingTransformer(cfg)
    model.init_weights(seed=7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "bias")):
                p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model.eval()


def write_official(model: ForgettingTransformer, arch: str, path, drop: str | None = None):
    """Write ``model`` in the official FoX repo layout (its config keys and tensor names)."""
    cfg = model.cfg
    sd = model.state_dict()
    out = {
        "model.embeddings.weight": sd["embed.weight"],
        "model.norm.weight": sd["norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(cfg.num_layers):
        p, o = f"blocks.{i}.", f"model.layers.{i}."
        for name, t in sd.items():
            if not name.startswith(p):
                continue
            rest = name[len(p) :]
            if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                continue
            rest = {
                "attn.k_proj.shift.weight": "attn.k_proj.shift_proj.weight",
                "attn.v_proj.shift.weight": "attn.v_proj.shift_proj.weight",
                "attn.out_norm.weight": "attn.output_norm.weight",
            }.get(rest, rest)
            out[o + rest] = t
        out[o + "mlp.gate_proj.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
    if drop:
        out.pop(drop)
    transformer_class = arch == "transformer-llama"
    config = {
        "architectures": ["TransformerForCausalLM" if transformer_class else "ForgettingTransformerForCausalLM"],
        "model_type": "transformer-project_fox" if transformer_class else "forgetting_transformer-project_fox",
        "vocab_size": V,
        "hidden_size": D,
        "num_hidden_layers": LAYERS,
        "num_heads": H,
        "num_kv_heads": None,
        "hidden_ratio": cfg.hidden_ratio,
        "intermediate_size": None,
        "hidden_act": "swish",
        "norm_eps": 1e-6,
        "rope_base": 500000,
        "use_rope": cfg.use_rope,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if not transformer_class:
        config.update(
            use_output_gate=cfg.use_output_gate,
            ogate_act="sigmoid",
            fgate_type=cfg.fgate_type,
            fgate_bias_init=False,
            decay_time_min=None,
            decay_time_max=None,
            use_output_norm=cfg.use_output_norm,
            qk_norm=cfg.qk_norm,
            qk_norm_share_param_across_head=cfg.qk_norm_shared,
            use_k_shift=cfg.use_k_shift,
            use_v_shift=cfg.use_v_shift,
        )
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))


def logits(model, seed=0):
    ids = torch.randint(0, V, (2, 33), generator=torch.Generator().manual_seed(seed))
    return model.logits(model(ids))


@pytest.mark.parametrize(
    "arch, shared",
    [
        ("fox-pro", True),
        ("fox-pro", False),
        ("fox-llama", False),
        ("transformer-pro", True),
        ("transformer-llama", False),
    ],
)
def test_official_layout_gives_the_same_logits(arch, shared, tmp_path):
    model = build(arch, qk_norm_shared=shared)
    write_official(model, arch, tmp_path / "official")
    save_checkpoint(model, tmp_path / "ours")
    official, layout = load_checkpoint(tmp_path / "official")
    ours, _ = load_checkpoint(tmp_path / "ours")
    assert layout == "fox-official"
    assert official.cfg.qk_norm_shared == (shared and official.cfg.qk_norm)  # read off the q_norm shape
    assert official.cfg.fgate_type == ARCHITECTURES[arch]["fgate_type"]
    assert official.cfg.use_rope == ARCHITECTURES[arch]["use_rope"]
    torch.testing.assert_close(logits(official), logits(ours), rtol=1e-6, atol=1e-6)


def test_missing_tensor_is_named(tmp_path):
    write_official(build("fox-pro"), "fox-pro", tmp_path / "c", drop="model.layers.1.attn.ogate_proj.weight")
    with pytest.raises(UserError, match=r"missing tensor\(s\) blocks\.1\.attn\.ogate_proj\.weight"):
        load_checkpoint(tmp_path / "c")


def test_mismatched_shape_is_named(tmp_path):
    model = build("fox-llama")
    save_checkpoint(model, tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    cfg["config"]["num_layers"] = 1
    cfg["config"]["intermediate_size"] = 64
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="unexpected tensor|shape"):
        load_checkpoint(tmp_path / "c")
    cfg["config"]["num_layers"] = LAYERS
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"tensor blocks\.0\.mlp\.gate_proj\.weight has shape"):
        load_checkpoint(tmp_path / "c")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")
