-- Writes samples of sdxl-tiny at two latent shapes to DIR: 3 at 8x8 and 2 at
-- 4x8 (64x64 and 64x32 pixels, width x height), interleaved, for the bucket tests.
--   ckrun tests/scripts/make_bucket_data.lua DIR
local ck = require "ck"
local data = require "ck.data"
local dir = assert(args[1], "usage: make_bucket_data.lua DIR")
assert(ck.mkdir(dir))
local shapes = {{8, 8}, {4, 8}, {8, 8}, {4, 8}, {8, 8}}
for i, hw in ipairs(shapes) do
  local s = data.synthetic_sample(i, {seed = 2, height = hw[1], width = hw[2], cross_attention_dim = 64, pooled_dim = 64})
  local tensors = {}
  for _, f in ipairs(data.FIELDS) do tensors[#tensors + 1] = {f, s[f][1], s[f][2]} end
  ck.write_safetensors(string.format("%s/%06d.safetensors", dir, i), tensors)
end
