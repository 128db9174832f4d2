-- Train a LoRA adapter on an SDXL UNet with the diffusion objective on cached
-- latents and text embeddings; write it as .safetensors in kohya's naming (what
-- ComfyUI, A1111 and diffusers load) or diffusers/PEFT naming. With --full, train
-- every UNet parameter instead and write the UNet in diffusers key names, as
-- kohya's sdxl_train.py. The loop, plan mode, data parallel, buckets, resume,
-- samples and the options every family shares are ck.train's; what is SDXL's
-- (the UNet, its weights, the encoders, the objective, the adapter's names and
-- the sampler) is the family's, ck.family.sdxl, with its own options.
--
--   ckrun scripts/train_sdxl_lora.lua                      sdxl-tiny, synthetic data
--   ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors
--   ckrun --plan --json scripts/train_sdxl_lora.lua --size full
--   ckrun --device cuda scripts/train_sdxl_lora.lua ...   on the GPU (the default where one is present)
--
--   ckrun scripts/train_sdxl_lora.lua --help              the options
require("ck.train").run(args, {
  family = require "ck.family.sdxl",
  about = "Train LoRA adapters (or, with --full, every parameter) of an SDXL UNet on cached latents.",
})
