-- Writes a synthetic dataset to disk in the format train_sdxl_lora.lua reads:
-- one .safetensors file per sample with latents, prompt_embeds,
-- pooled_prompt_embeds and time_ids (the same samples as --data synthetic).
--
--   ckrun scripts/make_synthetic_data.lua DIR N [--size tiny|full] [--resolution PX] [--seed S]
local ck = require "ck"
local unet = require "ck.unet"
local data = require "ck.data"

local a = args or {}
local dir, n = a[1], a[2]
if type(dir) ~= "string" or math.type(n) ~= "integer" or n < 1 then
  error("usage: ckrun scripts/make_synthetic_data.lua DIR N [--size tiny|full] [--resolution PX] [--seed S]")
end
local size = a.size or "tiny"
local config = unet.config(size == "full" and "sdxl" or "sdxl-tiny")
local latent = (a.resolution or (size == "full" and 1024 or 256)) // 8
local o = {seed = a.seed or 1, height = latent, width = latent, cross_attention_dim = config.cross_attention_dim,
           pooled_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim}
assert(ck.mkdir(dir))
for i = 1, n do
  local s = data.synthetic_sample(i, o)
  local tensors = {}
  for _, f in ipairs(data.FIELDS) do tensors[#tensors + 1] = {f, s[f][1], s[f][2]} end
  ck.write_safetensors(string.format("%s/%06d.safetensors", dir, i), tensors, {source = "ckrun synthetic", seed = tostring(o.seed)})
end
print(string.format("wrote %d samples to %s", n, dir))
