"""Reference data for tests/lua/test_scheduler_config.lua, made with diffusers' schedulers.

Writes tests/data/samplers/configs.json: "cases", each a diffusers folder's scheduler_config.json (as
diffusers saves one: every field of its class), the ckrun sampler run with it, the steps, and what diffusers'
scheduler of that sampler, built with from_config(config) as a user swapping schedulers does (Karras sigmas
by the sampler's name), gives after set_timesteps(steps): timesteps, sigmas (DDIM: none), init_noise_sigma;
"default_sampler": the sampler the config's own class stands for. VERSIONS.txt gains the versions.

Run: /work/venv-ref/bin/python tests/ref/make_scheduler_config_ref.py (from the repository root)
"""
import json
import os

import diffusers
import torch
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "samplers")
CLASSES = {"euler": EulerDiscreteScheduler, "euler_a": EulerAncestralDiscreteScheduler, "ddim": DDIMScheduler,
           "dpmpp_2m": DPMSolverMultistepScheduler, "dpmpp_2m_karras": DPMSolverMultistepScheduler}


def saved_config(cls, **kw):
    """the scheduler_config.json diffusers writes for cls(**kw)"""
    s = cls(**kw)
    c = dict(s.config)
    c["_class_name"] = cls.__name__
    c["_diffusers_version"] = diffusers.__version__
    return {k: v for k, v in c.items() if not (isinstance(v, float) and v in (float("inf"), float("-inf")))}


def run(config, sampler, steps):
    cls = CLASSES[sampler]
    extra = {}
    if cls is DPMSolverMultistepScheduler:
        extra["use_karras_sigmas"] = sampler == "dpmpp_2m_karras"
    s = cls.from_config(config, **extra)
    s.set_timesteps(steps)
    out = {"timesteps": [float(t) for t in s.timesteps]}
    if hasattr(s, "sigmas") and sampler != "ddim":
        out["sigmas"] = [float(x) for x in s.sigmas]
    out["init_noise_sigma"] = float(s.init_noise_sigma)
    return out


def main():
    sdxl = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                timestep_spacing="leading", num_train_timesteps=1000)
    configs = {
        "sdxl_euler": (saved_config(EulerDiscreteScheduler, **sdxl), "euler"),
        "v_trailing": (saved_config(EulerDiscreteScheduler, beta_start=0.00085, beta_end=0.012,
                                    beta_schedule="scaled_linear", steps_offset=0, timestep_spacing="trailing",
                                    prediction_type="v_prediction"), "euler"),
        "ddim_linear_500": (saved_config(DDIMScheduler, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                                         num_train_timesteps=500, steps_offset=0, timestep_spacing="linspace",
                                         set_alpha_to_one=True, clip_sample=False), "ddim"),
        "dpm_karras": (saved_config(DPMSolverMultistepScheduler, use_karras_sigmas=True, **sdxl), "dpmpp_2m_karras"),
        "euler_a_offset": (saved_config(EulerAncestralDiscreteScheduler, beta_start=0.001, beta_end=0.015,
                                        beta_schedule="scaled_linear", steps_offset=3, timestep_spacing="leading"),
                           "euler_a"),
    }
    cases = []
    for name, (config, default) in configs.items():
        for sampler in ("euler", "euler_a", "ddim", "dpmpp_2m", "dpmpp_2m_karras"):
            for steps in (5, 12):
                cases.append(dict(name=name, config=config, default_sampler=default, sampler=sampler, steps=steps,
                                  **run(config, sampler, steps)))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "configs.json"), "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    with open(os.path.join(OUT, "VERSIONS.txt"), "a") as f:
        f.write("configs.json: made by tests/ref/make_scheduler_config_ref.py (diffusers %s, torch %s)\n"
                % (diffusers.__version__, torch.__version__))


if __name__ == "__main__":
    main()
