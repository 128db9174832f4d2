"""Reference files for tests/lua/test_flow.lua and test_flux_pipeline.lua (ck.flow and ck.flux_pipeline
against kohya's sd-scripts and diffusers).

Run from the repository root, with a checkout of kohya's sd-scripts (its library/ folder is read, not
imported: the functions below are taken from its source text and run as they are):

    git clone https://github.com/kohya-ss/sd-scripts /tmp/sd-scripts   # 48d368fa557731ad0488c07304dfeba8c07910eb
    /work/venv-ref/bin/python tests/ref/make_flow_ref.py /tmp/sd-scripts

Writes tests/data/flow/:
  objective.safetensors  the training objective, float32 unless said:
    draw/<case>/u, z      the draws kohya's get_noisy_model_input_and_timesteps took from torch for 64 samples
                          (torch.rand and torch.randn under the same seed: u for uniform and the "sigma"
                          sampling's uniform and mode densities, z for the normal draws)
    draw/<case>/sigmas, timesteps  what that function returned; the case's settings are in the metadata
                          (JSON under "cases")
    table/shift<S>/sigmas, timesteps  FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=S)'s
                          training tables (kohya's copy of the class, in library/sd3_train_utils.py)
    weighting/<scheme>    compute_loss_weighting_for_sd3(scheme, sigmas) on draw/uniform/sigmas
    loss inputs: latents, noise [2, 4, 2, 2] (float64 values rounded to float32), sigmas [2], w [1, 4, 1, 1],
                          b [1, 4, 1, 1] (the toy model: prediction = noisy * w + b)
    loss/<type>/<scheme>/<applies>, grad_w/..., grad_b/...  the loss as kohya's train_network.py computes it
                          (apply_model_prediction_type, target noise - latents, mse "none" times the
                          weighting, mean per sample, mean) and autograd's gradients of w and b; applies
                          "sigma_scaled" is kohya's rule (weights with sigma_scaled only), "always" diffusers'
                          train_dreambooth_lora_flux.py (weights whatever the prediction)
  schedule.safetensors   FluxPipeline's schedule: sigmas/<cfg>/<seq>/<steps>, timesteps/<cfg>/<seq>/<steps> from
                          FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=np.linspace(1, 1/N, N),
                          mu=calculate_shift(seq)) with FLUX.1-dev's scheduler config (dev) and schnell's
  pipeline/              a tiny Flux pipeline folder as diffusers saves one: model_index.json, scheduler/
                          (FLUX.1-dev's config), text_encoder/ (a seeded random CLIPTextModel, hidden 16 =
                          flux-tiny's pooled_projection_dim, bf16 on disk), tokenizer/ (CLIP BPE: the first 400 merges of
                          tests/data/tokenizer/clip_l), text_encoder_2/ (a seeded random T5EncoderModel,
                          d_model 32 = flux-tiny's joint_attention_dim, bf16 on disk), tokenizer_2 -> ../../tokenizer/t5_small/json,
                          transformer -> ../../flux/transformer, vae -> ../../flux/vae (symlinks: the files
                          tests/ref/make_flux_ref.py and make_t5_tokenizer_ref.py made)
  pipeline.safetensors   FluxPipeline.from_pretrained(pipeline/) at 32x24 px (latents 16x12x16, 48 image tokens),
                          4 steps, guidance 3.5, max_sequence_length 32, from init_latents [16, 12, 16] (unpacked):
                          prompt_embeds [1, 32, 32], pooled_prompt_embeds [1, 16], timesteps, latents_step1 and
                          latents_step4 (unpacked, after those steps), image_raw (the VAE's decode of the unscaled latents) and image
                          (the pipeline's output_type="pt", in [0, 1]); the prompt and settings in the metadata
  ae_ldm.safetensors     the tiny Flux VAE (tests/data/flux/vae) in Black Forest Labs' ae.safetensors names (LDM's:
                          encoder.down.0.block.0.norm1.weight, ..., mid.attn_1.q as 1x1 convs), fp16, made by this
                          script's inverse of diffusers' convert_ldm_vae_checkpoint and checked by it bitwise
  VERSIONS.txt           the versions that made these files
Python is never run by ctest; these files are committed.
"""
import ast
import json
import math
import os
import shutil
import subprocess
import sys
import types

import diffusers
import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.training_utils import compute_loss_weighting_for_sd3 as diffusers_weighting
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

