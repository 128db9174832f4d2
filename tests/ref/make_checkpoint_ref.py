"""Reference files for tests/lua/test_checkpoint.lua: tiny random SDXL-shaped
models (UNet2DConditionModel, AutoencoderKL, CLIPTextModel,
CLIPTextModelWithProjection) saved as a diffusers folder, and the same weights
as a Stability SGM single file (F16, and a BF16 copy), proven equal through
diffusers' own single-file loaders (each model's, and the pipeline's).

Run: /work/venv-ref/bin/python tests/ref/make_checkpoint_ref.py
Writes tests/data/checkpoint/{sdxl_tiny/, sdxl_tiny.safetensors,
sdxl_tiny_bf16.safetensors (part), VERSIONS.txt}. No network: configs are built here.
"""
import json
import os
import re
import shutil
import sys

import torch
import safetensors.torch as st
import diffusers
import transformers
from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "checkpoint")
FOLDER = os.path.join(OUT, "sdxl_tiny")



def byte_chars():
    """CLIP's byte-level BPE alphabet: printable Latin-1 bytes stand for
    themselves, the rest for the code points from 256 up, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


# a tiny CLIP vocabulary: every byte alone and word-final, two merges, the two specials
MERGES = [("t", "h"), ("th", "e</w>")]
VOCAB = byte_chars() + [c + "</w>" for c in byte_chars()] + ["th", "the</w>", "<|startoftext|>", "<|endoftext|>"]
BOS, EOS = len(VOCAB) - 2, len(VOCAB) - 1

CLIP_L = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, vocab_size=len(VOCAB),
              max_position_embeddings=8, hidden_act="quick_gelu", bos_token_id=BOS, eos_token_id=EOS,
              pad_token_id=EOS)
CLIP_G = dict(hidden_size=12, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
              vocab_size=len(VOCAB), max_position_embeddings=8, hidden_act="gelu", projection_dim=8,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)
UNET = dict(sample_size=8, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            mid_block_type="UNetMidBlock2DCrossAttn",
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(4, 8, 8), layers_per_block=2, norm_num_groups=2,
            cross_attention_dim=CLIP_L["hidden_size"] + CLIP_G["hidden_size"],
            transformer_layers_per_block=(1, 1, 2), attention_head_dim=(1, 2, 2), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=4,
            projection_class_embeddings_input_dim=CLIP_G["projection_dim"] + 6 * 4)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(4, 4, 8, 8), layers_per_block=1,
           latent_channels=4, norm_num_groups=2, sample_size=32, scaling_factor=0.13025)


def randomize(model, seed):
    """Every tensor random (norm weights and biases too), so a swapped pair shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def half(sd):
    return {k: v.detach().to(torch.float16).contiguous() for k, v in sd.items()}


# ---- diffusers names -> SGM names (the inverse of what a single-file loader does)

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
          "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}


def unet_prefixes(cfg):
    """diffusers module prefix -> (SGM prefix, is_resnet)"""
    n = len(cfg["block_out_channels"])
    L = cfg["layers_per_block"]
    m = {"conv_in": ("input_blocks.0.0", False), "time_embedding.linear_1": ("time_embed.0", False),
         "time_embedding.linear_2": ("time_embed.2", False), "add_embedding.linear_1": ("label_emb.0.0", False),
         "add_embedding.linear_2": ("label_emb.0.2", False), "conv_norm_out": ("out.0", False),
         "conv_out": ("out.2", False)}
    k = 1
    for b in range(n):
        for j in range(L):
            m[f"down_blocks.{b}.resnets.{j}"] = (f"input_blocks.{k}.0", True)
            m[f"down_blocks.{b}.attentions.{j}"] = (f"input_blocks.{k}.1", False)
            k += 1
        if b < n - 1:
            m[f"down_blocks.{b}.downsamplers.0.conv"] = (f"input_blocks.{k}.0.op", False)
            k += 1
    m["mid_block.resnets.0"] = ("middle_block.0", True)
    m["mid_block.attentions.0"] = ("middle_block.1", False)
    m["mid_block.resnets.1"] = ("middle_block.2", True)
    k = 0
    for b in range(n):
        cross = cfg["up_block_types"][b].startswith("CrossAttn")
        for j in range(L + 1):
            m[f"up_blocks.{b}.resnets.{j}"] = (f"output_blocks.{k}.0", True)
            m[f"up_blocks.{b}.attentions.{j}"] = (f"output_blocks.{k}.1", False)
            if b < n - 1 and j == L:
                m[f"up_blocks.{b}.upsamplers.0.conv"] = (f"output_blocks.{k}.{2 if cross else 1}.conv", False)
            k += 1
    return m


