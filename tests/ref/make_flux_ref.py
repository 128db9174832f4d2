"""Reference files for tests/lua/test_flux.lua and test_flux_load.lua (ck.flux and ck.flux_keys against
diffusers' FluxTransformer2DModel, its single-file conversion and PEFT), and for the Flux VAE in
test_vae.lua.

Run from the repository root:  /work/venv-ref/bin/python tests/ref/make_flux_ref.py
Writes tests/data/flux/:
  transformer/          a seeded random flux-tiny FluxTransformer2DModel as diffusers saves it: config.json,
                        two bf16 shards and diffusion_pytorch_model.safetensors.index.json (weights rounded
                        to bf16 before anything runs, so every reference below uses exactly the saved values)
  bfl.safetensors       the same weights in Black Forest Labs' layout (double_blocks.*, single_blocks.*,
                        fused qkv and linear1, final_layer.adaLN_modulation.1 as (shift, scale)), bf16, no
                        prefix; made by this script's inverse of diffusers' convert_flux_transformer_checkpoint_
                        to_diffusers, and checked: that function (its hard-coded inner_dim 3072 set to
                        flux-tiny's, the only change) maps the file back to the diffusers weights bitwise
  bfl_fp8.safetensors   the BFL layout as ComfyUI ships fp8 files: "model.diffusion_model." before every key,
                        matrices in float8_e4m3fn, vectors (biases, norm scales) in bf16
  ref.safetensors       float32: inputs latents [2,16,4,6] (packed by FluxPipeline._pack_latents into
                        packed [2,6,64]), encoder_hidden_states [2,5,32], pooled_projections [2,16],
                        timestep [2] (sigma in [0, 1]), guidance [2], img_ids [6,3], txt_ids [5,3], target
                        [2,16,4,6]; out [2,6,64] (the transformer's output) and out_unpacked [2,16,4,6]
                        (FluxPipeline._unpack_latents at 32x48 px); out_fp8 (the same with the fp8 file's
                        weights); loss = mse(out_unpacked, target) and its gradient grad/<name> for the inputs
                        latents, encoder_hidden_states, pooled_projections and every parameter;
                        lora/<module>.lora_A.weight, lora_B.weight (PEFT, rank 4, alpha 8, diffusers'
                        train_dreambooth_lora_flux.py targets, lora_B random so every factor has a gradient),
                        lora_out, lora_loss and lora_grad/<module>.lora_{A,B}.weight with the base frozen
  flux_dev_keys.txt, flux_schnell_keys.txt, flux_dev_bfl_keys.txt
                        "name [shape]" per line: every parameter of FLUX.1-dev and schnell (diffusers' config
                        defaults, guidance_embeds true / false) built on the meta device, and the dev BFL names
                        the inverse conversion gives them
  vae/                  a seeded random AutoencoderKL in ck.vae's "flux-tiny" config (16 latent channels,
                        no quant convs, shift_factor 0.1159, scaling_factor 0.3611; fp16 on disk) with its
                        config.json, and io.safetensors: sample, mean, logvar, noise, cached =
                        (mean + exp(0.5 logvar) noise - shift) * scale, image = decode(cached / scale + shift)
  flux_vae_keys.txt     every state_dict key of FLUX.1's full VAE with its shape
  VERSIONS.txt          the package versions that made these files
Python is never run by ctest; these files are committed.
"""
import inspect
import json
import os
import shutil

import diffusers
import numpy
import peft
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, FluxTransformer2DModel
from diffusers.loaders import single_file_utils
from diffusers.pipelines.flux.pipeline_flux import FluxPipeline
from peft import LoraConfig

OUT = os.path.join("tests", "data", "flux")

# must equal ck.flux's "flux-tiny" config (stdlib/ck/flux.lua)
TINY = dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
            axes_dims_rope=(4, 6, 6))
DEV = dict(guidance_embeds=True)  # every other key at diffusers' defaults: FLUX.1-dev
SCHNELL = dict(guidance_embeds=False)
# diffusers' examples/dreambooth/train_dreambooth_lora_flux.py target_modules
LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                "ff_context.net.2"]
# must equal ck.vae's "flux-tiny" config (stdlib/ck/vae.lua)
VAE_FLUX = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
                layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024,
                scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                force_upcast=True, mid_block_add_attention=True)