OUT = os.path.join("tests", "data", "flow")
KOHYA_COMMIT = "48d368fa557731ad0488c07304dfeba8c07910eb"


def kohya_functions(root):
    """kohya's functions and scheduler class from their source text, run in a namespace of their imports"""
    import typing
    ns = {"torch": torch, "math": math, "np": np, "Tuple": typing.Tuple, "Callable": typing.Callable,
          "Optional": typing.Optional, "Union": typing.Union, "List": typing.List, "argparse": None}
    from diffusers.configuration_utils import ConfigMixin, register_to_config
    from diffusers.schedulers.scheduling_utils import SchedulerMixin
    from diffusers.utils import BaseOutput
    ns.update(ConfigMixin=ConfigMixin, register_to_config=register_to_config, SchedulerMixin=SchedulerMixin,
              BaseOutput=BaseOutput)
    want = {"library/flux_train_utils.py": ["time_shift", "get_lin_function", "get_sigmas",
                                             "compute_density_for_timestep_sampling",
                                             "compute_loss_weighting_for_sd3",
                                             "get_noisy_model_input_and_timesteps", "apply_model_prediction_type"],
            "library/sd3_train_utils.py": ["FlowMatchEulerDiscreteSchedulerOutput", "FlowMatchEulerDiscreteScheduler"]}
    for rel, names in want.items():
        src = open(os.path.join(root, rel), encoding="utf-8").read()
        tree = ast.parse(src)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                code = ast.get_source_segment(src, node)
                exec(compile(code, rel, "exec"), ns)
        missing = [n for n in names if n not in ns]
        assert not missing, (rel, missing)
    return types.SimpleNamespace(**ns)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def objective_refs(k):
    out, cases = {}, {}
    B = 64
    settings = [
        ("uniform", dict(timestep_sampling="uniform"), (64, 64)),
        ("sigmoid", dict(timestep_sampling="sigmoid", sigmoid_scale=1.0), (64, 64)),
        ("sigmoid_scale2.5", dict(timestep_sampling="sigmoid", sigmoid_scale=2.5), (64, 64)),
        ("shift3.1582", dict(timestep_sampling="shift", sigmoid_scale=1.0, discrete_flow_shift=3.1582), (64, 64)),
        ("flux_shift_64x64", dict(timestep_sampling="flux_shift", sigmoid_scale=1.0), (64, 64)),
        ("flux_shift_128x96", dict(timestep_sampling="flux_shift", sigmoid_scale=1.0), (128, 96)),
        ("sigma_uniform_shift3", dict(timestep_sampling="sigma", weighting_scheme="uniform", discrete_flow_shift=3.0),
         (64, 64)),
        ("sigma_logit_normal", dict(timestep_sampling="sigma", weighting_scheme="logit_normal", logit_mean=0.3,
                                    logit_std=1.2, discrete_flow_shift=1.0), (64, 64)),
        ("sigma_mode_shift3", dict(timestep_sampling="sigma", weighting_scheme="mode", mode_scale=1.29,
                                   discrete_flow_shift=3.0), (64, 64)),
    ]
    for i, (name, s, (h, w)) in enumerate(settings):
        args = types.SimpleNamespace(timestep_sampling="sigma", sigmoid_scale=1.0, discrete_flow_shift=3.0,
                                     weighting_scheme="uniform", logit_mean=0.0, logit_std=1.0, mode_scale=1.29,
                                     ip_noise_gamma=None, ip_noise_gamma_random_strength=False)
        for key, v in s.items():
            setattr(args, key, v)
        sched = k.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=args.discrete_flow_shift)
        latents = torch.zeros(B, 1, h, w)
        seed = 1000 + i
        # the draw the function takes first, under the same seed
        torch.manual_seed(seed)
        u = torch.rand((B,))
        torch.manual_seed(seed)
        z = torch.randn((B,))
        if args.timestep_sampling == "sigma" and args.weighting_scheme == "logit_normal":
            torch.manual_seed(seed)
            n = torch.normal(mean=args.logit_mean, std=args.logit_std, size=(B,))
            assert torch.allclose(n, args.logit_mean + args.logit_std * z, rtol=0, atol=1e-6)
        torch.manual_seed(seed)
        _, timesteps, sigmas = k.get_noisy_model_input_and_timesteps(args, sched, latents, torch.zeros_like(latents),
                                                                     "cpu", torch.float32)
        out["draw/%s/u" % name] = u
        out["draw/%s/z" % name] = z
        out["draw/%s/sigmas" % name] = f32(sigmas.flatten())
        out["draw/%s/timesteps" % name] = f32(timesteps.flatten())
        c = dict(s)
        c.update(height=h, width=w)
        cases[name] = c
    for shift in (1.0, 3.0, 3.1582):
        sched = k.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
        out["table/shift%g/sigmas" % shift] = f32(sched.sigmas)
        out["table/shift%g/timesteps" % shift] = f32(sched.timesteps)
    su = out["draw/uniform/sigmas"].view(-1, 1, 1, 1)
    for scheme in ("sigma_sqrt", "cosmap", "none"):
        wk = k.compute_loss_weighting_for_sd3(scheme, su)
        assert torch.equal(wk, diffusers_weighting(scheme, su))
        out["weighting/%s" % scheme] = f32(wk.flatten())

    # the loss: a toy model prediction = noisy * w + b on [2, 4, 2, 2] latents
    g = torch.Generator().manual_seed(7)
    latents = torch.randn(2, 4, 2, 2, generator=g)
    noise = torch.randn(2, 4, 2, 2, generator=g)
    sig = torch.tensor([0.3, 0.85])
    w0 = torch.randn(1, 4, 1, 1, generator=g)
    b0 = torch.randn(1, 4, 1, 1, generator=g) * 0.1
    out.update(latents=latents, noise=noise, sigmas=sig, w=w0, b=b0)
    sigmas = sig.view(-1, 1, 1, 1)
    noisy = (1.0 - sigmas) * latents + sigmas * noise
    for mtype in ("raw", "additive", "sigma_scaled"):
        for scheme in ("none", "sigma_sqrt", "cosmap"):
            for applies in ("sigma_scaled", "always"):
                wt = w0.clone().requires_grad_(True)
                bt = b0.clone().requires_grad_(True)
                model_pred = noisy * wt + bt
                args = types.SimpleNamespace(model_prediction_type=mtype, weighting_scheme=scheme)
                model_pred, weighting = k.apply_model_prediction_type(args, model_pred, noisy, sigmas)
                if applies == "always":  # diffusers' script: the scheme's weights whatever the prediction
                    weighting = diffusers_weighting(scheme, sigmas)
                target = noise - latents
                loss = torch.nn.functional.mse_loss(model_pred.float(), target.float(), reduction="none")
                if weighting is not None:
                    loss = loss * weighting
                loss = loss.mean(dim=[1, 2, 3]).mean()
                loss.backward()
                key = "%s/%s/%s" % (mtype, scheme, applies)
                out["loss/" + key] = f32(loss.reshape(1))
                out["grad_w/" + key] = f32(wt.grad)
                out["grad_b/" + key] = f32(bt.grad)
    return {k_: f32(v) for k_, v in out.items()}, cases


