-- Train a LoRA adapter on a Flux.1 transformer with flow matching (kohya's
-- --timestep-sampling, --model-prediction-type, --guidance-scale, ...) on
-- cached latents, T5 states and CLIP-L pooled vectors; write it as
-- .safetensors in kohya's naming (what ComfyUI, Forge and diffusers load) or
-- diffusers/PEFT naming. The loop, plan mode, data parallel, buckets, resume,
-- samples and the options every family shares are ck.train's; what is Flux's
-- (the transformer, its weights, T5, CLIP-L and the VAE, the objective, the
-- adapter's names and the sampler) is the family's, ck.family.flux.
--
--   ckrun scripts/train_flux_lora.lua                       flux-tiny, synthetic data
--   ckrun scripts/train_flux_lora.lua --pretrained-model-name-or-path flux1-dev.safetensors --ae ae.safetensors \
--       --clip-l clip_l.safetensors --t5xxl t5xxl_fp16.safetensors --tokenizer TOK --t5-tokenizer TOK2 --data DIR
--   ckrun --plan --json scripts/train_flux_lora.lua --size dev --mixed-precision bf16 --fp8-base
--
--   ckrun scripts/train_flux_lora.lua --help               the options
require("ck.train").run(args, {
  family = require "ck.family.flux",
  about = "Train LoRA adapters (or, with --full, every parameter) of a Flux.1 transformer on cached latents.",
})
