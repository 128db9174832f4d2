"""The PyTorch side of the training-step comparison in bench/gpu_check.sh, and
its table.

Runs the cases bench/gpu_step.lua ran (read from its JSON lines) in plain
PyTorch: the UNet of bench/vs_pytorch.py (diffusers' module tree and names,
no diffusers needed) with the config of the case, rank-r LoRA on to_q, to_k,
to_v and to_out.0 of a frozen base (as ckrun's lora.attach), the epsilon
objective (MSE against the noise), backward and torch.optim.AdamW; policy none
and diffusers' gradient checkpointing (torch.utils.checkpoint, use_reentrant=
False, around every ResnetBlock2D and every BasicTransformerBlock, as ckrun's
policy.diffusers()). ckrun's budget policy has no PyTorch counterpart and is
skipped. fp32 with TF32 off and cuDNN deterministic (ckrun's defaults);
attention through F.scaled_dot_product_attention as diffusers' AttnProcessor2_0
(--attention matmul: vs_pytorch.py's explicit softmax(QK^T)V). One JSON line
per (case, policy) on stdout, progress on stderr.

  python3 bench/gpu_step_torch.py out/gpu_check/steps_ckrun.jsonl > out/gpu_check/steps_torch.jsonl
  python3 bench/gpu_step_torch.py --case tiny:16 --device cpu --steps 1     no ckrun file, on the CPU
  python3 bench/gpu_step_torch.py --table out/gpu_check/steps_ckrun.jsonl out/gpu_check/steps_torch.jsonl
  python3 bench/gpu_step_torch.py --results bench/results/gpu_check.json FILES...   the JSON of ckrun/PyTorch pairs

Mixed precision (a case's "precision", ckrun's --mixed-precision): bf16 or fp16
run the forward and the loss under torch.autocast with that dtype, SDPA taking
the flash kernels, as kohya's --mixed_precision does: for LoRA the frozen base is
cast to the dtype (kohya's weight_dtype) and the adapters stay fp32; fp16 scales
the loss with torch.amp.GradScaler. Mixed-precision cases allow TF32 (autocast
runs products in 16 bits anyway). A case's optimizer adamw8bit is
bitsandbytes' AdamW8bit when bitsandbytes imports, else torch.optim.AdamW with
fused=True (the row's optimizer field says which). --compile wraps the model in
torch.compile (impl "pytorch-compile"); gpu_check.sh runs it under a time limit.

--table needs no torch: it prints the markdown table of ckrun's lines and
PyTorch's (when given) with the notes under it.

Step time: the median of the timed steps after the untimed ones (the first of
which creates AdamW's state; by default as many of each as ckrun ran), wall
clock from a torch.cuda.synchronize() to loss.item() (ckrun's p:step() likewise
returns once the device has the loss); fresh inputs each step, made outside the
timed region. Memory: torch.cuda.max_memory_allocated
over the timed steps after reset_peak_memory_stats (parameters, AdamW state,
gradients, activations: what ckrun's planned peak counts), max_memory_reserved,
and free device memory (torch.cuda.mem_get_info) before the model was built
minus after the steps, with the allocator's cache emptied before each policy.
"""
import argparse
import json
import os
import statistics
import sys
import time
import types

SDXL = dict(  # diffusers' config keys, as stdlib/ck/unet.lua's "sdxl"
    in_channels=4, out_channels=4, block_out_channels=(320, 640, 1280), layers_per_block=2,
    transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
    norm_num_groups=32, norm_eps=1e-5, addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
)
TORCH_POLICIES = ("none", "diffusers")  # those with a PyTorch counterpart
GiB, MiB = 2 ** 30, 2 ** 20


def log(msg):
    print("gpu_step_torch: " + msg, file=sys.stderr, flush=True)


# ---- the model: bench/vs_pytorch.py's