def to_sgm_unet(sd, cfg):
    pre = unet_prefixes(cfg)
    out = {}
    for key, v in sd.items():
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            p = ".".join(parts[:cut])
            if p in pre:
                sgm, resnet = pre[p]
                rest = parts[cut:]
                if resnet:
                    rest = RESNET[rest[0]].split(".") + rest[1:]
                out["model.diffusion_model." + sgm + "." + ".".join(rest)] = v
                break
        else:
            raise KeyError(key)
    return out


def to_sgm_vae(sd, cfg):
    n = len(cfg["block_out_channels"])
    out = {}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for key, v in sd.items():
        k = key
        k = re.sub(r"^(encoder|decoder)\.conv_norm_out\.", r"\1.norm_out.", k)
        k = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block.", k)
        k = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", k)
        k = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.",
                   lambda mm: f"decoder.up.{n - 1 - int(mm.group(1))}.block.", k)
        k = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.",
                   lambda mm: f"decoder.up.{n - 1 - int(mm.group(1))}.upsample.", k)
        k = re.sub(r"\.mid_block\.resnets\.(\d+)\.", lambda mm: f".mid.block_{int(mm.group(1)) + 1}.", k)
        mm = re.match(r"^(encoder|decoder)\.mid_block\.attentions\.0\.(.*)\.(weight|bias)$", k)
        if mm:
            k = f"{mm.group(1)}.mid.attn_1.{attn[mm.group(2)]}.{mm.group(3)}"
            if v.ndim == 2:  # the LDM VAE's attention is 1x1 convs
                v = v.reshape(v.shape[0], v.shape[1], 1, 1)
        k = k.replace(".conv_shortcut.", ".nin_shortcut.")
        out["first_stage_model." + k] = v
    return out


def to_sgm_clip_l(sd):
    return {"conditioner.embedders.0.transformer." + k: v for k, v in sd.items()}