DEV = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
           base_image_seq_len=256, max_image_seq_len=4096)
SCHNELL = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5, max_shift=1.15,
               base_image_seq_len=256, max_image_seq_len=4096)


def schedule_refs():
    out = {}
    cases = {"dev": [(16, 4), (96, 4), (256, 28), (1024, 28), (1024, 1), (4096, 50), (6144, 20), (1024, 3)],
             "schnell": [(1024, 4), (4096, 4), (96, 1)]}
    for cfg, pairs in cases.items():
        for seq, n in pairs:
            s = FlowMatchEulerDiscreteScheduler(**(DEV if cfg == "dev" else SCHNELL))
            sigmas = np.linspace(1.0, 1 / n, n)
            mu = calculate_shift(seq, s.config.base_image_seq_len, s.config.max_image_seq_len, s.config.base_shift,
                                 s.config.max_shift)
            s.set_timesteps(sigmas=sigmas, mu=mu)
            out["sigmas/%s/%d/%d" % (cfg, seq, n)] = f32(s.sigmas)
            out["timesteps/%s/%d/%d" % (cfg, seq, n)] = f32(s.timesteps)
    return out, cases


def small_clip_tokenizer(dst, merges_kept=400):
    src = os.path.join("tests", "data", "tokenizer", "clip_l")
    vocab = json.load(open(os.path.join(src, "vocab.json"), encoding="utf-8"))
    lines = open(os.path.join(src, "merges.txt"), encoding="utf-8").read().split("\n")
    header, merges = lines[0], [m for m in lines[1:] if m]
    merges = merges[:merges_kept]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    keep = [t for t, i in by_id if i < 512 + merges_kept]
    keep += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(keep)}, f, ensure_ascii=False)
    with open(os.path.join(dst, "merges.txt"), "w", encoding="utf-8") as f:
        f.write(header + "\n" + "\n".join(merges) + "\n")
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    return len(keep)