def load_vs_pytorch(attention):
    """Imports bench/vs_pytorch.py, with SDPA as its attention when asked; returns (module, note)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import torch.nn.functional as F
    try:
        import numpy  # noqa: F401  (vs_pytorch.py uses it only to load ckrun's files)
        import vs_pytorch as vp
    except ImportError:
        # a stand-in only while vs_pytorch.py loads: torch must not see it later
        sys.modules["numpy"] = types.ModuleType("numpy")
        try:
            import vs_pytorch as vp
        finally:
            del sys.modules["numpy"]

    note = "explicit softmax(QK^T)V (vs_pytorch.py)"
    if attention == "sdpa":
        if hasattr(F, "scaled_dot_product_attention"):
            vp.Attention.attend = staticmethod(F.scaled_dot_product_attention)
            note = "F.scaled_dot_product_attention (diffusers' AttnProcessor2_0)"
        else:
            note += ": this torch has no F.scaled_dot_product_attention"
    return vp, note


def config_of(vp, model):
    if model == "sdxl":
        return SDXL
    if model == "sdxl-tiny":
        return vp.CONFIG
    raise SystemExit("unknown model '%s' (sdxl, sdxl-tiny)" % model)


def build(vp, case, dev):
    """The model (LoRA attached when the case has it) on dev; returns (model, trainable, params, base_params)."""
    import torch
    torch.manual_seed(1)

    def make():
        model = vp.UNet2DConditionModel(config_of(vp, case["model"]))
        base = sum(p.numel() for p in model.parameters())
        if case["lora"]:
            trainable = vp.attach_lora(model, case["rank"], case["rank"])
        else:
            trainable = list(model.parameters())
        return model, trainable, base

    if hasattr(torch.device, "__enter__"):
        with dev:  # parameters made and initialized on the device (torch >= 2.0)
            model, trainable, base = make()
    else:
        model, trainable, base = make()
        model.to(dev)
    model.train()
    return model, trainable, sum(p.numel() for p in model.parameters()), base


class Inputs:
    """Fresh inputs for each step, as ckrun's: latents, noise, timesteps, schedule coefficients, conditioning."""

    def __init__(self, vp, case, dev, seed=1):
        import torch
        self.torch, self.dev = torch, dev
        cfg = config_of(vp, case["model"])
        self.b, self.s = case["batch"], case["latent"]
        self.cross = cfg["cross_attention_dim"]
        self.pooled = cfg["projection_class_embeddings_input_dim"] - 6 * cfg["addition_time_embed_dim"]
        self.gen = torch.Generator().manual_seed(seed)
        self.abar = torch.cumprod(1 - torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2, 0)

    def next(self):
        torch, b, s, g = self.torch, self.b, self.s, self.gen
        px = float(s * 8)
        t = torch.randint(0, 1000, (b,), generator=g)
        cpu = dict(
            latents=torch.randn(b, 4, s, s, generator=g),
            noise=torch.randn(b, 4, s, s, generator=g),
            timesteps=t.float(),
            sa=self.abar[t].sqrt().float().reshape(b, 1, 1, 1),
            sb=(1 - self.abar[t]).sqrt().float().reshape(b, 1, 1, 1),
            weight=torch.ones(b, 1, 1, 1),
            prompt_embeds=0.5 * torch.randn(b, 77, self.cross, generator=g),
            pooled=0.5 * torch.randn(b, self.pooled, generator=g),
            time_ids=torch.tensor([[px, px, 0, 0, px, px]] * b),
        )
        return {k: v.to(self.dev) for k, v in cpu.items()}


def train_step(model, opt, i):
    opt.zero_grad(set_to_none=True)
    noisy = i["latents"] * i["sa"] + i["noise"] * i["sb"]
    pred = model(noisy, i["timesteps"], i["prompt_embeds"], i["pooled"], i["time_ids"])
    d = pred - i["noise"]
    loss = (d * d * i["weight"]).mean()
    loss.backward()
    opt.step()
    return loss.item()  # waits for the device, as ckrun's p:step() does


def make_optimizer(case, trainable):
    """The case's optimizer and its name: AdamW, or 8-bit AdamW (bitsandbytes, else fused AdamW)."""
    import torch
    kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    if case.get("optimizer") == "adamw8bit":
        try:
            import bitsandbytes as bnb
            return bnb.optim.AdamW8bit(trainable, **kw), "bitsandbytes AdamW8bit " + bnb.__version__
        except Exception:  # not installed, or no build for this GPU
            return torch.optim.AdamW(trainable, fused=True, **kw), "torch AdamW fused (no bitsandbytes)"
    if case.get("fused_backward"):
        return torch.optim.AdamW(trainable, fused=True, **kw), "torch AdamW fused"
    return torch.optim.AdamW(trainable, **kw), "torch AdamW"


def mixed_step(model, opt, i, dtype, scaler):
    """train_step under autocast (and GradScaler for fp16)."""
    import torch
    opt.zero_grad(set_to_none=True)
    with torch.autocast(i["latents"].device.type, dtype=dtype):
        noisy = i["latents"] * i["sa"] + i["noise"] * i["sb"]
        pred = model(noisy, i["timesteps"], i["prompt_embeds"], i["pooled"], i["time_ids"])
    d = pred.float() - i["noise"]
    loss = (d * d * i["weight"]).mean()
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    return loss.item()


