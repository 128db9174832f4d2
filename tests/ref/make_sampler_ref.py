"""Reference data for tests/lua/test_samplers.lua, made with diffusers' schedulers.

Writes tests/data/samplers/:
  schedules.json   "cases": each case's sampler name, prediction ("eps" or "v") and config overrides (other
                   timestep spacings); "schedules": for each case and steps in {4, 20, 30} ("<case>/<N>"):
                   timesteps, sigmas (diffusers' own, with the final 0; DDIM has none), init_noise_sigma
  steps.safetensors  chains of scheduler.step on random float32 tensors of shape 1x4x8x8, for each sampler at
                   4 steps (every step) and at 30 steps (the first three): "<case>/<N>/sample" is the first
                   sample; "<case>/<N>/<k>/model_output", ".../scaled" (scale_model_input of the step's sample)
                   and ".../result" (step's prev_sample, the next step's sample), k = 1-based step index;
                   euler_a also ".../noise", the N(0,1) values its step added
  loop.safetensors  a whole 4-step Euler loop as the SDXL pipeline runs it, with a toy "model" and
                   classifier-free guidance: noise (the initial N(0,1) latents), result
  VERSIONS.txt     the package versions that made them

Each scheduler is built from the SDXL base scheduler config (as pipelines do with from_config), with the
overrides ckrun's sampler names stand for. Euler ancestral draws its noise with diffusers' randn_tensor(shape,
generator=...) inside step(); here that function is replaced in the scheduler's module by one returning the
saved noise, so that ckrun's test can pass the same values through its noise_fn.

Run: /work/venv-ref/bin/python tests/ref/make_sampler_ref.py (from the repository root)
"""
import json
import os

import diffusers
import numpy as np
import safetensors
import torch
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler)
from diffusers.schedulers import scheduling_euler_ancestral_discrete as euler_a_module
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "samplers")

SDXL = {
    "_class_name": "EulerDiscreteScheduler",
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}

SAMPLERS = {
    "euler": (EulerDiscreteScheduler, {}),
    "euler_a": (EulerAncestralDiscreteScheduler, {}),
    "ddim": (DDIMScheduler, {}),
    "dpmpp_2m": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2,
                                               "lower_order_final": True}),
    "dpmpp_2m_karras": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2,
                                                      "lower_order_final": True, "use_karras_sigmas": True}),
}
# case name -> (sampler, prediction, config overrides); STEPPED: the cases whose steps are saved too
CASES = {name: (name, "eps", {}) for name in SAMPLERS}
CASES.update({"euler_v": ("euler", "v", {}), "ddim_v": ("ddim", "v", {}), "dpmpp_2m_v": ("dpmpp_2m", "v", {})})
STEPPED = list(CASES)
for name in ("euler", "euler_a", "ddim", "dpmpp_2m"):
    for spacing in ("linspace", "trailing"):
        CASES[f"{name}_{spacing}"] = (name, "eps", {"timestep_spacing": spacing})
SHAPE = (1, 4, 8, 8)


def make(sampler, prediction, options=None):
    cls, over = SAMPLERS[sampler]
    cfg = dict(over)
    cfg.update(options or {})
    cfg["prediction_type"] = "epsilon" if prediction == "eps" else "v_prediction"
    return cls.from_config(SDXL, **cfg)


def number(x):
    return float(x.item() if hasattr(x, "item") else x)


class SavedNoise:
    """Stands in for randn_tensor in the Euler ancestral module: hands out the queued tensors in order."""

    def __init__(self):
        self.queue = []

    def __call__(self, shape, generator=None, device=None, dtype=None, layout=None):
        n = self.queue.pop(0)
        assert tuple(n.shape) == tuple(shape)
        return n.to(dtype=dtype)


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20261201)
    saved_noise = SavedNoise()
    euler_a_module.randn_tensor = saved_noise

    schedules = {}
    for case, (sampler, prediction, options) in CASES.items():
        for n in (4, 20, 30):
            s = make(sampler, prediction, options)
            s.set_timesteps(n)
            ts = s.timesteps
            entry = {
                "timesteps": [int(t) for t in ts.tolist()] if ts.dtype == torch.int64 else [float(t) for t in ts.tolist()],
                "timesteps_dtype": str(ts.dtype).replace("torch.", ""),
                "init_noise_sigma": number(s.init_noise_sigma),
            }
            if sampler != "ddim":
                entry["sigmas"] = [float(x) for x in s.sigmas.tolist()]
            schedules[f"{case}/{n}"] = entry

    tensors = {}
    for case in STEPPED:
        sampler, prediction, _ = CASES[case]
        for n, count in ((4, 4), (30, 3)):
            s = make(sampler, prediction)
            s.set_timesteps(n)
            x = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
            tensors[f"{case}/{n}/sample"] = x.clone()
            for k in range(1, count + 1):
                t = s.timesteps[k - 1]
                scaled = s.scale_model_input(x, t)
                out = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
                if sampler == "euler_a":
                    noise = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
                    saved_noise.queue.append(noise)
                    tensors[f"{case}/{n}/{k}/noise"] = noise.clone()
                x = s.step(out, t, x).prev_sample
                assert not saved_noise.queue
                tensors[f"{case}/{n}/{k}/model_output"] = out.clone()
                tensors[f"{case}/{n}/{k}/scaled"] = scaled.clone()
                tensors[f"{case}/{n}/{k}/result"] = x.clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "steps.safetensors"))

    # a 4-step Euler loop as StableDiffusionXLPipeline runs it: latents = randn * init_noise_sigma; each step
    # scales the input, runs the model on the unconditional and conditional halves and guides with scale 5
    s = make("euler", "eps")
    s.set_timesteps(4)
    noise = torch.randn(SHAPE, generator=gen, dtype=torch.float32)
    x = noise * s.init_noise_sigma
    for t in s.timesteps:
        xin = s.scale_model_input(x, t)
        uncond, cond = 0.1 * xin + 0.05, 0.2 * xin - 0.03
        guided = uncond + 5.0 * (cond - uncond)
        x = s.step(guided, t, x).prev_sample
    save_file({"noise": noise, "result": x.contiguous()}, os.path.join(OUT, "loop.safetensors"))

    with open(os.path.join(OUT, "schedules.json"), "w") as f:
        cases = {case: {"sampler": c[0], "prediction": c[1], "options": c[2], "steps_saved": case in STEPPED}
                 for case, c in CASES.items()}
        json.dump({"cases": cases, "schedules": schedules}, f, indent=None, separators=(",", ":"), sort_keys=True)
        f.write("\n")
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"diffusers {diffusers.__version__}\ntorch {torch.__version__}\nnumpy {np.__version__}\n"
                f"safetensors {safetensors.__version__}\n"
                "made by tests/ref/make_sampler_ref.py\n")


if __name__ == "__main__":
    main()