VAE_TINY = dict(VAE_FLUX, down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                block_out_channels=[8, 16], layers_per_block=1, norm_num_groups=4, sample_size=32)


def to_bfl(sd, inner, num_layers, num_single_layers):
    """diffusers names -> Black Forest Labs' (the inverse of convert_flux_transformer_checkpoint_to_diffusers)"""
    out = {}

    def take(dst, src):
        out[dst + ".weight"] = sd[src + ".weight"]
        out[dst + ".bias"] = sd[src + ".bias"]

    def fuse(dst, srcs):
        out[dst + ".weight"] = torch.cat([sd[s + ".weight"] for s in srcs], dim=0)
        out[dst + ".bias"] = torch.cat([sd[s + ".bias"] for s in srcs], dim=0)

    take("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
    take("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
    take("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
    take("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
    if "time_text_embed.guidance_embedder.linear_1.weight" in sd:
        take("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
        take("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")
    take("txt_in", "context_embedder")
    take("img_in", "x_embedder")
    for i in range(num_layers):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        take(b + "img_mod.lin", d + "norm1.linear")
        take(b + "txt_mod.lin", d + "norm1_context.linear")
        fuse(b + "img_attn.qkv", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"])
        fuse(b + "txt_attn.qkv", [d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"])
        out[b + "img_attn.norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "img_attn.norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        out[b + "txt_attn.norm.query_norm.scale"] = sd[d + "attn.norm_added_q.weight"]
        out[b + "txt_attn.norm.key_norm.scale"] = sd[d + "attn.norm_added_k.weight"]
        take(b + "img_mlp.0", d + "ff.net.0.proj")
        take(b + "img_mlp.2", d + "ff.net.2")
        take(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        take(b + "txt_mlp.2", d + "ff_context.net.2")
        take(b + "img_attn.proj", d + "attn.to_out.0")
        take(b + "txt_attn.proj", d + "attn.to_add_out")
    for i in range(num_single_layers):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        take(b + "modulation.lin", d + "norm.linear")
        fuse(b + "linear1", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp"])
        out[b + "norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        take(b + "linear2", d + "proj_out")
    take("final_layer.linear", "proj_out")
    for wb in ("weight", "bias"):  # diffusers (scale, shift) -> BFL (shift, scale)
        scale, shift = sd["norm_out.linear." + wb].chunk(2, dim=0)
        out["final_layer.adaLN_modulation.1." + wb] = torch.cat([shift, scale], dim=0)
    assert len(out) == len(sd) - 8 * num_layers - 6 * num_single_layers, "tensor count"
    return out


def diffusers_conversion(inner):
    """diffusers' convert_flux_transformer_checkpoint_to_diffusers with its inner_dim (hard-coded 3072, FLUX.1's
    width) set to inner: the function's own text, that one assignment changed"""
    src = inspect.getsource(single_file_utils.convert_flux_transformer_checkpoint_to_diffusers)
    assert src.count("inner_dim = 3072") == 1
    ns = dict(vars(single_file_utils))
    exec(src.replace("inner_dim = 3072", "inner_dim = %d" % inner), ns)
    return ns["convert_flux_transformer_checkpoint_to_diffusers"]


def write_keys(path, items):
    with open(path, "w") as f:
        for k, shape in items:
            f.write("%s [%s]\n" % (k, ",".join(str(d) for d in shape)))


def full_key_lists():
    with torch.device("meta"):
        dev = FluxTransformer2DModel(**DEV)
        schnell = FluxTransformer2DModel(**SCHNELL)
    n_dev = sum(p.numel() for p in dev.parameters())
    n_schnell = sum(p.numel() for p in schnell.parameters())
    print("FLUX.1-dev %d parameters, schnell %d" % (n_dev, n_schnell))
    assert n_dev == 11901408320 and n_schnell == 11891178560
    write_keys(os.path.join(OUT, "flux_dev_keys.txt"), [(k, v.shape) for k, v in dev.state_dict().items()])
    write_keys(os.path.join(OUT, "flux_schnell_keys.txt"),
               [(k, v.shape) for k, v in schnell.state_dict().items()])
    bfl = to_bfl(dev.state_dict(), 3072, 19, 38)
    write_keys(os.path.join(OUT, "flux_dev_bfl_keys.txt"), [(k, v.shape) for k, v in bfl.items()])


def randomize(model):
    """weights ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2), norm scales 1 + N(0, 0.2^2); rounded to bf16 (the files'
    dtype) so that the fp32 reference runs on exactly the saved values"""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
            p.copy_(p.bfloat16().float())


def forward(model, x):
    out = model(hidden_states=x["packed"], encoder_hidden_states=x["encoder_hidden_states"],
                pooled_projections=x["pooled_projections"], timestep=x["timestep"], img_ids=x["img_ids"],
                txt_ids=x["txt_ids"], guidance=x["guidance"], return_dict=False)[0]
    unpacked = FluxPipeline._unpack_latents(out, 32, 48, 8)
    return out, unpacked, F.mse_loss(unpacked, x["target"])


def transformer_refs():
    torch.manual_seed(20261203)
    model = FluxTransformer2DModel(**TINY).eval()
    randomize(model)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}

    tdir = os.path.join(OUT, "transformer")
    shutil.rmtree(tdir, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tdir, max_shard_size="150KB", safe_serialization=True)
    model.float()
    shards = sorted(f for f in os.listdir(tdir) if f.endswith(".safetensors"))
    assert len(shards) >= 2 and os.path.exists(os.path.join(tdir, "diffusion_pytorch_model.safetensors.index.json"))
    back = {}
    for s in shards:
        back.update(safetensors.torch.load_file(os.path.join(tdir, s)))
    assert back.keys() == sd.keys() and all(torch.equal(back[k].float(), sd[k]) for k in sd)

    inner = TINY["num_attention_heads"] * TINY["attention_head_dim"]
    bfl = to_bfl(sd, inner, TINY["num_layers"], TINY["num_single_layers"])
    bfl = {k: v.bfloat16().contiguous() for k, v in bfl.items()}
    safetensors.torch.save_file(bfl, os.path.join(OUT, "bfl.safetensors"))
    # diffusers' own conversion takes the file back to the diffusers weights, bitwise
    f = safetensors.torch.load_file(os.path.join(OUT, "bfl.safetensors"))
    conv = diffusers_conversion(inner)(f)
    assert conv.keys() == sd.keys(), sorted(set(conv) ^ set(sd))
    assert all(torch.equal(conv[k].float(), sd[k]) for k in sd), "the BFL file does not map back bitwise"
    prefixed = {"model.diffusion_model." + k: v for k, v in bfl.items()}
    conv = diffusers_conversion(inner)(dict(prefixed))
    assert conv.keys() == sd.keys() and all(torch.equal(conv[k].float(), sd[k]) for k in sd)

    # fp8 as ComfyUI ships it: prefixed, matrices e4m3fn, vectors bf16
    fp8 = {k: (v.to(torch.float8_e4m3fn) if v.dim() >= 2 else v).contiguous() for k, v in prefixed.items()}
    safetensors.torch.save_file(fp8, os.path.join(OUT, "bfl_fp8.safetensors"))
    model8 = FluxTransformer2DModel(**TINY).eval()
    model8.load_state_dict({k: v.float() for k, v in diffusers_conversion(inner)(
        {k: v.float() for k, v in fp8.items()}).items()})

    g = torch.Generator().manual_seed(11)
    x = {
        "latents": torch.randn(2, 16, 4, 6, generator=g),
        "encoder_hidden_states": torch.randn(2, 5, TINY["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(2, TINY["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([0.3125, 0.8]),
        "guidance": torch.tensor([1.0, 3.5]),
        "target": torch.randn(2, 16, 4, 6, generator=g),
        "img_ids": FluxPipeline._prepare_latent_image_ids(2, 2, 3, "cpu", torch.float32),
        "txt_ids": torch.zeros(5, 3),
    }
    for k in ("latents", "encoder_hidden_states", "pooled_projections"):
        x[k].requires_grad_(True)
    x["packed"] = FluxPipeline._pack_latents(x["latents"], 2, 16, 4, 6)
    ref = {}
    out, unpacked, loss = forward(model, x)
    loss.backward()
    ref["out"], ref["out_unpacked"], ref["loss"] = out, unpacked, loss.reshape(1)
    for k in ("latents", "encoder_hidden_states", "pooled_projections"):
        ref["grad/" + k] = x[k].grad.clone()
        x[k].grad = None
    for name, p in model.named_parameters():
        ref["grad/" + name] = p.grad.clone()
    with torch.no_grad():
        ref["out_fp8"] = forward(model8, x)[0]

    # LoRA on the frozen base, as diffusers' Flux LoRA script attaches it
    model.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    model.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian", target_modules=LORA_TARGETS))
    lora = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
            if "lora_" in name:
                lora[name.replace(".default", "")] = p
    for k in ("latents", "encoder_hidden_states", "pooled_projections"):
        x[k] = x[k].detach()
    x["packed"] = FluxPipeline._pack_latents(x["latents"], 2, 16, 4, 6)
    out, _, loss = forward(model, x)
    loss.backward()
    ref["lora_out"], ref["lora_loss"] = out, loss.reshape(1)
    for name, p in lora.items():
        ref["lora/" + name] = p.detach().clone()
        ref["lora_grad/" + name] = p.grad.clone()
    print("flux-tiny: %d parameters, %d LoRA tensors; loss %.6g, LoRA loss %.6g" % (
        sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n), len(lora), ref["loss"].item(),
        ref["lora_loss"].item()))
    for k in ("latents", "packed", "encoder_hidden_states", "pooled_projections", "timestep", "guidance", "target",
              "img_ids", "txt_ids"):
        ref[k] = x[k]
    safetensors.torch.save_file({k: v.detach().float().contiguous() for k, v in ref.items()},
                                os.path.join(OUT, "ref.safetensors"))


def vae_refs():
    vdir = os.path.join(OUT, "vae")
    os.makedirs(vdir, exist_ok=True)
    with torch.device("meta"):
        full = AutoencoderKL(**VAE_FLUX)
    with open(os.path.join(OUT, "flux_vae_keys.txt"), "w") as f:
        for k, v in full.state_dict().items():
            f.write("%s [%s]\n" % (k, ",".join(str(d) for d in v.shape)))
    torch.manual_seed(20261204)
    vae = AutoencoderKL(**VAE_TINY).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
        for p in vae.parameters():
            p.copy_(p.half().float())
    vae.to(torch.float16).save_pretrained(vdir, safe_serialization=True)
    vae.float()
    g = torch.Generator().manual_seed(5)
    sample = torch.rand(1, 3, 16, 24, generator=g) * 2 - 1
    noise = torch.randn(1, 16, 8, 12, generator=g)
    sf, shift = vae.config.scaling_factor, vae.config.shift_factor
    with torch.no_grad():
        dist = vae.encode(sample).latent_dist
        mean, logvar = dist.mean, dist.logvar
        # FluxPipeline's and train_dreambooth_lora_flux.py's recipes
        cached = (mean + torch.exp(0.5 * logvar) * noise - shift) * sf
        image = vae.decode(cached / sf + shift).sample
    io = {"sample": sample, "mean": mean, "logvar": logvar, "noise": noise, "cached": cached, "image": image}
    safetensors.torch.save_file({k: v.float().contiguous() for k, v in io.items()},
                                os.path.join(vdir, "io.safetensors"))
    print("flux-tiny VAE: %d parameters; image |max| %.4g" % (sum(p.numel() for p in vae.parameters()),
                                                              image.abs().max()))


def main():
    os.makedirs(OUT, exist_ok=True)
    full_key_lists()
    transformer_refs()
    vae_refs()
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_flux_ref.py with\n")
        f.write("torch %s\ndiffusers %s\npeft %s\nsafetensors %s\nnumpy %s\n" % (
            torch.__version__, diffusers.__version__, peft.__version__, safetensors.__version__,
            numpy.__version__))


if __name__ == "__main__":
    main()