def run_case(vp, case, policies, warmup, steps, attention_note, device, compile_model=False):
    import torch
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    rows = []
    precision = case.get("precision") or "no"
    base_row = dict(impl="pytorch-compile" if compile_model else "pytorch", case=case["case"], model=case["model"],
                    lora=case["lora"], rank=case["rank"] if case["lora"] else None, batch=case["batch"],
                    latent=case["latent"], pixels=8 * case["latent"], device=str(dev), torch=torch.__version__,
                    attention=attention_note, warmup=warmup, steps=steps, precision=precision,
                    fused_backward=bool(case.get("fused_backward")))
    if cuda:
        torch.cuda.empty_cache()
        free0, total = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    try:
        model, trainable, params, base = build(vp, case, dev)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if dtype is not None and case["lora"]:  # kohya: the frozen base in weight_dtype, the adapters fp32
            keep = {id(p) for p in trainable}
            for p in model.parameters():
                if id(p) not in keep:
                    p.data = p.data.to(dtype)
        opt, opt_name = make_optimizer(case, trainable)
        base_row["optimizer"] = opt_name
        scaler = torch.amp.GradScaler(dev.type) if precision == "fp16" else None
        if dtype is not None:
            step_fn = lambda m, o, i: mixed_step(m, o, i, dtype, scaler)  # noqa: E731
        else:
            step_fn = train_step
        if compile_model:
            model = torch.compile(model)
    except (RuntimeError, MemoryError) as e:
        msg = "building the model: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__)
        log("%s %dx%d latents: FAILED: %s" % (case["model"], case["latent"], case["latent"], msg))
        for pol in policies:
            rows.append(dict(base_row, policy=pol, error=msg))
            print(json.dumps(rows[-1]), flush=True)
        return rows
    build_s = time.perf_counter() - t0
    n_trainable = sum(p.numel() for p in trainable)
    log("%s %dx%d latents: %d parameters (%d trainable), built in %.1f s" % (
        case["model"], case["latent"], case["latent"], params, n_trainable, build_s))
    inputs = Inputs(vp, case, dev)
    for pol in policies:
        row = dict(base_row, policy=pol, params=params, base_params=base, trainable=n_trainable,
                   build_s=round(build_s, 3))
        model.set_checkpointing(pol != "none")
        try:
            if cuda:
                torch.cuda.empty_cache()
            losses = []
            for _ in range(warmup):
                losses.append(step_fn(model, opt, inputs.next()))
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(steps):
                i = inputs.next()
                if cuda:
                    torch.cuda.synchronize()
                s0 = time.perf_counter()
                losses.append(step_fn(model, opt, i))
                times.append(1e3 * (time.perf_counter() - s0))
            row.update(step_ms=statistics.median(times), step_ms_all=times, losses=losses)
            if cuda:
                free1, _ = torch.cuda.mem_get_info()
                row.update(peak_allocated=torch.cuda.max_memory_allocated(),
                           peak_reserved=torch.cuda.max_memory_reserved(),
                           cuda_free_before=free0, cuda_free_after=free1, cuda_total=total, cuda_used=free0 - free1)
            log("%s: step %.2f ms (median of %d)%s" % (pol, row["step_ms"], steps,
                ", peak allocated %.1f MiB" % (row["peak_allocated"] / MiB) if cuda else ""))
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            row["error"] = msg
            log("%s: FAILED: %s" % (pol, msg))
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    del model, opt, trainable, inputs
    if cuda:
        torch.cuda.empty_cache()
    return rows


def read_lines(paths):
    out = []
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    log("%s:%d: not JSON, skipped: %s" % (p, n, line[:80]))
    return out


def case_key(r):
    """What makes two lines the same case on both sides (the optimizer is ckrun's name on ckrun's lines)."""
    return (r["case"], r["latent"], r["batch"], bool(r.get("lora")), r.get("rank") if r.get("lora") else None,
            r.get("precision", "no"), bool(r.get("fused_backward")))


