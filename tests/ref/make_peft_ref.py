"""Reference data for ckrun's PEFT adapter files (tests/lua/test_lora_peft.lua).

Run with the reference venv from the repository root:
    /work/venv-ref/bin/python tests/ref/make_peft_ref.py

For a tiny SDXL UNet (sdxl-tiny, random seeded weights) and two adapters, r=4
with lora_alpha=8 on to_q, to_k, to_v, to_out.0 ("default"), and the same plus
kohya-style LoCon modules at conv rank 2 / conv alpha 1 ("locon", which needs
rank_pattern and alpha_pattern), this script

  1. saves the adapter with diffusers' own save_lora_weights (metadata
     included) and with peft's own save_pretrained;
  2. writes the files ckrun writes, by the rules stdlib/ck/lora.lua follows
     (OUT with unet.* keys and lora_adapter_metadata, adapter_config.json and
     adapter_model.safetensors beside it);
  3. loads each through diffusers' StableDiffusionXLPipeline.load_lora_weights
     (and the folder through peft's PeftModel.from_pretrained) and checks that
     every output equals the adapter's own output at scaling alpha/r, and that
     the same file without lora_adapter_metadata (what ckrun wrote before)
     loads at scaling 1.0 and gives another output;
  4. writes tests/data/peft/<case>.json (key names and shapes, dtypes, the
     metadata JSON, adapter_config fields, the outputs) and VERSIONS.txt.

Nothing here runs in ctest; the Lua test compares ckrun's files with these.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import save_file, load_file
import diffusers
import peft
from diffusers import UNet2DConditionModel, StableDiffusionXLPipeline
from diffusers.models.resnet import ResnetBlock2D
from diffusers.models.downsampling import Downsample2D
from diffusers.models.upsampling import Upsample2D
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict

OUT_DIR = os.path.join("tests", "data", "peft")

# sdxl-tiny (shared/reference/sdxl.md)
CONFIG = dict(
    sample_size=32, in_channels=4, out_channels=4, block_out_channels=(32, 64, 128), layers_per_block=2,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn", transformer_layers_per_block=(1, 1, 2),
    attention_head_dim=(1, 2, 4), cross_attention_dim=64, use_linear_projection=True,
    addition_embed_type="text_time", addition_time_embed_dim=32, projection_class_embeddings_input_dim=256,
    norm_num_groups=32, norm_eps=1e-5)

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
RANK, ALPHA = 4, 8
CONV_RANK, CONV_ALPHA = 2, 1


def base_unet():
    torch.manual_seed(0)
    return UNet2DConditionModel(**CONFIG).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    return dict(sample=torch.randn(1, 4, 16, 16, generator=g), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, 77, 64, generator=g),
                added_cond_kwargs={"text_embeds": torch.randn(1, 64, generator=g),
                                   "time_ids": torch.tensor([[128.0, 128.0, 0.0, 0.0, 128.0, 128.0]])})


@torch.no_grad()
def run(unet):
    return unet(**inputs()).sample.flatten()


def adapted_modules(unet, locon):
    """ckrun's lora.attach: every Linear whose path ends in a target; with conv_rank, every
    Conv2d and Linear directly inside a ResnetBlock2D, Downsample2D or Upsample2D, 3x3
    convolutions at conv_rank/conv_alpha and the rest at rank/alpha. Returns
    [(path, rank, alpha)] in tree order, and the paths the targets name."""
    blocks = set()
    if locon:
        blocks = {n for n, m in unet.named_modules() if isinstance(m, (ResnetBlock2D, Downsample2D, Upsample2D))}
    out, by_target = [], set()
    for name, m in unet.named_modules():
        if name == "":
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        named = any(name == t or name.endswith("." + t) for t in TARGETS)
        if named:
            by_target.add(name)
        if parent in blocks and isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
            conv3 = isinstance(m, torch.nn.Conv2d) and m.kernel_size[0] > 1
            out.append((name, CONV_RANK, CONV_ALPHA) if conv3 else (name, RANK, ALPHA))
        elif named and isinstance(m, torch.nn.Linear):
            out.append((name, RANK, ALPHA))
    return out, by_target


def ckrun_fields(adapters, by_target):
    """The LoraConfig fields ckrun writes (stdlib/ck/lora.lua, peft_config): the targets
    themselves when every module they name is adapted, else every adapted path; the
    paths adapted besides the targets' (LoCon); rank_pattern and alpha_pattern for the
    modules whose rank or alpha differ from r and lora_alpha."""
    paths = [a[0] for a in adapters]
    exact = by_target <= set(paths)
    targets = list(TARGETS) if exact else []
    targets += [p for p in paths if not (exact and p in by_target)]
    return {
        "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": targets,
        "rank_pattern": {p: r for p, r, _ in adapters if r != RANK},
        "alpha_pattern": {p: a for p, _, a in adapters if a != ALPHA},
        "bias": "none", "fan_in_fan_out": False, "lora_bias": False, "use_dora": False, "use_rslora": False,
    }


def lora_config(fields):
    kw = {k: v for k, v in fields.items() if k != "peft_type"}
    return LoraConfig(init_lora_weights="gaussian", **kw)


def set_adapter_weights(unet, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in unet.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def file_layout(path):
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        keys = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = sorted({f.get_slice(k).get_dtype() for k in f.keys()})
    return keys, dtypes, meta


def load_with_pipeline(path):
    unet = base_unet()
    pipe = StableDiffusionXLPipeline(vae=None, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                     tokenizer_2=None, unet=unet, scheduler=None)
    pipe.load_lora_weights(path)
    cfg = next(iter(unet.peft_config.values()))
    return run(unet), cfg


def close(a, b, rel=1e-5):
    return float((a - b).abs().max()) <= rel * max(1.0, float(b.abs().max()))


def rounded(t):
    return [float("%.7g" % v) for v in t.tolist()]


def make(case, locon, work):
    base_out = run(base_unet())
    unet = base_unet()
    adapters, by_target = adapted_modules(unet, locon)
    fields = ckrun_fields(adapters, by_target)
    unet.add_adapter(lora_config(fields))
    set_adapter_weights(unet, 7)
    adapter_out = run(unet)
    assert not close(adapter_out, base_out), "the adapter must change the output"
    peft_sd = get_peft_model_state_dict(unet)  # NAME.lora_A.weight / NAME.lora_B.weight
    # the adapter's own scaling is alpha/r per module
    scalings = {n: m.scaling["default"] for n, m in unet.named_modules() if hasattr(m, "scaling")}
    for p, r, a in adapters:
        assert abs(scalings[p] - a / r) < 1e-12, (p, scalings[p], a / r)

    # 1. diffusers' own file and peft's own folder
    ddir = os.path.join(work, case, "diffusers")
    StableDiffusionXLPipeline.save_lora_weights(
        ddir, unet_lora_layers=peft_sd, unet_lora_adapter_metadata=unet.peft_config["default"].to_dict(),
        weight_name="diffusers.safetensors")
    dfile = os.path.join(ddir, "diffusers.safetensors")
    pdir = os.path.join(work, case, "peft")
    pm = get_peft_model(base_unet(), lora_config(fields))
    pm.save_pretrained(pdir)
    with open(os.path.join(pdir, "adapter_config.json")) as f:
        peft_config_json = json.load(f)
    peft_keys, peft_dtypes, _ = file_layout(os.path.join(pdir, "adapter_model.safetensors"))

    # 2. the files ckrun writes: OUT, and beside it adapter_config.json and adapter_model.safetensors
    cdir = os.path.join(work, case, "ckrun")
    os.makedirs(cdir)
    cfile = os.path.join(cdir, "lora.safetensors")
    tensors = {"unet." + k: v.contiguous() for k, v in peft_sd.items()}
    ck_meta = json.dumps({"unet." + k: v for k, v in fields.items()}, indent=2, sort_keys=True)
    save_file(tensors, cfile, metadata={"format": "pt", "lora_adapter_metadata": ck_meta})
    save_file({"base_model.model." + k: v.contiguous() for k, v in peft_sd.items()},
              os.path.join(cdir, "adapter_model.safetensors"), metadata={"format": "pt"})
    ck_config = dict(fields, inference_mode=True)
    with open(os.path.join(cdir, "adapter_config.json"), "w") as f:
        json.dump(ck_config, f, indent=2, sort_keys=True)
    # what ckrun wrote before: no lora_adapter_metadata, only its own strings
    ofile = os.path.join(cdir, "old.safetensors")
    save_file(tensors, ofile, metadata={"format": "pt", "lora_rank": str(RANK), "lora_alpha": str(ALPHA)})

    # 3. load everything back
    d_out, d_cfg = load_with_pipeline(dfile)
    c_out, c_cfg = load_with_pipeline(cfile)
    o_out, o_cfg = load_with_pipeline(ofile)
    p_model = PeftModel.from_pretrained(base_unet(), cdir)
    p_out = run(p_model)
    assert close(d_out, adapter_out), "diffusers' own file gives the adapter's output"
    assert close(c_out, adapter_out), "ckrun's layout gives the adapter's output through load_lora_weights"
    assert close(p_out, adapter_out), "ckrun's folder gives the adapter's output through PeftModel.from_pretrained"
    assert c_cfg.lora_alpha == ALPHA and c_cfg.r == RANK
    assert not close(o_out, adapter_out, 1e-3), "without the metadata diffusers loads at scaling 1.0"
    if not locon:
        assert o_cfg.lora_alpha == o_cfg.r, "without the metadata lora_alpha is taken to be r"
    for n, m in p_model.named_modules():
        if hasattr(m, "scaling") and n.startswith("base_model.model."):
            p = n[len("base_model.model."):]
            want = [a / r for q, r, a in adapters if q == p]
            assert want and abs(m.scaling["default"] - want[0]) < 1e-12, (p, m.scaling, want)

    d_keys, d_dtypes, d_meta = file_layout(dfile)
    c_keys, _, c_meta = file_layout(cfile)
    assert d_keys == c_keys, "ckrun's layout has diffusers' keys and shapes"
    # peft keeps target_modules as a set: recorded sorted, so that the data is the same run to run
    d_fields = json.loads(d_meta["lora_adapter_metadata"])
    d_fields["unet.target_modules"] = sorted(d_fields["unet.target_modules"])
    peft_config_json["target_modules"] = sorted(peft_config_json["target_modules"])
    return {
        "case": case,
        "rank": RANK, "alpha": ALPHA,
        "conv_rank": CONV_RANK if locon else None, "conv_alpha": CONV_ALPHA if locon else None,
        "targets": TARGETS,
        "adapted": [{"path": p, "rank": r, "alpha": a} for p, r, a in adapters],
        "diffusers_file": {"keys": d_keys, "dtypes": d_dtypes, "format": d_meta.get("format"),
                           "lora_adapter_metadata": d_fields},
        "ckrun_file": {"lora_adapter_metadata": json.loads(c_meta["lora_adapter_metadata"])},
        "peft_folder": {"adapter_model_keys": peft_keys, "dtypes": peft_dtypes, "adapter_config": peft_config_json},
        "ckrun_adapter_config": ck_config,
        "outputs": {
            "shape": [1, 4, 16, 16],
            "base": rounded(base_out),
            "adapter_in_memory": rounded(adapter_out),
            "diffusers_file_load_lora_weights": rounded(d_out),
            "ckrun_file_load_lora_weights": rounded(c_out),
            "ckrun_folder_peft_from_pretrained": rounded(p_out),
            "ckrun_file_without_metadata": rounded(o_out),
        },
    }


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix="peft_ref.")
    try:
        for case, locon in (("default", False), ("locon", True)):
            data = make(case, locon, work)
            with open(os.path.join(OUT_DIR, case + ".json"), "w") as f:
                json.dump(data, f, sort_keys=True, separators=(",", ":"))
                f.write("\n")
    finally:
        shutil.rmtree(work)
    with open(os.path.join(OUT_DIR, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_peft_ref.py\n")
        f.write("python %s\n" % sys.version.split()[0])
        for mod in (torch, diffusers, peft, safetensors):
            f.write("%s %s\n" % (mod.__name__, mod.__version__))


if __name__ == "__main__":
    main()
