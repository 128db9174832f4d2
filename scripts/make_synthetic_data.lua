-- Writes a synthetic dataset to disk in the format train_sdxl_lora.lua reads:
-- one .safetensors file per sample with latents, prompt_embeds,
-- pooled_prompt_embeds and time_ids (the same samples as --data synthetic).
--
--   ckrun scripts/make_synthetic_data.lua DIR N [--size tiny|full] [--resolution PX] [--seed S]
--   ckrun scripts/make_synthetic_data.lua --help
local ck = require "ck"
local unet = require "ck.unet"
local data = require "ck.data"
local options = require "ck.options"

local o = options.parse(args, {
  about = "Writes N synthetic samples (those of --data synthetic) to DIR, one .safetensors file each.",
  {"dir", "string", nil, "the folder to write", pos = 1, arg = "DIR", required = true},
  {"n", "integer", nil, "the number of samples", pos = 2, arg = "N", min = 1, required = true},
  {"size", "choice", "tiny", "the samples of sdxl-tiny or of the real SDXL UNet", choices = {"tiny", "full"}},
  {"resolution", "integer", function(v) return v.size == "full" and 1024 or 256 end,
   "pixels per side (latents are 1/8 of it)", arg = "PX", min = 8, shown = "1024 with --size full, else 256"},
  {"seed", "integer", 1, "the seed of the samples", min = 0},
})
if not o then return end
local dir, n, size = o.dir, o.n, o.size
local config = unet.config(size == "full" and "sdxl" or "sdxl-tiny")
local latent = o.resolution // 8
local opts = {seed = o.seed, height = latent, width = latent, cross_attention_dim = config.cross_attention_dim,
              pooled_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim}
assert(ck.mkdir(dir))
for i = 1, n do
  local s = data.synthetic_sample(i, opts)
  local tensors = {}
  for _, f in ipairs(data.FIELDS) do tensors[#tensors + 1] = {f, s[f][1], s[f][2]} end
  ck.write_safetensors(string.format("%s/%06d.safetensors", dir, i), tensors,
    {source = "ckrun synthetic", seed = tostring(opts.seed)})
end
print(string.format("wrote %d samples to %s", n, dir))