def cases_from(lines):
    """The cases of ckrun's lines, in order, with the policies each ran."""
    cases = {}
    for r in lines:
        if r.get("impl") != "ckrun" or "case" not in r or "latent" not in r:
            continue
        key = case_key(r)
        c = cases.setdefault(key, dict(case=r["case"], model=r["model"], lora=r["lora"], rank=r.get("rank") or 4,
                                       batch=r["batch"], latent=r["latent"], precision=r.get("precision", "no"),
                                       optimizer=r.get("optimizer", "adamw"),
                                       fused_backward=bool(r.get("fused_backward")), policies=[]))
        # ckrun's untimed steps: the measured one and its warm-up
        if "warmup" in r:
            c["warmup"] = r["warmup"] + 1
        if "steps" in r:
            c["steps"] = r["steps"]
        pols = r.get("policies") or ([r["policy"]] if "policy" in r else [])
        for p in pols:
            if p not in c["policies"]:
                c["policies"].append(p)
    return list(cases.values())


def parse_case(s, lora, rank):
    """'tiny:64' or 'full:128:1' -> a case."""
    parts = s.split(":")
    if parts[0] not in ("tiny", "full") or len(parts) not in (2, 3):
        raise SystemExit("--case must be tiny|full:LATENT[:BATCH], got '%s'" % s)
    return dict(case=parts[0], model="sdxl" if parts[0] == "full" else "sdxl-tiny", lora=lora, rank=rank,
                batch=int(parts[2]) if len(parts) == 3 else 1, latent=int(parts[1]), policies=list(TORCH_POLICIES))


# ---- the table (no torch needed)

def fmt_bytes(b):
    if b is None:
        return "-"
    if b >= 10 * GiB:
        return "%.2f GiB" % (b / GiB)
    if b >= MiB:
        return "%.1f MiB" % (b / MiB)
    return "%.1f KiB" % (b / 1024)


def case_label(r):
    lo = "LoRA r%d" % r["rank"] if r.get("lora") else "full FT"
    extra = "" if r.get("precision", "no") == "no" else " " + r["precision"]
    if r.get("fused_backward"):
        extra += " fused"
    return "%s %dx%d (%d px) b%d %s%s" % (r["model"], r["latent"], r["latent"], 8 * r["latent"], r["batch"], lo, extra)


