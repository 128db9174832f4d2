"""Reference files for tests/lua/test_vae.lua (ck.vae against diffusers' AutoencoderKL).

Run from the repository root:  /work/venv-ref/bin/python tests/ref/make_vae_ref.py
Writes tests/data/vae/:
  tiny.safetensors      a seeded random-weight AutoencoderKL in ck.vae's "tiny" config (fp16 on disk,
                        so the file stays small; the reference model runs on those same values in fp32)
  tiny_io.safetensors   sample [1,3,64,48], its encoder mean/logvar [1,4,8,6], a latent [1,4,8,6]
                        (already divided by scaling_factor) and the decoder's image for it [1,3,64,48],
                        plus noise [1,4,8,6] and the cached latents (mean + exp(0.5 logvar) noise) * scaling_factor
  sdxl_vae_keys.txt     every state_dict key of the full SDXL VAE with its shape
  VERSIONS.txt          the package versions that made these files
Python is never run by ctest; these files are committed.
"""
import os

import diffusers
import safetensors
import safetensors.torch
import torch
from diffusers import AutoencoderKL

OUT = os.path.join("tests", "data", "vae")

BLOCKS = 4
SDXL = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * BLOCKS,
    up_block_types=["UpDecoderBlock2D"] * BLOCKS,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=32,
    sample_size=1024,
    scaling_factor=0.13025,
)
# must equal ck.vae's "tiny" config (stdlib/ck/vae.lua)
TINY = dict(SDXL, block_out_channels=[16, 32, 32, 32], layers_per_block=1, norm_num_groups=8, sample_size=64)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(20261201)

    # the full SDXL VAE: names and shapes only
    full = AutoencoderKL(**SDXL)
    with open(os.path.join(OUT, "sdxl_vae_keys.txt"), "w") as f:
        for k, v in full.state_dict().items():
            f.write("%s [%s]\n" % (k, ",".join(str(d) for d in v.shape)))
    del full

    vae = AutoencoderKL(**TINY).eval()
    # default init leaves GroupNorm affine at 1/0: randomise them so a swapped
    # weight/bias or a norm that ignores them shows in the outputs
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
        # round to fp16 (the file's dtype) and run the reference on the rounded values
        for p in vae.parameters():
            p.copy_(p.half().float())
    sd = {k: v.half().contiguous() for k, v in vae.state_dict().items()}
    safetensors.torch.save_file(sd, os.path.join(OUT, "tiny.safetensors"))

    g = torch.Generator().manual_seed(7)
    sample = torch.rand(1, 3, 64, 48, generator=g) * 2 - 1
    latent = torch.randn(1, 4, 8, 6, generator=g) * 3
    noise = torch.randn(1, 4, 8, 6, generator=g)
    with torch.no_grad():
        dist = vae.encode(sample).latent_dist
        mean, logvar = dist.mean, dist.logvar
        image = vae.decode(latent).sample
        cached = (mean + torch.exp(0.5 * logvar) * noise) * vae.config.scaling_factor
    io = {
        "sample": sample,
        "mean": mean,
        "logvar": logvar,
        "latents": latent,
        "image": image,
        "noise": noise,
        "cached": cached,
    }
    safetensors.torch.save_file({k: v.float().contiguous() for k, v in io.items()},
                                os.path.join(OUT, "tiny_io.safetensors"))
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_vae_ref.py with\n")
        f.write("torch %s\ndiffusers %s\nsafetensors %s\n" % (torch.__version__, diffusers.__version__,
                                                             safetensors.__version__))
    n = sum(p.numel() for p in vae.parameters())
    print("tiny VAE: %d parameters; image |max| %.4g, mean |max| %.4g, logvar range [%.4g, %.4g]" % (
        n, image.abs().max(), mean.abs().max(), logvar.min(), logvar.max()))


if __name__ == "__main__":
    main()
