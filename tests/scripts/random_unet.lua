-- Writes a seeded random UNet in diffusers key names, as a base for --weights:
--   ckrun --allow-write DIR tests/scripts/random_unet.lua --config sdxl-mid --out DIR/unet.safetensors [--dtype F16]
-- Only a forward-only program's arena is allocated (the weights), and the file
-- is written tensor by tensor from it.
local ck = require "ck"
local unet = require "ck.unet"
local a = args or {}
local g = ck.graph()
local _, y = unet.build(g, a.config or "sdxl-tiny", {batch = 1, height = 8, width = 8})
local p = g:compile{outputs = {y}, seed = tonumber(a.seed) or 7}
local entries = {}
for _, t in ipairs(g:params()) do entries[#entries + 1] = {t.name, t.name} end
p:save(assert(a.out, "--out FILE"), entries, {dtype = a.dtype or "F16", metadata = {format = "pt"}})
print(string.format("wrote %s: %d tensors", a.out, #entries))