def table(lines):
    ck = [r for r in lines if r.get("impl") == "ckrun" and "policy" in r]
    pt = {case_key(r) + (r["policy"],): r for r in lines if r.get("impl") == "pytorch"}
    have_pt = bool(pt)
    print("| case | policy | ckrun ms | PyTorch ms | ckrun / PyTorch | ckrun recompute FLOPs | ckrun planned peak | "
          "ckrun arena high-water | ckrun predicted device (pages + fixed) | ckrun cudaMemGetInfo (used + fixed) | "
          "PyTorch peak allocated | PyTorch cudaMemGetInfo (used) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes, seen, cases = [], set(), {}

    def pt_ms(p):
        if p is None:
            return "-" if have_pt else "(no torch)"
        return "%.2f" % p["step_ms"] if p.get("step_ms") is not None else "FAILED"

    def pt_mem(p):
        return (fmt_bytes(p.get("peak_allocated")), fmt_bytes(p.get("cuda_used"))) if p else ("-", "-")

    for r in ck:
        key = case_key(r) + (r["policy"],)
        seen.add(key)
        p = pt.get(key)
        cases.setdefault(key[:-1], [r, None])
        if p:
            cases[key[:-1]][1] = p
        label = case_label(r)
        if r.get("fallback"):
            notes.append("%s: %s" % (label, r["fallback"]))
        if r.get("error"):
            notes.append("ckrun %s %s: FAILED: %s" % (label, r["policy"], r["error"]))
        if p and p.get("error"):
            notes.append("PyTorch %s %s: FAILED: %s" % (label, r["policy"], p["error"]))
        if r.get("same_losses_as_none") is False:
            notes.append("ckrun %s %s: the losses are not none's bit for bit at the same steps" % (label, r["policy"]))
        pred, meas = r.get("predicted_total"), r.get("measured_total")
        meas_cell = fmt_bytes(meas)
        if meas is not None and pred:
            meas_cell += " (%+.2f%%)" % (100.0 * (meas - pred) / pred)
            if abs(meas - pred) > pred // 100:
                notes.append("ckrun %s %s: the device memory measured, %s, is not within 1%% of the predicted %s "
                             "(%+.1f MiB)" % (label, r["policy"], fmt_bytes(meas), fmt_bytes(pred),
                                              (meas - pred) / MiB))
        cms, pms = r.get("step_ms"), p.get("step_ms") if p else None
        hw = r.get("measured_peak")
        hw_cell = fmt_bytes(hw)
        if hw is not None:
            hw_cell += " (= plan)" if r.get("peak_match") else " (DIFFERS)"
        share = r.get("recompute_share")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % ((
            label, r["policy"],
            "%.2f" % cms if cms is not None else ("FAILED" if r.get("error") else "-"),
            pt_ms(p), "%.2f" % (cms / pms) if cms and pms else "-",
            "%.1f%%" % (100 * share) if share is not None else "-",
            fmt_bytes(r.get("plan_peak")), hw_cell, fmt_bytes(r.get("predicted_total")), meas_cell) + pt_mem(p)))
    for key, p in pt.items():  # PyTorch rows ckrun has none for
        if key not in seen:
            cases.setdefault(key[:-1], [None, p])
            print("| %s | %s | - | %s | - | - | - | - | - | - | %s | %s |" % ((case_label(p), p["policy"], pt_ms(p))
                                                                          + pt_mem(p)))
            if p.get("error"):
                notes.append("PyTorch %s %s: FAILED: %s" % (case_label(p), p["policy"], p["error"]))
    print()
    some = next(iter(pt.values()), None)
    if some:
        print("- PyTorch %s; fp32 cases: TF32 off, cuDNN deterministic; bf16/fp16 cases: torch.autocast, TF32 on, "
              "a LoRA's frozen base in the dtype, GradScaler for fp16; attention: %s; optimizer: %s; "
              "torch.utils.checkpoint (use_reentrant=False) for diffusers." % (
                  some["torch"], some["attention"], some.get("optimizer", "torch.optim.AdamW")))
    for c, p in cases.values():
        r = c or p
        steps = []
        if c:
            steps.append("ckrun %s timed after %s untimed (one measuring the arena)" % (
                c.get("steps", "?"), c["warmup"] + 1 if "warmup" in c else "?"))
        if p:
            steps.append("PyTorch %s timed after %s untimed" % (p.get("steps", "?"), p.get("warmup", "?")))
        print("- %s: step time is the median; %s; %s." % (case_label(r), "; ".join(steps),
              "%s parameters, %s trainable" % (r.get("params", "?"), r.get("trainable", "?"))))
    print("- ckrun planned peak: the plan's arena high-water mark (parameters, AdamW state, gradients, activations, "
          "workspace); arena high-water: measured by a sentinel fill during a step; predicted device: the arena "
          "(the planned peak) in the CUDA driver's 2 MiB pages + the backend's fixed bytes (cuBLAS workspace and "
          "scratch, allocated when the device opens); cudaMemGetInfo: free device memory before the compile minus "
          "after the steps, plus the fixed bytes, and its difference from the prediction. "
          "PyTorch peak allocated: torch.cuda.max_memory_allocated over the timed steps; its cudaMemGetInfo: free "
          "memory before the model was built minus after the steps (the allocator's cache included). Device "
          "figures leave out the CUDA context on both sides. budget has no PyTorch counterpart.")
    for p in pt.values():
        c = next((r for r in ck if case_key(r) == case_key(p) and r.get("params")), None)
        if c and p.get("params") and c["params"] != p["params"]:
            notes.append("parameter counts differ for %s: ckrun %d, PyTorch %d" % (
                case_label(p), c["params"], p["params"]))
    for n in dict.fromkeys(notes):
        print("- " + n)


