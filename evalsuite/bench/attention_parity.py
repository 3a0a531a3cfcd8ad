"""Parity of the Forgetting Attention kernels at long T, against a float32 blocked reference (the attention
benchmark's parity records, and the GPU tests).

* :func:`check_parity_gpu`: forward and gradients of the full-sequence kernel.
* :func:`check_decode_parity_gpu`: the decode kernel over caches of up to 33K keys, left-padded.
"""

from __future__ import annotations

import time

import torch

from evalsuite.bench.common import env_info, rel_error


def log_forget_gates(B, T, H, device, generator=None):
    """log f = logsigmoid(x) with per-head biases spanning weak to strong decay ([B, T, H] float32)."""
    bias = torch.linspace(5.0, -1.0, H, device=device)  # sigma(5) ~ 0.993 ... sigma(-1) ~ 0.27
    x = torch.randn(B, T, H, device=device, generator=generator) + bias
    return torch.nn.functional.logsigmoid(x)


def check_parity_gpu(seq_lens=(1024, 2048, 4096, 8192, 16384), head_dim=64, n_heads=2, dtype=torch.bfloat16,
                     verbose=True, device="cuda", config=None) -> list[dict]:  # fmt: skip
    """Kernel forward and gradients vs ``reference.attention_blocked`` on float32 upcasts, at long T.

    B = 1 and a few heads keep the reference affordable. Gates: "mixed" (head h gets a bias from weak to
    strong decay, so |c| reaches ~1e4 at 16k) and "none". ``config``: the kernels' launch settings (a
    :class:`~evalsuite.kernels.forgetting.common.BlockConfig`; default the shipped ones). Returns one record per
    (T, gate) with relative errors ``|out - ref| / |ref|`` of o, dq, dk, dv and d(log f), and their max.
    """
    from evalsuite.kernels.forgetting.forward import forgetting_attention_triton
    from evalsuite.kernels.forgetting.reference import attention_blocked

    dev = torch.device(device)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true float32 reference
    info = env_info()
    records = []
    try:
        for T in seq_lens:
            for gate in ("mixed", "none"):
                gen = torch.Generator(device=dev).manual_seed(T)
                q, k, v, do = (
                    torch.randn(1, T, n_heads, head_dim, device=dev, generator=gen).to(dtype) for _ in range(4)
                )
                logf = log_forget_gates(1, T, n_heads, dev, gen) if gate == "mixed" else None
                t0 = time.perf_counter()
                leaves = [x.clone().requires_grad_() for x in (q, k, v)] + (
                    [] if logf is None else [logf.clone().requires_grad_()]
                )
                cum = None if logf is None else leaves[3].cumsum(1)
                o = forgetting_attention_triton(*leaves[:3], cum, config=config)
                grads = torch.autograd.grad(o, leaves, do)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t_kernel = time.perf_counter() - t0
                ref_leaves = [x.float().requires_grad_() for x in (q, k, v)] + (
                    [] if logf is None else [logf.clone().requires_grad_()]
                )
                ref_cum = None if logf is None else ref_leaves[3].cumsum(1)
                o_ref = attention_blocked(*ref_leaves[:3], ref_cum, ref_cum)
                ref_grads = torch.autograd.grad(o_ref, ref_leaves, do.float())
                errs = {"o": rel_error(o, o_ref)}
                for name, g, r in zip(("dq", "dk", "dv", "dlogf"), grads, ref_grads, strict=False):
                    errs[name] = rel_error(g, r)
                rec = {"kind": "parity", "T": T, "D": head_dim, "H": n_heads, "gate": gate, "dtype": str(dtype)[6:]}
                rec.update({f"rel_err_{k}": e for k, e in errs.items()}, max_rel_err=max(errs.values()))
                rec.update(kernel_s=t_kernel, cum_min=float(cum.detach().min()) if cum is not None else 0.0, **info)
                records.append(rec)
                if verbose:
                    print("parity", T, gate, " ".join(f"{k}={e:.2e}" for k, e in errs.items()), flush=True)
                del o_ref, ref_grads, ref_leaves, grads, leaves, o
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return records


def check_decode_parity_gpu(cache_lens=(1000, 5000, 33000), n_queries=(1, 4, 16), head_dims=(64, 128),
                            dtype=torch.bfloat16, verbose=True, device="cuda") -> list[dict]:  # fmt: skip
    """Decode kernel vs ``reference.attention_blocked`` (float32): B = 2, second sequence left-padded by Tk/3."""
    from evalsuite.kernels.forgetting.decode import forgetting_attention_decode_triton
    from evalsuite.kernels.forgetting.reference import attention_blocked

    dev = torch.device(device)
    info = env_info()
    records = []
    for D in head_dims:
        for Tk in cache_lens:
            for Tq in n_queries:
                gen = torch.Generator(device=dev).manual_seed(Tk + Tq)
                B, H = 2, 4
                q = torch.randn(B, Tq, H, D, device=dev, generator=gen).to(dtype)
                k, v = (torch.randn(B, Tk, H, D, device=dev, generator=gen).to(dtype) for _ in range(2))
                cum_k = log_forget_gates(B, Tk, H, dev, gen).cumsum(1)
                cum_q = cum_k[:, Tk - Tq :]
                key_start = torch.tensor([0, Tk // 3], device=dev)
                o = forgetting_attention_decode_triton(q, k, v, cum_q, cum_k, key_start=key_start)
                o_ref = attention_blocked(q.float(), k.float(), v.float(), cum_q, cum_k, key_start=key_start)
                o_nogate = forgetting_attention_decode_triton(q, k, v)
                o_nogate_ref = attention_blocked(q.float(), k.float(), v.float())
                rec = {"kind": "parity_decode", "Tk": Tk, "Tq": Tq, "D": D, "dtype": str(dtype)[6:]}
                rec.update(rel_err_o=rel_error(o, o_ref), rel_err_o_nogate=rel_error(o_nogate, o_nogate_ref), **info)
                records.append(rec)
                if verbose:
                    print("parity_decode", D, Tk, Tq, f"{rec['rel_err_o']:.2e} {rec['rel_err_o_nogate']:.2e}")
    return records
