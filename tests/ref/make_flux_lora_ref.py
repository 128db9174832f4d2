"""Reference outputs for tests/lua/test_flux_lora.lua: the two Flux LoRA files ckrun wrote for flux-tiny
(tests/data/flux_lora/kohya.safetensors in kohya's layout, peft.safetensors in diffusers' layout; written by
`build/ckrun tests/ref/make_flux_lora_files.lua`, deterministic from a seed) loaded by diffusers' FluxPipeline and
by ComfyUI's key mapping into the flux-tiny reference transformer (tests/data/flux, made by make_flux_ref.py).

Run from the repository root, after make_flux_lora_files.lua:  /work/venv-ref/bin/python tests/ref/make_flux_lora_ref.py
(any Python with the versions in tests/data/flux_lora/VERSIONS.txt). Writes tests/data/flux_lora/:
  ref.safetensors  float32 [2, 6, 64] transformer outputs on the inputs of tests/data/flux/ref.safetensors:
    base             without an adapter
    diffusers_kohya  FluxPipeline.load_lora_weights(kohya.safetensors), set_adapters(weight 0.7): diffusers'
                     _convert_kohya_flux_lora_to_diffusers splits img_attn.qkv, txt_attn.qkv and linear1 into
                     the diffusers modules (the shared lora_down copied to each, lora_up cut by rows) and folds
                     alpha / rank into the weights. Its split widths for linear1 are hard-coded to FLUX.1's
                     (3072, 3072, 3072, 12288): this script runs the function's own text with that one list set
                     to flux-tiny's widths, the only change
    diffusers_kohya_1  the same at weight 1.0
    diffusers_peft   FluxPipeline.load_lora_weights(peft.safetensors), set_adapters(weight 0.7): the LoraConfig
                     from the file's lora_adapter_metadata (alpha / r = 0.5)
    comfyui_kohya    ComfyUI's reading of kohya.safetensors (comfy/lora.py model_lora_keys_unet and load_lora,
                     comfy/weight_adapter/lora.py), written out here: every key of the model's state dict
                     "diffusion_model.<BFL key>.weight" answers to "lora_unet_<BFL key, dots as underscores>";
                     the file's NAME.lora_up.weight, NAME.lora_down.weight and NAME.alpha patch it by
                     strength 0.7 * alpha / rank * up @ down; every key of the file must be taken (ComfyUI only
                     warns "lora key not loaded"). The patched BFL weights (tests/data/flux/bfl.safetensors, the
                     reference weights in BFL's fused layout) are mapped to diffusers' names by diffusers' own
                     convert_flux_transformer_checkpoint_to_diffusers (inner_dim set to flux-tiny's, as
                     make_flux_ref.py does) and run in FluxTransformer2DModel
  VERSIONS.txt     the package versions that made ref.safetensors
The script checks that the three loadings agree to fp32 rounding and that the adapter changes the output.
Python is never run by ctest; these files are committed.
"""
import inspect
import os
import sys

import diffusers
import numpy
import peft
import safetensors
import safetensors.torch
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from diffusers.loaders import lora_conversion_utils, lora_pipeline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_flux_ref import TINY, diffusers_conversion  # noqa: E402

REF = os.path.join("tests", "data", "flux")
OUT = os.path.join("tests", "data", "flux_lora")
STRENGTH = 0.7
INNER = TINY["num_attention_heads"] * TINY["attention_head_dim"]


def kohya_conversion():
    """diffusers' _convert_kohya_flux_lora_to_diffusers with linear1's split widths (hard-coded to FLUX.1's
    3072-wide model) set to flux-tiny's: the function's own text, that one list changed"""
    src = inspect.getsource(lora_conversion_utils._convert_kohya_flux_lora_to_diffusers)
    flux1 = "dims=[3072, 3072, 3072, 12288]"
    assert src.count(flux1) == 1
    ns = dict(vars(lora_conversion_utils))
    exec(src.replace(flux1, "dims=[%d, %d, %d, %d]" % (INNER, INNER, INNER, 4 * INNER)), ns)
    return ns["_convert_kohya_flux_lora_to_diffusers"]


def inputs():
    f = safetensors.torch.load_file(os.path.join(REF, "ref.safetensors"))
    return {k: f[k] for k in ("packed", "encoder_hidden_states", "pooled_projections", "timestep", "guidance",
                              "img_ids", "txt_ids")}


