"""The PyTorch side of bench/gpu_check.sh: times the ops bench_cuda_ops timed,
on the same shapes, in PyTorch on the same GPU, and prints one markdown table.

  build/bench_cuda_ops > out/cuda_ops.jsonl
  python3 bench/cuda_ops_torch.py out/cuda_ops.jsonl

PyTorch runs fp32 with TF32 off and cuDNN's deterministic algorithms (ckrun's
defaults); records with "dtype": "bf16" (attention, products, GEGLU, permute,
upsample, Flux's block ops with bf16 storage) run in bf16, where scaled_dot_product_attention
picks its flash-attention kernels. Times are CUDA-event medians of --reps runs after two warm-ups. A
backward is timed as PyTorch's own backward kernel where aten has one that takes
the forward's saved statistics (group/layer norm: ckrun recomputes them, which
the ratio includes); attention's backward is autograd's forward + backward
minus the forward, and so are group_norm_silu's (silu of group_norm, two ops in
PyTorch), rms_norm's and modulate's and gate's (the broadcasting expressions
diffusers' Flux blocks run). rope is BFL's apply_rope expression. Memory-bound rows give the bytes ckrun's row moves (every input read
once, every output written once) over each side's time, beside the device's
bandwidth (the H200's 4.8 TB/s); they are what the runs measured, nothing more.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def timed(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rand(shape, dtype=torch.float32):
    return (torch.rand(*shape, device="cuda") * 2 - 1).to(dtype)


def dtype_of(rec):
    return torch.bfloat16 if rec.get("dtype") == "bf16" else torch.float32


def attention_inputs(rec):
    (q, k, v), heads = rec["in"][-3:], rec["i"][0]
    B, LQ, HD = q
    LK, D = k[1], HD // heads
    dt = dtype_of(rec)
    tq = rand(q, dt).view(B, LQ, heads, D).transpose(1, 2)
    tk = rand(k, dt).view(B, LK, heads, D).transpose(1, 2)
    tv = rand(v, dt).view(B, LK, heads, D).transpose(1, 2)
    return tq, tk, tv


def torch_fn(rec):
    """A closure running rec's op in PyTorch, or None when there is no counterpart."""
    op, i, f, ins = rec["op"], rec["i"], rec["f"], rec["in"]
    if op in ("linear", "linear_geglu"):
        dt = dtype_of(rec)
        x, w = rand(ins[0], dt), rand(ins[1], dt)
        b = rand(ins[2], dt) if len(ins) > 2 else None
        if op == "linear":
            return lambda: F.linear(x, w, b)
        approx = "tanh" if i[0] else "none"
        return lambda: (lambda h, g: h * F.gelu(g, approximate=approx))(*F.linear(x, w, b).chunk(2, -1))
    if op == "matmul":
        a, b = rand(ins[0]), rand(ins[1])
        a = a.transpose(-1, -2) if i[0] else a
        b = b.transpose(-1, -2) if i[1] else b
        return lambda: torch.matmul(a, b)
    if op in ("conv2d", "conv2d_bwd_data", "conv2d_bwd_filter"):
        stride, padding = (i[0], i[1]), (i[2], i[3])
        if op == "conv2d":
            x, w = rand(ins[0]), rand(ins[1])
            b = rand(ins[2]) if len(ins) > 2 else None
            return lambda: F.conv2d(x, w, b, stride, padding)
        if op == "conv2d_bwd_data":
            dy, w, xs = rand(ins[0]), rand(ins[1]), rec["out"][0]
            return lambda: torch.nn.grad.conv2d_input(xs, w, dy, stride, padding)
        dy, x, ws = rand(ins[0]), rand(ins[1]), rec["out"][0]
        return lambda: (torch.nn.grad.conv2d_weight(x, ws, dy, stride, padding), dy.sum((0, 2, 3)))
    if op == "group_norm":
        dt = dtype_of(rec)
        x, g, b = rand(ins[0], dt), rand(ins[1], dt), rand(ins[2], dt)
        return lambda: F.group_norm(x, i[0], g, b, f[0])
    if op == "group_norm_bwd":
        dt = dtype_of(rec)
        dy, x, g = rand(ins[0], dt), rand(ins[1], dt), rand(ins[2], dt)
        N, C = x.shape[0], x.shape[1]
        HW = x.numel() // (N * C)
        _, mean, rstd = torch.ops.aten.native_group_norm(x, g, None, N, C, HW, i[0], f[0])
        return lambda: torch.ops.aten.native_group_norm_backward(dy, x, mean, rstd, g, N, C, HW, i[0],
                                                                 [True, True, True])
    if op == "group_norm_silu":
        x, g, b = rand(ins[0]), rand(ins[1]), rand(ins[2])
        return lambda: F.silu(F.group_norm(x, i[0], g, b, f[0]))
    if op == "group_norm_silu_bwd":
        dy = rand(ins[0])
        x, g, b = (rand(s).requires_grad_() for s in ins[1:4])

        def fwd_bwd():
            torch.autograd.grad(F.silu(F.group_norm(x, i[0], g, b, f[0])), (x, g, b), dy)

        def fwd():
            with torch.no_grad():
                F.silu(F.group_norm(x, i[0], g, b, f[0]))

        return (fwd_bwd, fwd)
    if op == "add":
        a, b = rand(ins[0]), rand(ins[1])
        return lambda: a + b
    if op == "adamw_step":
        p = torch.nn.Parameter(rand(ins[0]))
        p.grad = rand(ins[1])
        opt = torch.optim.AdamW([p], lr=1e-4, betas=(f[0], f[1]), eps=f[2], weight_decay=f[3], fused=True)
        return opt.step
    if op == "layer_norm":
        dt = dtype_of(rec)
        x = rand(ins[0], dt)
        g = rand(ins[1], dt) if len(ins) > 1 else None
        b = rand(ins[2], dt) if len(ins) > 2 else None
        return lambda: F.layer_norm(x, (x.shape[-1],), g, b, f[0])
    if op == "layer_norm_bwd":
        dt = dtype_of(rec)
        dy, x = rand(ins[0], dt), rand(ins[1], dt)
        g = rand(ins[2], dt) if len(ins) > 2 else None
        b = torch.zeros_like(g) if g is not None else None
        shape = [x.shape[-1]]
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, g, b, f[0])
        mask = [True, g is not None, g is not None]
        return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, rstd, g, b, mask)
    if op == "rms_norm":
        dt = dtype_of(rec)
        x = rand(ins[0], dt)
        w = rand(ins[1], dt) if len(ins) > 1 else None
        return lambda: F.rms_norm(x, (x.shape[-1],), w, f[0])
    if op == "rms_norm_bwd":
        # autograd's forward + backward minus the forward (aten has no backward kernel of its own)
        dt = dtype_of(rec)
        dy = rand(ins[0], dt)
        x = rand(ins[1], dt).requires_grad_()
        w = rand(ins[2], dt).requires_grad_() if len(ins) > 2 else None
        wrt = (x, w) if w is not None else (x,)

        def fwd_bwd():
            torch.autograd.grad(F.rms_norm(x, (x.shape[-1],), w, f[0]), wrt, dy)

        def fwd():
            with torch.no_grad():
                F.rms_norm(x, (x.shape[-1],), w, f[0])

        return (fwd_bwd, fwd)
    if op == "rope":
        # Black Forest Labs' apply_rope on q [B,L,H*D] viewed [B,L,H,D/2,1,2] with its
        # fp32 [L,D/2,2,2] table; the rotation in fp32, the result in q's type
        dt = dtype_of(rec)
        B, L, F_ = ins[0]
        D = ins[1][1]
        x = rand(ins[0], dt)
        ang = torch.rand(L, D // 2, device="cuda") * 6.28
        fc = torch.stack([ang.cos(), -ang.sin(), ang.sin(), ang.cos()], -1).view(1, L, 1, D // 2, 2, 2)

        def rope():
            x_ = x.float().reshape(B, L, F_ // D, D // 2, 1, 2)
            return (fc[..., 0] * x_[..., 0] + fc[..., 1] * x_[..., 1]).reshape(B, L, F_).type_as(x)

        return rope
    if op in ("modulate", "gate"):
        dt = dtype_of(rec)
        x, a = rand(ins[0], dt), rand(ins[1], dt)[:, None]
        if op == "gate":
            y = rand(ins[2], dt)
            return lambda: x + a * y
        scale = rand(ins[2], dt)[:, None]
        return lambda: (1 + scale) * x + a
    if op in ("modulate_bwd", "gate_bwd"):
        # autograd's forward + backward minus the forward, as diffusers' blocks run them
        dt = dtype_of(rec)
        dy = rand(ins[0], dt)
        if op == "gate_bwd":
            g, y = rand(ins[1], dt).requires_grad_(), rand(ins[2], dt).requires_grad_()
            x = torch.zeros_like(y)
            run, wrt = (lambda: x + g[:, None] * y), (g, y)
        else:
            x, sc = rand(ins[1], dt).requires_grad_(), rand(ins[2], dt).requires_grad_()
            sh = torch.zeros_like(sc).requires_grad_()
            run, wrt = (lambda: (1 + sc[:, None]) * x + sh[:, None]), (x, sh, sc)

        def fwd_bwd():
            torch.autograd.grad(run(), wrt, dy)

        def fwd():
            with torch.no_grad():
                run()

        return (fwd_bwd, fwd)
    if op == "attention":
        q, k, v = attention_inputs(rec)
        scale = f[0] or None
        return lambda: F.scaled_dot_product_attention(q, k, v, scale=scale)
    if op == "attention_bwd":
        q, k, v = (t.detach().requires_grad_() for t in attention_inputs(rec))
        dout = rand(rec["in"][0], dtype_of(rec)).view(q.shape[0], q.shape[2], q.shape[1], q.shape[3]).transpose(1, 2)
        scale = f[0] or None

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, scale=scale)
            torch.autograd.grad(o, (q, k, v), dout)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, scale=scale)

        return (fwd_bwd, fwd)
    if op == "geglu":
        x = rand(ins[0], dtype_of(rec))
        approx = "tanh" if i[0] else "none"
        return lambda: (lambda h, g: h * F.gelu(g, approximate=approx))(*x.chunk(2, -1))
    if op == "geglu_bwd":
        dy = rand(ins[0])
        x = rand(ins[1]).requires_grad_()
        approx = "tanh" if i[0] else "none"

        def fwd_bwd():
            h, g = x.chunk(2, -1)
            torch.autograd.grad(h * F.gelu(g, approximate=approx), x, dy)

        def fwd():
            with torch.no_grad():
                h, g = x.chunk(2, -1)
                h * F.gelu(g, approximate=approx)

        return (fwd_bwd, fwd)
    if op == "silu":
        x = rand(ins[0])
        return lambda: F.silu(x)
    if op == "permute":
        x = rand(ins[0], dtype_of(rec))
        order = i[:x.dim()]
        return lambda: x.permute(*order).contiguous()
    if op == "upsample2x":
        x = rand(ins[0], dtype_of(rec))
        return lambda: F.interpolate(x, scale_factor=2, mode="nearest")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl", nargs="?", default="-")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_ops_torch.py: torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    src = sys.stdin if args.jsonl == "-" else open(args.jsonl)
    recs = [json.loads(line) for line in src if line.strip()]

    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}, fp32 (bf16 where the op says so), "
          "TF32 off, cuDNN deterministic")
    print()
    print("| scale | op | shapes | ckrun ms | PyTorch ms | ckrun / PyTorch | ckrun TFLOP/s | PyTorch TFLOP/s | MB moved | ckrun GB/s | PyTorch GB/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    tot = {}
    for rec in recs:
        ms = rec["ms"]
        fn = torch_fn(rec)
        tms = None
        if fn is not None:
            torch.manual_seed(0)
            if isinstance(fn, tuple):
                tms = max(timed(fn[0], args.reps) - timed(fn[1], args.reps), 0.0)
            else:
                tms = timed(fn, args.reps)
            del fn
            torch.cuda.empty_cache()
        tf = rec["flops"] / (ms * 1e9) if ms > 0 else float("nan")
        ttf = f"{rec['flops'] / (tms * 1e9):.1f}" if tms else "-"
        op = rec["op"] + (" (bf16)" if rec.get("dtype") == "bf16" else "")
        ratio = f"{ms / tms:.2f}" if tms and ms > 0 else "-"
        cell = f"{ms:.3f}" if ms >= 0 else "FAILED: " + rec.get("error", "")
        tcell = f"{tms:.3f}" if tms is not None else "-"
        mb = gb = tgb = "-"
        if "bytes" in rec:
            mb = f"{rec['bytes'] / 1e6:.1f}"
            gb = f"{rec['bytes'] / (ms * 1e6):.0f}" if ms > 0 else "-"
            tgb = f"{rec['bytes'] / (tms * 1e6):.0f}" if tms else "-"
        print(f"| {rec['scale']} | {op} | {rec['label']} | {cell} | {tcell} | {ratio} | {tf:.1f} | {ttf} | {mb} | {gb} | {tgb} |")
        if ms > 0 and tms and rec.get("dtype", "fp32") == "fp32":
            t = tot.setdefault(rec["scale"], [0.0, 0.0])
            t[0] += ms
            t[1] += tms
    print()
    print("GB/s: the bytes of the MB column over each side's time; the H200's memory moves at most 4800 GB/s.")
    print()
    for scale, (a, b) in tot.items():
        print(f"{scale}: the fp32 ops above take {a:.2f} ms in ckrun, {b:.2f} ms in PyTorch ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