def write_pipeline_folder(folder):
    if os.path.lexists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    vocab = small_clip_tokenizer(os.path.join(folder, "tokenizer"))
    torch.manual_seed(11)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu",
                                        projection_dim=16, bos_token_id=0, eos_token_id=2, pad_token_id=1))
    # config.json as transformers saves it, the weights in the hub's names (text_model.*, as FLUX.1-dev's
    # text_encoder/model.safetensors has them; transformers 5 would save them without the prefix)
    te = os.path.join(folder, "text_encoder")
    clip.config.architectures = ["CLIPTextModel"]
    clip.config.save_pretrained(te)
    safetensors.torch.save_file({(k if k.startswith("text_model.") else "text_model." + k): v.to(torch.bfloat16)
                                 .contiguous() for k, v in clip.state_dict().items()},
                                os.path.join(te, "model.safetensors"), metadata={"format": "pt"})
    t5tok = T5TokenizerFast.from_pretrained(os.path.join("tests", "data", "tokenizer", "t5_small", "json"))
    torch.manual_seed(12)
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5tok), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                 feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_encoder_decoder=False,
                                 use_cache=False, pad_token_id=0, eos_token_id=1, tie_word_embeddings=False))
    t5.to(torch.bfloat16).save_pretrained(os.path.join(folder, "text_encoder_2"))
    sched = FlowMatchEulerDiscreteScheduler(**DEV)
    sched.save_pretrained(os.path.join(folder, "scheduler"))
    os.symlink(os.path.join("..", "..", "tokenizer", "t5_small", "json"), os.path.join(folder, "tokenizer_2"))
    os.symlink(os.path.join("..", "..", "flux", "transformer"), os.path.join(folder, "transformer"))
    os.symlink(os.path.join("..", "..", "flux", "vae"), os.path.join(folder, "vae"))
    index = {"_class_name": "FluxPipeline", "_diffusers_version": diffusers.__version__,
             "feature_extractor": [None, None], "image_encoder": [None, None],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def ldm_vae_key(k, levels):
    """a diffusers AutoencoderKL key in the LDM names Black Forest Labs' ae.safetensors uses (no prefix)"""
    import re
    resnet = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2", "conv_shortcut": "nin_shortcut"}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    m = re.match(r"^(encoder|decoder)\.(conv_in|conv_out)\.(weight|bias)$", k)
    if m:
        return k
    m = re.match(r"^(encoder|decoder)\.conv_norm_out\.(weight|bias)$", k)
    if m:
        return "%s.norm_out.%s" % m.groups()
    m = re.match(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.(weight|bias)$", k)
    if m:
        return "encoder.down.%s.block.%s.%s.%s" % (m[1], m[2], resnet[m[3]], m[4])
    m = re.match(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(weight|bias)$", k)
    if m:
        return "encoder.down.%s.downsample.conv.%s" % m.groups()
    m = re.match(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.(weight|bias)$", k)
    if m:
        return "decoder.up.%d.block.%s.%s.%s" % (levels - 1 - int(m[1]), m[2], resnet[m[3]], m[4])
    m = re.match(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(weight|bias)$", k)
    if m:
        return "decoder.up.%d.upsample.conv.%s" % (levels - 1 - int(m[1]), m[2])
    m = re.match(r"^(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(\w+)\.(weight|bias)$", k)
    if m:
        return "%s.mid.block_%d.%s.%s" % (m[1], int(m[2]) + 1, resnet[m[3]], m[4])
    m = re.match(r"^(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(weight|bias)$", k)
    if m:
        return "%s.mid.attn_1.%s.%s" % (m[1], attn[m[2]], m[3])
    raise KeyError(k)


def write_ldm_vae(path):
    """the tiny Flux VAE in Black Forest Labs' (LDM) names, the attention's Linears as 1x1 convs; checked:
    diffusers' own convert_ldm_vae_checkpoint maps it back to the diffusers weights bitwise"""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    vdir = os.path.join("tests", "data", "flux", "vae")
    sd = safetensors.torch.load_file(os.path.join(vdir, "diffusion_pytorch_model.safetensors"))
    config = json.load(open(os.path.join(vdir, "config.json")))
    levels = len(config["block_out_channels"])
    ldm = {}
    for k, v in sd.items():
        lk = ldm_vae_key(k, levels)
        ldm[lk] = v.reshape(*v.shape, 1, 1) if ".mid.attn_1." in lk and lk.endswith("weight") and v.dim() == 2 else v
    back = convert_ldm_vae_checkpoint(dict(ldm), config)
    assert set(back) == set(sd), sorted(set(back) ^ set(sd))[:5]
    for k in sd:
        assert torch.equal(back[k].reshape(sd[k].shape), sd[k]) and back[k].dtype == sd[k].dtype, k
    safetensors.torch.save_file({k: v.contiguous() for k, v in ldm.items()}, path)


def pipeline_refs(folder):
    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    assert pipe.vae_scale_factor == 2
    prompt = "a red fox sitting in the snow, photo"
    W, H, STEPS, GUIDANCE, T5LEN = 32, 24, 4, 3.5, 32
    h, w = 2 * (H // (pipe.vae_scale_factor * 2)), 2 * (W // (pipe.vae_scale_factor * 2))
    g = torch.Generator().manual_seed(5)
    init = torch.randn(1, 16, h, w, generator=g)
    packed = FluxPipeline._pack_latents(init, 1, 16, h, w)
    steps = []

    def grab(p, i, t, kw):
        steps.append(FluxPipeline._unpack_latents(kw["latents"], H, W, p.vae_scale_factor)[0].clone())
        return {}

    with torch.no_grad():
        pe, pooled, _ = pipe.encode_prompt(prompt, prompt_2=None, max_sequence_length=T5LEN)
        lat = pipe(prompt, height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                   max_sequence_length=T5LEN, latents=packed.clone(), output_type="latent",
                   callback_on_step_end=grab, callback_on_step_end_tensor_inputs=["latents"]).images
        timesteps = pipe.scheduler.timesteps.clone()
        un = FluxPipeline._unpack_latents(lat, H, W, pipe.vae_scale_factor)
        raw = pipe.vae.decode(un / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor).sample
        img = pipe(prompt, height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                   max_sequence_length=T5LEN, latents=packed.clone(), output_type="pt",
                   callback_on_step_end=grab, callback_on_step_end_tensor_inputs=["latents"]).images
    assert len(steps) == 2 * STEPS  # the callback ran in both calls
    out = {"init_latents": init[0], "prompt_embeds": pe, "pooled_prompt_embeds": pooled, "timesteps": timesteps,
           "image_raw": raw[0], "image": img[0]}
    for i in range(STEPS):
        assert torch.equal(steps[i], steps[STEPS + i])
    for i in (0, STEPS - 1):
        out["latents_step%d" % (i + 1)] = steps[i]
    meta = {"prompt": prompt, "width": str(W), "height": str(H), "steps": str(STEPS), "guidance_scale": str(GUIDANCE),
            "max_sequence_length": str(T5LEN)}
    return {k_: f32(v) for k_, v in out.items()}, meta


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_flow_ref.py SD_SCRIPTS_DIR (a checkout of kohya-ss/sd-scripts at %s)" % KOHYA_COMMIT)
    root = sys.argv[1]
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    commit = commit or "(not a git checkout; read as %s)" % KOHYA_COMMIT
    os.makedirs(OUT, exist_ok=True)
    k = kohya_functions(root)
    obj, cases = objective_refs(k)
    safetensors.torch.save_file(obj, os.path.join(OUT, "objective.safetensors"),
                                metadata={"cases": json.dumps(cases, sort_keys=True)})
    sch, scases = schedule_refs()
    safetensors.torch.save_file(sch, os.path.join(OUT, "schedule.safetensors"),
                                metadata={"cases": json.dumps(scases, sort_keys=True)})
    write_ldm_vae(os.path.join(OUT, "ae_ldm.safetensors"))
    folder = os.path.join(OUT, "pipeline")
    write_pipeline_folder(folder)
    ref, meta = pipeline_refs(folder)
    safetensors.torch.save_file(ref, os.path.join(OUT, "pipeline.safetensors"), metadata=meta)
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_flow_ref.py with\n")
        f.write("python %s\n" % sys.version.split()[0])
        for m in (torch, diffusers, transformers, np, safetensors):
            f.write("%s %s\n" % (m.__name__, m.__version__))
        f.write("kohya-ss/sd-scripts %s (library/flux_train_utils.py, library/sd3_train_utils.py)\n" % commit)
    for dirpath, _, files in os.walk(OUT):
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


if __name__ == "__main__":
    main()