def results(lines, path):
    """The JSON of ckrun/PyTorch pairs, one row per ckrun line: bench/results/gpu_check.json. The peaks are the
    device memory each side took: ckrun's predicted device bytes (the arena in pages + fixed; measured within 1%
    of it by cudaMemGetInfo, the row says by how much), PyTorch's torch.cuda.max_memory_reserved (what its
    allocator took from the device)."""
    import datetime
    pt = {}
    for r in lines:
        if r.get("impl") in ("pytorch", "pytorch-compile"):
            pt[(r["impl"],) + case_key(r) + (r["policy"],)] = r
    rows = []
    for r in lines:
        if r.get("impl") != "ckrun" or "policy" not in r:
            continue
        key = case_key(r) + (r["policy"],)
        p, pc = pt.get(("pytorch",) + key), pt.get(("pytorch-compile",) + key)
        ck_ms, t_ms = r.get("step_ms"), p.get("step_ms") if p else None
        row = dict(case=case_label(r), policy=r["policy"], precision=r.get("precision", "no"),
                   batch=r["batch"], optimizer=r.get("optimizer"), torch_optimizer=p.get("optimizer") if p else None,
                   ckrun_ms=ck_ms, torch_ms=t_ms, torch_compile_ms=pc.get("step_ms") if pc else None,
                   ckrun_images_per_s=1e3 * r["batch"] / ck_ms if ck_ms else None,
                   torch_images_per_s=1e3 * r["batch"] / t_ms if t_ms else None,
                   ratio=ck_ms / t_ms if ck_ms and t_ms else None,
                   ckrun_planned_bytes=r.get("predicted_total"), ckrun_peak_bytes=r.get("measured_total"),
                   torch_peak_bytes=p.get("peak_reserved") if p else None,
                   torch_allocated_bytes=p.get("peak_allocated") if p else None,
                   error=r.get("error") or (p.get("error") if p else None),
                   date=datetime.date.today().isoformat(), device=os.environ.get("CK_GPU_NAME") or r.get("device"))
        row["goal_met"] = (row["ratio"] is not None and row["ratio"] <= 0.8 and row["ckrun_peak_bytes"] is not None
                           and row["torch_peak_bytes"] is not None
                           and row["ckrun_peak_bytes"] <= row["torch_peak_bytes"])
        rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"rows": rows}, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    for row in rows:
        print("%-55s %-10s ckrun %8s ms  torch %8s ms  ratio %5s  goal %s" % (
            row["case"], row["policy"], "%.1f" % row["ckrun_ms"] if row["ckrun_ms"] else "-",
            "%.1f" % row["torch_ms"] if row["torch_ms"] else "-", "%.2f" % row["ratio"] if row["ratio"] else "-",
            "met" if row["goal_met"] else "NOT met"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="bench/gpu_step.lua's JSON lines (and, with --table, this script's)")
    ap.add_argument("--table", action="store_true", help="print the table of the files' lines; needs no torch")
    ap.add_argument("--case", action="append", default=[], help="tiny|full:LATENT[:BATCH], instead of the files' cases")
    ap.add_argument("--lora", choices=("true", "false"), default="true", help="with --case (default true)")
    ap.add_argument("--rank", type=int, default=4, help="with --case (default 4)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default: ckrun's, its measured step "
                    "included; 2 with --case)")
    ap.add_argument("--steps", type=int, help="timed steps (default: ckrun's; 5 with --case)")
    ap.add_argument("--attention", choices=("sdpa", "matmul"), default="sdpa")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads on the CPU (0: torch's default)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (rows: impl pytorch-compile)")
    ap.add_argument("--policy", action="append", default=[], help="run only these policies of the files' cases")
    ap.add_argument("--results", metavar="JSON", help="write the ckrun/PyTorch pairs of the files' lines; needs no "
                    "torch")
    args = ap.parse_args()
    if (args.warmup is not None and args.warmup < 1) or (args.steps is not None and args.steps < 1):
        raise SystemExit("--warmup and --steps must be at least 1")
    lines = read_lines(args.files)
    if args.table:
        table(lines)
        return
    if args.results:
        results(lines, args.results)
        return

    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_step_torch.py: torch sees no CUDA device")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    vp, note = load_vs_pytorch(args.attention)
    if args.case:
        cases = [parse_case(s, args.lora == "true", args.rank) for s in args.case]
    else:
        cases = cases_from(lines)
    if not cases:
        raise SystemExit("gpu_step_torch.py: no cases (give bench/gpu_step.lua's JSON lines or --case)")
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    log("PyTorch %s on %s, fp32, TF32 off, cuDNN deterministic, attention: %s" % (torch.__version__, where, note))
    for case in cases:
        pols = [p for p in case["policies"] if p in TORCH_POLICIES and (not args.policy or p in args.policy)]
        skipped = [p for p in case["policies"] if p not in TORCH_POLICIES]
        if skipped:
            log("%s: no PyTorch counterpart for %s" % (case["case"], ", ".join(skipped)))
        if pols:
            warmup = args.warmup or case.get("warmup") or 2
            steps = args.steps or case.get("steps") or 5
            # autocast runs products in 16 bits: TF32 for what stays fp32, as PyTorch users of mixed precision do
            mixed = case.get("precision", "no") != "no"
            torch.backends.cuda.matmul.allow_tf32 = mixed
            torch.backends.cudnn.allow_tf32 = mixed
            run_case(vp, case, pols, max(warmup, 1), steps, note, args.device, args.compile)


if __name__ == "__main__":
    main()
