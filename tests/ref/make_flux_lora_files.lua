-- Writes the Flux LoRA files of tests/data/flux_lora (kohya.safetensors and
-- peft.safetensors: flux-tiny, kohya's targets, rank 4, alpha 2, seeded values)
-- that tests/ref/make_flux_lora_ref.py loads into diffusers and ComfyUI's key
-- mapping. Run from the repository root:  build/ckrun tests/ref/make_flux_lora_files.lua
-- test_flux_lora.lua writes them again and checks they come out byte for byte.
package.path = "tests/lua/?.lua;" .. package.path
local fx = require "flux_lora_fixture"
fx.write(fx.DIR)
print("wrote " .. fx.DIR .. "kohya.safetensors and " .. fx.DIR .. "peft.safetensors")
