"""The PyTorch side of bench/vs_pytorch.sh, and the referee.

A plain PyTorch UNet with exactly sdxl-tiny's shapes and diffusers' parameter
names (no diffusers needed), the same training step as bench/vs_pytorch.lua
(epsilon objective, MSE, backward, AdamW), and a driver that runs ckrun's steps
(a bench/vs_pytorch.lua child process, one step per line on its stdin) and
PyTorch's alternately in one process tree, so load from elsewhere falls on both.

  /usr/bin/python3 bench/vs_pytorch.py --threads 2 --steps 7 --warmup 2
  /usr/bin/python3 bench/vs_pytorch.py --ab OLD/ckrun     two ckrun builds, alternating

Prints a markdown table: median step times, the ratio ckrun / PyTorch, the bytes
each side holds for backward, and for each checkpointed case how much time
checkpointing adds on each side. --check also loads ckrun's weights and inputs
into the PyTorch model and compares the loss before and after one step.
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when libgomp loads, with torch
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

CONFIG = dict(  # diffusers' config keys, as stdlib/ck/unet.lua's "sdxl-tiny"
    in_channels=4, out_channels=4, block_out_channels=(32, 64, 128), layers_per_block=2,
    transformer_layers_per_block=(1, 1, 2), attention_head_dim=(1, 2, 4), cross_attention_dim=64,
    norm_num_groups=32, norm_eps=1e-5, addition_time_embed_dim=32,
    projection_class_embeddings_input_dim=256,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
)
TOKENS = 77

# ---- the model (diffusers' module tree and names, only what sdxl-tiny uses)

# Set while the bytes held for backward are counted: storages that checkpoints
# keep as their inputs (torch.utils.checkpoint holds them outside autograd's
# saved tensors, so saved_tensors_hooks do not see them).
_held = None


def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


def ckpt(module, *args):
    out = torch.utils.checkpoint.checkpoint(module, *args, use_reentrant=False)
    # without a graph through it (a frozen block on inputs that need no grad) a
    # checkpoint keeps nothing
    if _held is not None and out.requires_grad:
        for a in args:
            if torch.is_tensor(a):
                _held[storage_key(a)[0]] = (storage_key(a)[1], a)
    return out


class Timesteps(nn.Module):
    def __init__(self, channels, flip_sin_to_cos=True, shift=0.0):
        super().__init__()
        self.channels, self.flip, self.shift = channels, flip_sin_to_cos, shift

    def forward(self, t):
        half = self.channels // 2
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / (half - self.shift)
        emb = t[:, None].float() * torch.exp(exponent)[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        if self.flip:
            emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
        return emb


class TimestepEmbedding(nn.Module):
    def __init__(self, cin, dim):
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class ResnetBlock2D(nn.Module):
    def __init__(self, cin, cout, temb, groups, eps):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return x + h


class LoRALinear(nn.Module):
    """nn.Linear plus scale * up(down(x)), kohya's init (down kaiming-uniform, up zeros)."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.lora_down = nn.Linear(base.in_features, rank, bias=False)
        self.lora_up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_up.weight)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.lora_up(self.lora_down(x)) * self.scale