def run(model, x):
    with torch.no_grad():
        return model(hidden_states=x["packed"], encoder_hidden_states=x["encoder_hidden_states"],
                     pooled_projections=x["pooled_projections"], timestep=x["timestep"], img_ids=x["img_ids"],
                     txt_ids=x["txt_ids"], guidance=x["guidance"], return_dict=False)[0]


def transformer():
    return FluxTransformer2DModel.from_pretrained(os.path.join(REF, "transformer")).float().eval()


def pipeline():
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer())


def diffusers_outputs(x):
    lora_pipeline._convert_kohya_flux_lora_to_diffusers = kohya_conversion()
    out = {}
    for name, weight in (("kohya", STRENGTH), ("kohya_1", 1.0), ("peft", STRENGTH)):
        pipe = pipeline()
        pipe.load_lora_weights(os.path.join(OUT, name.split("_")[0] + ".safetensors"), adapter_name=name)
        pipe.set_adapters([name], adapter_weights=[weight])
        n = sum(1 for k, _ in pipe.transformer.named_parameters() if "lora_A" in k)
        print("diffusers %s: %d modules with lora_A, weight %g" % (name, n, weight))
        assert n == 2 * 14 + 2 * 6, "every diffusers module of kohya's targets adapted"
        out["diffusers_" + name] = run(pipe.transformer, x)
    return out


def comfyui_output(x):
    """comfy/lora.py's key map and load_lora (its regular lora branch), then the patch of
    comfy/weight_adapter/lora.py calculate_weight, on the BFL weights"""
    bfl = {"diffusion_model." + k: v.float() for k, v in
           safetensors.torch.load_file(os.path.join(REF, "bfl.safetensors")).items()}
    key_map = {}
    for k in bfl:  # model_lora_keys_unet: every weight of the model
        if k.startswith("diffusion_model.") and k.endswith(".weight"):
            key_map["lora_unet_" + k[len("diffusion_model."):-len(".weight")].replace(".", "_")] = k
    lora = safetensors.torch.load_file(os.path.join(OUT, "kohya.safetensors"))
    patches, loaded = {}, set()
    for name, to in key_map.items():  # load_lora
        alpha = lora[name + ".alpha"].item() if name + ".alpha" in lora else None
        if alpha is not None:
            loaded.add(name + ".alpha")
        if name + ".lora_up.weight" in lora:
            patches[to] = (lora[name + ".lora_up.weight"], lora[name + ".lora_down.weight"], alpha)
            loaded.update((name + ".lora_up.weight", name + ".lora_down.weight"))
    assert loaded == set(lora), "keys ComfyUI would not load: %s" % sorted(set(lora) - loaded)
    for to, (up, down, alpha) in patches.items():  # calculate_weight
        scale = alpha / down.shape[0] if alpha is not None else 1.0
        bfl[to] = bfl[to] + (STRENGTH * scale) * torch.mm(up.flatten(start_dim=1), down.flatten(start_dim=1)).reshape(
            bfl[to].shape)
    print("ComfyUI: %d of the file's %d modules patched" % (len(patches), len(lora) // 3))
    model = transformer()
    model.load_state_dict(diffusers_conversion(INNER)({k[len("diffusion_model."):]: v for k, v in bfl.items()}))
    return run(model, x)


def main():
    x = inputs()
    ref = {"base": run(transformer(), x)}
    ref.update(diffusers_outputs(x))
    ref["comfyui_kohya"] = comfyui_output(x)

    def rel(a, b):
        return ((ref[a] - ref[b]).abs().max() / ref[b].abs().max()).item()
    for k in ("diffusers_peft", "comfyui_kohya"):
        print("%s vs diffusers_kohya: %.3g" % (k, rel(k, "diffusers_kohya")))
        assert rel(k, "diffusers_kohya") < 1e-5
    print("adapter vs base: %.3g; weight 1.0 vs 0.7: %.3g" % (rel("diffusers_kohya", "base"),
                                                              rel("diffusers_kohya_1", "diffusers_kohya")))
    assert rel("diffusers_kohya", "base") > 1e-2 and rel("diffusers_kohya_1", "diffusers_kohya") > 1e-2
    safetensors.torch.save_file({k: v.float().contiguous() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("ref.safetensors made by tests/ref/make_flux_lora_ref.py with\n")
        f.write("torch %s\ndiffusers %s\npeft %s\nsafetensors %s\nnumpy %s\n" % (
            torch.__version__, diffusers.__version__, peft.__version__, safetensors.__version__, numpy.__version__))


if __name__ == "__main__":
    main()
