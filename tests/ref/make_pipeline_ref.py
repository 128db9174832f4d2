"""Reference text-to-image run for tests/lua/test_generate.lua.

diffusers' StableDiffusionXLPipeline loads the tiny SDXL folder that
tests/ref/make_checkpoint_ref.py wrote (tests/data/checkpoint/sdxl_tiny), with
an EulerDiscreteScheduler from the SDXL base scheduler config, and makes one
64x32 image from given initial latents: a prompt and a negative prompt, 4
steps, guidance 5. A second run leaves the negative prompt out
(force_zeros_for_empty_prompt: zero embeddings for the unconditional half).

Writes tests/data/pipeline/pipeline.safetensors:
  init_latents         [1, 4, 4, 8] N(0, 1), before init_noise_sigma (what the
                       pipeline's latents= takes)
  prompt_embeds, negative_prompt_embeds, pooled_prompt_embeds,
  negative_pooled_prompt_embeds
  timesteps, sigmas
  latents_step{1..4}   the latents after each step
  image_raw            the VAE decoder's output [1, 3, 32, 64] (before
                       (x / 2 + 0.5).clamp(0, 1))
  image                the pipeline's output_type="pt" image, in [0, 1]
  image_zero_neg       the same without a negative prompt
and VERSIONS.txt.

Run: /work/venv-ref/bin/python tests/ref/make_pipeline_ref.py
"""
import os
import sys

import diffusers
import safetensors
import safetensors.torch as st
import torch
import transformers
from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "data", "checkpoint", "sdxl_tiny")
OUT = os.path.join(ROOT, "data", "pipeline")

PROMPT = "the photo of a cat"
NEGATIVE = "the blur"
WIDTH, HEIGHT, STEPS, GUIDANCE = 64, 32, 4, 5.0

# stabilityai/stable-diffusion-xl-base-1.0's scheduler_config.json
SDXL_SCHEDULER = dict(
    num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
    steps_offset=1, timestep_spacing="leading", prediction_type="epsilon", interpolation_type="linear",
    use_karras_sigmas=False,
)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    pipe = StableDiffusionXLPipeline.from_pretrained(FOLDER, variant="fp16", torch_dtype=torch.float32)
    pipe.scheduler = EulerDiscreteScheduler(**SDXL_SCHEDULER)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.force_zeros_for_empty_prompt

    g = torch.Generator().manual_seed(1234)
    init = torch.randn((1, 4, HEIGHT // 8, WIDTH // 8), generator=g, dtype=torch.float32)

    pe, npe, ppe, nppe = pipe.encode_prompt(PROMPT, device="cpu", num_images_per_prompt=1,
                                            do_classifier_free_guidance=True, negative_prompt=NEGATIVE)
    steps = {}

    def on_step(p, i, t, kw):
        steps["latents_step%d" % (i + 1)] = kw["latents"].detach().clone()
        return kw

    common = dict(prompt=PROMPT, width=WIDTH, height=HEIGHT, num_inference_steps=STEPS,
                  guidance_scale=GUIDANCE)
    with torch.no_grad():
        lat = pipe(negative_prompt=NEGATIVE, latents=init.clone(), output_type="latent",
                   callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["latents"], **common).images
        raw = pipe.vae.decode(lat / pipe.vae.config.scaling_factor).sample
        image = pipe(negative_prompt=NEGATIVE, latents=init.clone(), output_type="pt", **common).images
        zero = pipe(latents=init.clone(), output_type="pt", **common).images
    # the pipeline's own output is the decoded latents, mapped to [0, 1]
    assert torch.equal(image, (raw / 2 + 0.5).clamp(0, 1))

    t = {
        "init_latents": init,
        "prompt_embeds": pe, "negative_prompt_embeds": npe,
        "pooled_prompt_embeds": ppe, "negative_pooled_prompt_embeds": nppe,
        "timesteps": pipe.scheduler.timesteps.to(torch.float32),
        "sigmas": pipe.scheduler.sigmas.to(torch.float32),
        "image_raw": raw, "image": image, "image_zero_neg": zero,
    }
    t.update(steps)
    t = {k: v.detach().to(torch.float32).contiguous() for k, v in t.items()}
    st.save_file(t, os.path.join(OUT, "pipeline.safetensors"),
                 metadata={"prompt": PROMPT, "negative_prompt": NEGATIVE, "width": str(WIDTH),
                           "height": str(HEIGHT), "steps": str(STEPS), "guidance_scale": str(GUIDANCE)})
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_pipeline_ref.py with\n")
        f.write("torch %s\ndiffusers %s\ntransformers %s\nsafetensors %s\npython %s\n" % (
            torch.__version__, diffusers.__version__, transformers.__version__, safetensors.__version__,
            sys.version.split()[0]))


if __name__ == "__main__":
    main()