def to_sgm_open_clip(sd):
    out, qkv = {}, {}
    pre = "conditioner.embedders.1.model."
    fixed = {"text_model.embeddings.position_embedding.weight": "positional_embedding",
             "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
             "text_model.final_layer_norm.weight": "ln_final.weight",
             "text_model.final_layer_norm.bias": "ln_final.bias"}
    for key, v in sd.items():
        if key in fixed:
            out[pre + fixed[key]] = v
            continue
        if key == "text_projection.weight":
            out[pre + "text_projection"] = v.t().contiguous()
            continue
        mm = re.match(r"^text_model\.encoder\.layers\.(\d+)\.(.*)$", key)
        assert mm, key
        i, rest = mm.group(1), mm.group(2)
        q = re.match(r"^self_attn\.([qkv])_proj\.(weight|bias)$", rest)
        if q:
            qkv.setdefault((i, q.group(2)), {})[q.group(1)] = v
            continue
        rest = (rest.replace("layer_norm1", "ln_1").replace("layer_norm2", "ln_2")
                .replace("mlp.fc1", "mlp.c_fc").replace("mlp.fc2", "mlp.c_proj").replace("self_attn.", "attn."))
        out[pre + f"transformer.resblocks.{i}." + rest] = v
    for (i, kind), d in qkv.items():
        out[pre + f"transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat([d["q"], d["k"], d["v"]], 0)
    return out


def save_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    torch.manual_seed(0)
    if os.path.isdir(FOLDER):
        shutil.rmtree(FOLDER)
    os.makedirs(FOLDER)

    unet = randomize(UNet2DConditionModel(**UNET), 1)
    vae = randomize(AutoencoderKL(**VAE), 2)
    te = randomize(CLIPTextModel(CLIPTextConfig(**CLIP_L)), 3)
    te2 = randomize(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_G)), 4)

    sd_unet, sd_vae = half(unet.state_dict()), half(vae.state_dict())
    # text encoders under the names users' files carry (text_model.*), whatever
    # this transformers version calls them in memory
    sd_te = {("" if k.startswith("text_model.") else "text_model.") + k: v for k, v in half(te.state_dict()).items()}
    sd_te = {k: v for k, v in sd_te.items() if not k.endswith("position_ids")}
    sd_te2 = {k: v for k, v in half(te2.state_dict()).items() if not k.endswith("position_ids")}

    # the diffusers folder: configs as the libraries write them; weights in the
    # file names users have (plain, the fp16 variant, and a sharded index)
    for name, model in (("unet", unet), ("vae", vae)):
        model.save_config(os.path.join(FOLDER, name))
    te.config.save_pretrained(os.path.join(FOLDER, "text_encoder"))
    te2.config.save_pretrained(os.path.join(FOLDER, "text_encoder_2"))
    st.save_file(sd_unet, os.path.join(FOLDER, "unet", "diffusion_pytorch_model.fp16.safetensors"))
    st.save_file(sd_vae, os.path.join(FOLDER, "vae", "diffusion_pytorch_model.safetensors"))
    st.save_file(sd_te, os.path.join(FOLDER, "text_encoder", "model.safetensors"))
    keys2 = list(sd_te2)
    shards = {"model-00001-of-00002.safetensors": keys2[: len(keys2) // 2],
              "model-00002-of-00002.safetensors": keys2[len(keys2) // 2:]}
    weight_map = {}
    for fname, ks in shards.items():
        st.save_file({k: sd_te2[k] for k in ks}, os.path.join(FOLDER, "text_encoder_2", fname))
        weight_map.update({k: fname for k in ks})
    save_json(os.path.join(FOLDER, "text_encoder_2", "model.safetensors.index.json"),
              {"metadata": {"total_size": sum(v.numel() * 2 for v in sd_te2.values())}, "weight_map": weight_map})
    EulerDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                           num_train_timesteps=1000).save_config(os.path.join(FOLDER, "scheduler"))
    save_json(os.path.join(FOLDER, "model_index.json"), {
        "_class_name": "StableDiffusionXLPipeline", "_diffusers_version": diffusers.__version__,
        "force_zeros_for_empty_prompt": True, "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer_2": ["transformers", "CLIPTokenizer"]})

    # tokenizers as SDXL's: the first pads with <|endoftext|>, the second with "!" (id 0)
    import tempfile
    from transformers import CLIPTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        vocab, merges = os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt")
        with open(vocab, "w") as f:
            json.dump({t: i for i, t in enumerate(VOCAB)}, f, ensure_ascii=False)
        with open(merges, "w") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
        for name, pad in (("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")):
            tok = CLIPTokenizer(vocab, merges, pad_token=pad, model_max_length=CLIP_L["max_position_embeddings"])
            ids = tok("the cat", padding="max_length")["input_ids"]
            want = [BOS, VOCAB.index("the</w>"), VOCAB.index("c"), VOCAB.index("a"), VOCAB.index("t</w>"), EOS]
            if ids[:6] != want or ids[6] != VOCAB.index(pad) and pad == "!" or ids[6] != EOS and pad != "!":
                sys.exit(f"{name}: 'the cat' tokenizes to {ids}, expected {want} then padding")
            out = os.path.join(FOLDER, name)
            tok.save_pretrained(out)
            # and the files SDXL's repositories hold beside tokenizer.json
            shutil.copy(vocab, out)
            shutil.copy(merges, out)
            save_json(os.path.join(out, "special_tokens_map.json"), {
                "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad,
                "unk_token": "<|endoftext|>"})
            again = CLIPTokenizer.from_pretrained(out)
            if again("the cat", padding="max_length")["input_ids"] != ids:
                sys.exit(f"{name}: the saved tokenizer reads back differently")

    # the single file, F16, and the same values in BF16
    single = {}
    single.update(to_sgm_unet(sd_unet, UNET))
    single.update(to_sgm_vae(sd_vae, VAE))
    single.update(to_sgm_clip_l(sd_te))
    single.update(to_sgm_open_clip(sd_te2))
    single_path = os.path.join(OUT, "sdxl_tiny.safetensors")
    st.save_file(single, single_path, metadata={"modelspec.architecture": "stable-diffusion-xl-v1-base"})
    # BF16: the VAE, both text encoders and a few UNet blocks (a resnet, an
    # attention, the embeddings), enough to check the conversion, not a third copy
    few = re.compile(r"^(first_stage_model|conditioner)\.|^model\.diffusion_model\."
                     r"(input_blocks\.[014]\.|label_emb\.|time_embed\.|out\.)")
    st.save_file({k: v.to(torch.bfloat16) for k, v in single.items() if few.match(k)},
                 os.path.join(OUT, "sdxl_tiny_bf16.safetensors"))

    # proof: diffusers' single-file loaders read the file back to the folder's weights
    ckpt = st.load_file(single_path)
    u2 = UNet2DConditionModel.from_single_file(single_path, config=FOLDER, subfolder="unet", local_files_only=True,
                                               torch_dtype=torch.float16)
    v2 = AutoencoderKL.from_single_file(single_path, config=FOLDER, subfolder="vae", local_files_only=True,
                                        torch_dtype=torch.float16)
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm
    t1 = create_diffusers_clip_model_from_ldm(CLIPTextModel, ckpt, subfolder="text_encoder", config=FOLDER,
                                              local_files_only=True, torch_dtype=torch.float16)
    t2 = create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, ckpt, subfolder="text_encoder_2",
                                              config=FOLDER, local_files_only=True, torch_dtype=torch.float16)
    # the whole pipeline from the single file, with this folder as its config
    pipe = StableDiffusionXLPipeline.from_single_file(single_path, config=FOLDER, local_files_only=True,
                                                      torch_dtype=torch.float16)
    # and transformers reads the folder's text encoders (the sharded one too)
    t1f = CLIPTextModel.from_pretrained(os.path.join(FOLDER, "text_encoder"), torch_dtype=torch.float16)
    t2f = CLIPTextModelWithProjection.from_pretrained(os.path.join(FOLDER, "text_encoder_2"), torch_dtype=torch.float16)
    checked = 0
    for what, model, ref in (("unet", u2, half(unet.state_dict())), ("vae", v2, half(vae.state_dict())),
                             ("text_encoder", t1, half(te.state_dict())), ("text_encoder_2", t2, half(te2.state_dict())),
                             ("pipeline unet", pipe.unet, half(unet.state_dict())),
                             ("pipeline vae", pipe.vae, half(vae.state_dict())),
                             ("pipeline text_encoder", pipe.text_encoder, half(te.state_dict())),
                             ("pipeline text_encoder_2", pipe.text_encoder_2, half(te2.state_dict())),
                             ("text_encoder folder", t1f, half(te.state_dict())),
                             ("text_encoder_2 folder", t2f, half(te2.state_dict()))):
        got = model.state_dict()
        ref = {k: v for k, v in ref.items() if not k.endswith("position_ids")}
        got = {k: v for k, v in got.items() if not k.endswith("position_ids")}
        if set(got) != set(ref):
            sys.exit(f"{what}: keys differ: {sorted(set(got) ^ set(ref))[:5]}")
        for k, v in ref.items():
            if not torch.equal(got[k].to(torch.float16), v):
                sys.exit(f"{what}: {k} differs after the single-file load")
            checked += 1
    print(f"single file: {len(single)} tensors; {checked} tensors equal through diffusers' loaders")

    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_checkpoint_ref.py with\n")
        for m in (torch, diffusers, transformers):
            f.write(f"{m.__name__} {m.__version__}\n")
        import safetensors
        f.write(f"safetensors {safetensors.__version__}\n")
        f.write(f"python {sys.version.split()[0]}\n")


if __name__ == "__main__":
    main()