class Attention(nn.Module):
    def __init__(self, dim, heads, dim_head, cross=None):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(cross or dim, inner, bias=False)
        self.to_v = nn.Linear(cross or dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x, context=None):
        context = x if context is None else context
        b, lq, _ = x.shape
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        h = self.heads

        def split(t):
            return t.reshape(b, t.shape[1], h, -1).transpose(1, 2)

        o = self.attend(split(q), split(k), split(v))
        o = o.transpose(1, 2).reshape(b, lq, -1)
        return self.to_out[1](self.to_out[0](o))

    @staticmethod
    def attend(q, k, v):
        """softmax(q k^T / sqrt(d)) v over [batch, heads, tokens, d]."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        return torch.matmul(scores.softmax(dim=-1), v)


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, 2 * dim_out)

    def forward(self, x):
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, cross):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, dim_head, cross)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class Transformer2DModel(nn.Module):
    def __init__(self, c, heads, layers, cross, groups):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=1e-6)
        self.proj_in = nn.Linear(c, c)
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(c, heads, c // heads, cross) for _ in range(layers)])
        self.proj_out = nn.Linear(c, c)
        self.checkpoint = False

    def forward(self, x, context):
        b, c, hh, ww = x.shape
        h = self.norm(x).permute(0, 2, 3, 1).reshape(b, hh * ww, c)
        h = self.proj_in(h)
        for blk in self.transformer_blocks:
            h = ckpt(blk, h, context) if self.checkpoint else blk(h, context)
        h = self.proj_out(h).reshape(b, hh, ww, c).permute(0, 3, 1, 2)
        return h + x


class Downsample2D(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Block(nn.Module):
    """Down and up blocks, with or without attention (diffusers' four classes)."""

    def __init__(self, resnets, attentions, sampler_name=None, sampler=None):
        super().__init__()
        # diffusers registers attentions before resnets
        if attentions:
            self.attentions = nn.ModuleList(attentions)
        else:
            self.attentions = None
        self.resnets = nn.ModuleList(resnets)
        if sampler is not None:
            setattr(self, sampler_name, nn.ModuleList([sampler]))
        self.sampler_name = sampler_name if sampler is not None else None
        self.checkpoint = False

    def resnet(self, i, x, temb):
        r = self.resnets[i]
        return ckpt(r, x, temb) if self.checkpoint else r(x, temb)

    def down(self, x, temb, context):
        states = []
        for i in range(len(self.resnets)):
            x = self.resnet(i, x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
            states.append(x)
        if self.sampler_name:
            x = getattr(self, self.sampler_name)[0](x)
            states.append(x)
        return x, states

    def up(self, x, skips, temb, context):
        for i in range(len(self.resnets)):
            x = self.resnet(i, torch.cat([x, skips.pop()], dim=1), temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
        if self.sampler_name:
            x = getattr(self, self.sampler_name)[0](x)
        return x


class MidBlock(nn.Module):
    def __init__(self, c, temb, heads, layers, cross, groups, eps):
        super().__init__()
        self.attentions = nn.ModuleList([Transformer2DModel(c, heads, layers, cross, groups)])
        self.resnets = nn.ModuleList([ResnetBlock2D(c, c, temb, groups, eps) for _ in range(2)])
        self.checkpoint = False

    def forward(self, x, temb, context):
        run = (lambda r, *a: ckpt(r, *a)) if self.checkpoint else (lambda r, *a: r(*a))
        x = run(self.resnets[0], x, temb)
        for attn, r in zip(self.attentions, self.resnets[1:]):
            x = run(r, attn(x, context), temb)
        return x


class UNet2DConditionModel(nn.Module):
    def __init__(self, c=CONFIG):
        super().__init__()
        boc, n = c["block_out_channels"], len(c["block_out_channels"])
        groups, eps, cross = c["norm_num_groups"], c["norm_eps"], c["cross_attention_dim"]
        temb = boc[0] * 4
        layers, tl, heads = c["layers_per_block"], c["transformer_layers_per_block"], c["attention_head_dim"]
        self.conv_in = nn.Conv2d(c["in_channels"], boc[0], 3, padding=1)
        self.time_proj = Timesteps(boc[0])
        self.time_embedding = TimestepEmbedding(boc[0], temb)
        self.add_time_proj = Timesteps(c["addition_time_embed_dim"])
        self.add_embedding = TimestepEmbedding(c["projection_class_embeddings_input_dim"], temb)
        down, out = [], boc[0]
        for i in range(n):
            cin, out = out, boc[i]
            resnets = [ResnetBlock2D(cin if j == 0 else out, out, temb, groups, eps) for j in range(layers)]
            attn = None
            if c["down_block_types"][i] == "CrossAttnDownBlock2D":
                attn = [Transformer2DModel(out, heads[i], tl[i], cross, groups) for _ in range(layers)]
            down.append(Block(resnets, attn, "downsamplers", Downsample2D(out) if i < n - 1 else None))
        rboc, rtl, rheads = boc[::-1], tl[::-1], heads[::-1]
        up, out = [], rboc[0]
        for i in range(n):
            prev, out = out, rboc[i]
            skip_last = rboc[min(i + 1, n - 1)]
            resnets = [ResnetBlock2D((prev if j == 0 else out) + (skip_last if j == layers else out), out, temb,
                                     groups, eps) for j in range(layers + 1)]
            attn = None
            if c["up_block_types"][i] == "CrossAttnUpBlock2D":
                attn = [Transformer2DModel(out, rheads[i], rtl[i], cross, groups) for _ in range(layers + 1)]
            up.append(Block(resnets, attn, "upsamplers", Upsample2D(out) if i < n - 1 else None))
        self.down_blocks = nn.ModuleList(down)
        self.up_blocks = nn.ModuleList(up)
        self.mid_block = MidBlock(boc[-1], temb, heads[-1], tl[-1], cross, groups, eps)
        self.conv_norm_out = nn.GroupNorm(groups, boc[0], eps=eps)
        self.conv_out = nn.Conv2d(boc[0], c["out_channels"], 3, padding=1)

    def set_checkpointing(self, on):
        for m in self.modules():
            if hasattr(m, "checkpoint"):
                m.checkpoint = on

    def forward(self, sample, timesteps, context, text_embeds, time_ids):
        b = sample.shape[0]
        emb = self.time_embedding(self.time_proj(timesteps))
        te = self.add_time_proj(time_ids.flatten()).reshape(b, -1)
        emb = emb + self.add_embedding(torch.cat([text_embeds, te], dim=-1))
        x = self.conv_in(sample)
        skips = [x]
        for blk in self.down_blocks:
            x, states = blk.down(x, emb, context)
            skips += states
        x = self.mid_block(x, emb, context)
        for blk in self.up_blocks:
            x = blk.up(x, skips, emb, context)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


def attach_lora(model, rank, alpha, targets=("to_q", "to_k", "to_v", "to_out.0")):
    """Freezes the base and wraps every targeted Linear; returns the adapter parameters."""
    for prm in model.parameters():
        prm.requires_grad_(False)
    params = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, Attention):
            continue
        for t in targets:
            if t == "to_out.0":
                mod.to_out[0] = LoRALinear(mod.to_out[0], rank, alpha)
                params += [mod.to_out[0].lora_down.weight, mod.to_out[0].lora_up.weight]
            else:
                setattr(mod, t, LoRALinear(getattr(mod, t), rank, alpha))
                params += [getattr(mod, t).lora_down.weight, getattr(mod, t).lora_up.weight]
    return params


def diffusers_name(name):
    """Our module path -> the diffusers/ckrun key (LoRA wrappers hide the base)."""
    return name.replace(".base.", ".")


# ---- the training step

class Run:
    def __init__(self, batch, latent, use_lora, threads, seed=1, lr=1e-4):
        torch.manual_seed(seed)
        self.model = UNet2DConditionModel()
        self.model.train()
        self.base_params = sum(p.numel() for p in self.model.parameters())
        if use_lora:
            trainable = attach_lora(self.model, 4, 4)
        else:
            trainable = list(self.model.parameters())
        self.trainable = sum(p.numel() for p in trainable)
        self.opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
        g = torch.Generator().manual_seed(seed)
        self.batch, self.latent = batch, latent
        self.gen = g
        pooled = CONFIG["projection_class_embeddings_input_dim"] - 6 * CONFIG["addition_time_embed_dim"]
        self.pooled = pooled
        self.new_inputs()

    def new_inputs(self):
        b, s, g = self.batch, self.latent, self.gen
        px = float(s * 8)
        abar = torch.cumprod(1 - torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2, 0)
        t = torch.randint(0, 1000, (b,), generator=g)
        self.inputs = dict(
            latents=torch.randn(b, 4, s, s, generator=g),
            noise=torch.randn(b, 4, s, s, generator=g),
            timesteps=t.float(),
            sqrt_alpha_prod=abar[t].sqrt().float().reshape(b, 1, 1, 1),
            sqrt_one_minus_alpha_prod=(1 - abar[t]).sqrt().float().reshape(b, 1, 1, 1),
            loss_weight=torch.ones(b, 1, 1, 1),
            prompt_embeds=0.5 * torch.randn(b, TOKENS, CONFIG["cross_attention_dim"], generator=g),
            pooled_prompt_embeds=0.5 * torch.randn(b, self.pooled, generator=g),
            time_ids=torch.tensor([[px, px, 0, 0, px, px]] * b),
        )

    def loss(self):
        i = self.inputs
        noisy = i["latents"] * i["sqrt_alpha_prod"] + i["noise"] * i["sqrt_one_minus_alpha_prod"]
        pred = self.model(noisy, i["timesteps"], i["prompt_embeds"], i["pooled_prompt_embeds"], i["time_ids"])
        d = pred - i["noise"]
        return (d * d * i["loss_weight"]).mean()

    def step(self):
        """One timed training step; returns (seconds, loss)."""
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss()
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t0, loss.item()

    def held_bytes(self):
        """Bytes of the unique storages autograd keeps for backward (parameters
        and inputs excluded, as ckrun's activation_bytes excludes them)."""
        global _held
        skip = {storage_key(p)[0] for p in self.model.parameters()}
        skip |= {storage_key(v)[0] for v in self.inputs.values()}
        held = {}
        _held = held

        def pack(t):
            # the tensor stays referenced until the count is done, so no address
            # is reused by another storage meanwhile
            k = storage_key(t)
            held[k[0]] = (k[1], t)
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = self.loss()
        finally:
            _held = None
        loss.backward()
        self.opt.zero_grad(set_to_none=True)
        total = sum(v[0] for k, v in held.items() if k not in skip)
        held.clear()
        return total

    def load(self, path):
        """Parameters and inputs from a safetensors file written by bench/vs_pytorch.lua."""
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            blob = f.read()
        tensors = {}
        for k, v in header.items():
            if k == "__metadata__":
                continue
            assert v["dtype"] == "F32", k
            a, b = v["data_offsets"]
            tensors[k] = torch.from_numpy(np.frombuffer(blob[a:b], dtype=np.float32).reshape(v["shape"]).copy())
        with torch.no_grad():
            own = {}
            for name, prm in self.model.named_parameters():
                own[diffusers_name(name)] = prm
            missing = [k for k in own if k not in tensors]
            assert not missing, "not in ckrun's file: %s" % missing[:5]
            for k, prm in own.items():
                prm.copy_(tensors[k].reshape(prm.shape))
        for k in self.inputs:
            self.inputs[k] = tensors["input." + k].reshape(self.inputs[k].shape).clone()


# ---- the ckrun side

class Ck:
    def __init__(self, ckrun, batch, latent, use_lora, policy, threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
        lua = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vs_pytorch.lua")
        self.proc = subprocess.Popen(
            [ckrun, "--trust", lua, "--batch", str(batch), "--latent", str(latent), "--lora",
             "true" if use_lora else "false", "--checkpoint", policy],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise SystemExit("ckrun driver failed: %r" % line)
        self.info = {k: int(v) for k, v in (w.split("=") for w in line.split()[1:])}

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("ckrun driver ended")
        return line.split()

    def step(self):
        w = self.ask("step")
        return float(w[1]), float(w[3])

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait()


def check(ckrun, threads, use_lora, tmp):
    """Same weights and inputs on both sides: the loss before and after one AdamW step."""
    ck = Ck(ckrun, 2, 32, use_lora, "none", threads)
    w = ck.ask("dump " + tmp)
    ck.close()
    run = Run(2, 32, use_lora, threads)
    run.load(tmp)
    os.unlink(tmp)
    _, before = run.step()
    with torch.no_grad():
        after = run.loss().item()
    return float(w[1]), float(w[2]), before, after


def ab(args):
    """Two ckrun builds, steps alternating, on each case and policy: median step times."""
    print("| latents | training | checkpointing | %s ms | %s ms | ratio |" % (args.ab, args.ckrun))
    print("|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        shape, _, kind = case.partition("-")
        latent, batch = (int(v) for v in shape.split("x"))
        use_lora = kind == "lora"
        for pol in ("none", "diffusers"):
            a = Ck(args.ab, batch, latent, use_lora, pol, args.threads)
            b = Ck(args.ckrun, batch, latent, use_lora, pol, args.threads)
            ta, tb = [], []
            for i in range(args.warmup + args.steps):
                x, _ = a.step()
                y, _ = b.step()
                if i >= args.warmup:
                    ta.append(x)
                    tb.append(y)
            a.close()
            b.close()
            ma, mb = statistics.median(ta), statistics.median(tb)
            print("| %dx4x%dx%d | %s | %s | %.1f | %.1f | %.2f |" % (batch, latent, latent,
                  "LoRA rank 4" if use_lora else "full", pol, 1e3 * ma, 1e3 * mb, mb / ma))
            sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckrun", default="build/ckrun")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--cases", default="32x2,32x2-lora,64x1")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--ab", metavar="CKRUN", help="compare this other ckrun build with --ckrun instead")
    args = ap.parse_args()
    if args.ab:
        ab(args)
        return
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    ref = Run(1, 8, False, args.threads)
    ck_info = Ck(args.ckrun, 1, 8, False, "none", args.threads)
    print("parameters: PyTorch %d, ckrun %d (sdxl-tiny: 8011332)" % (ref.base_params, ck_info.info["params"]))
    ck_info.close()
    if ref.base_params != ck_info.info["params"]:
        raise SystemExit("parameter counts differ")
    if args.check:
        for lo in (False, True):
            b0, a0, b1, a1 = check(args.ckrun, args.threads, lo, "/tmp/vs_pytorch_check.safetensors")
            print("same weights and inputs%s: loss ckrun %.6f PyTorch %.6f (rel %.1e); after one AdamW step "
                  "ckrun %.6f PyTorch %.6f (rel %.1e)" % (" (LoRA)" if lo else "", b0, b1, abs(b0 - b1) / abs(b1),
                                                          a0, a1, abs(a0 - a1) / abs(a1)))

    print()
    print("| latents | training | checkpointing | ckrun ms | PyTorch ms | ckrun / PyTorch | ckrun held MiB | "
          "PyTorch held MiB | held ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    notes, exact = [], []
    for case in args.cases.split(","):
        shape, _, kind = case.partition("-")
        latent, batch = (int(v) for v in shape.split("x"))
        use_lora = kind == "lora"
        runs = {}
        for pol in ("none", "diffusers"):
            ck = Ck(args.ckrun, batch, latent, use_lora, pol, args.threads)
            runs[pol] = [ck, [], []]
        pt = Run(batch, latent, use_lora, args.threads)
        held_pt = {}
        for pol in ("none", "diffusers"):
            pt.model.set_checkpointing(pol != "none")
            held_pt[pol] = pt.held_bytes()
        # rounds of ckrun none, PyTorch none, ckrun diffusers, PyTorch diffusers
        for i in range(args.warmup + args.steps):
            for pol in ("none", "diffusers"):
                ck, ct, tt = runs[pol]
                c, _ = ck.step()
                pt.model.set_checkpointing(pol != "none")
                pt.new_inputs()
                t, _ = pt.step()
                if i >= args.warmup:
                    ct.append(c)
                    tt.append(t)
        med = {}
        for pol in ("none", "diffusers"):
            ck, ct, tt = runs[pol]
            c, t = statistics.median(ct), statistics.median(tt)
            med[pol] = (c, t)
            hc, hp = ck.info["activation_bytes"], held_pt[pol]
            print("| %dx%dx%dx%d | %s | %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.4f |" % (
                batch, 4, latent, latent, "LoRA rank 4" if use_lora else "full", pol, 1e3 * c, 1e3 * t, c / t,
                hc / 2 ** 20, hp / 2 ** 20, hc / hp))
            exact.append("%dx4x%dx%d %s %s: ckrun %d, PyTorch %d" % (batch, latent, latent,
                         "LoRA" if use_lora else "full", pol, hc, hp))
            ck.close()
        add_c, add_t = med["diffusers"][0] - med["none"][0], med["diffusers"][1] - med["none"][1]
        notes.append("%dx4x%dx%d %s: checkpointing adds %.1f ms (%+.0f%%) to ckrun, %.1f ms (%+.0f%%) to PyTorch; "
                     "ratio %.2f" % (batch, latent, latent, "LoRA" if use_lora else "full", 1e3 * add_c,
                                     100 * add_c / med["none"][0], 1e3 * add_t, 100 * add_t / med["none"][1],
                                     add_c / add_t if add_t > 0 else float("nan")))
        sys.stdout.flush()
    print()
    for n in notes:
        print("- " + n)
    print("\nbytes held for backward, exactly:")
    for e in exact:
        print("- " + e)


if __name__ == "__main__":
    main()
