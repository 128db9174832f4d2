-- Files of the SDXL job: a diffusers-named state dict of sdxl-tiny round-trips
-- through safetensors; loading names a missing or misshaped key; a LoRA adapter
-- saves in kohya's naming (names, shapes, alpha, ss_* and modelspec metadata)
-- and in PEFT's, and loads back equal to what was saved.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"

-- a fresh directory under the working directory, which the sandbox lets scripts write
local tmp = string.format("out/test_sdxl_files.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function path(name) return tmp .. "/" .. name end

-- a tiny UNet at 16x16 with LoRA on the defaults; returns graph, program, adapter, output
local function build(seed, frozen, alpha)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  local h = lora.attach(model, {rank = 4, alpha = alpha or 2})
  local g = ck.graph()
  local _, y, x = unet.build(g, model, {batch = 1, height = 16, width = 16, frozen = frozen})
  local p = g:compile{outputs = {y}, seed = seed}
  p:set(x.sample, 0.3); p:set(x.timesteps, {500}); p:set(x.encoder_hidden_states, 0.1)
  p:set(x.text_embeds, 0.2); p:set(x.time_ids, {256, 256, 0, 0, 256, 256})
  return g, p, h, y
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

do -- the base state dict round-trips: save from one init, load into another, identical outputs
  local g1, p1, _, y1 = build(1, true)
  local entries, map = {}, {}
  for _, t in ipairs(g1:params()) do
    if t.kind == "frozen" then
      entries[#entries + 1] = {t.name, t.name}
      map[t.name] = t.name
    end
  end
  p1:save(path("unet.safetensors"), entries)
  local f <close> = ck.safetensors(path("unet.safetensors"))
  T.ok(#f:keys() == 620, string.format("the state dict holds 620 diffusers keys (%d)", #f:keys()))
  T.ok(f:has("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight")
    and table.concat(f:shape("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"), ",") == "64,64",
    "attn2.to_k.weight is stored under its diffusers key with shape [64, 64]")
  local g2, p2, _, y2 = build(2, true)
  p1:forward(); p2:forward()
  T.ok(not same(p1:get(y1), p2:get(y2)), "two seeds give different models")
  p2:load(f, map)
  p2:forward()
  T.ok(same(p1:get(y1), p2:get(y2)), "after loading the state dict the outputs are bitwise equal")
  local ok, err = pcall(p2.load, p2, f, {["conv_in.weight"] = "conv_in.bias"})
  T.ok(not ok and err:find("tensor 'conv_in.bias' has shape %[32%], expected %[32, 4, 3, 3%]"),
    "a misshaped key is an error naming it: " .. tostring(err))
  ok, err = pcall(p2.load, p2, f, {["conv_in.weight"] = "conv_in.weights"})
  T.ok(not ok and err:find("missing tensor 'conv_in.weights'", 1, true), "a missing key is an error naming it: " .. tostring(err))
end

do -- LoRA in kohya's naming
  local g, p, h = build(3, true)
  for _, ad in ipairs(h.adapters) do p:set(ad.up, 0.01) end -- non-zero, so reload is a real check
  lora.save(p, h, path("kohya.safetensors"), {metadata = {ss_max_train_steps = "10"}})
  local f <close> = ck.safetensors(path("kohya.safetensors"))
  local base = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"
  T.ok(f:has(base .. ".lora_down.weight") and f:has(base .. ".lora_up.weight") and f:has(base .. ".alpha"),
    "kohya keys for input_blocks.4.1...attn1.to_q: lora_down, lora_up, alpha")
  T.ok(table.concat(f:shape(base .. ".lora_down.weight"), ",") == "4,64"
    and table.concat(f:shape(base .. ".lora_up.weight"), ",") == "64,4"
    and #f:shape(base .. ".alpha") == 0 and f:read(base .. ".alpha")[1] == 2,
    "lora_down [4, 64], lora_up [64, 4], alpha a scalar 2")
  T.ok(#f:keys() == 3 * #h.adapters, string.format("three tensors per adapted module (%d keys)", #f:keys()))
  local m = f:metadata()
  T.ok(m.ss_network_module == "networks.lora" and m.ss_network_dim == "4" and m.ss_network_alpha == "2"
    and m.ss_base_model_version == "sdxl_base_v1-0" and m["modelspec.sai_model_spec"] == "1.0.0"
    and m["modelspec.architecture"] == "stable-diffusion-xl-v1-base/lora" and m.ss_max_train_steps == "10",
    "ss_* and modelspec.* metadata")
  T.ok(f:has("lora_unet_middle_block_1_transformer_blocks_0_attn2_to_out_0.lora_up.weight"),
    "mid block attention maps to middle_block_1")
  -- reload into a fresh program
  local g2, p2, h2 = build(4, true)
  T.ok(lora.load(p2, h2, path("kohya.safetensors")) == "kohya", "the kohya file loads back")
  local equal = true
  for i, ad in ipairs(h.adapters) do
    equal = equal and same(p:get(ad.down), p2:get(h2.adapters[i].down)) and same(p:get(ad.up), p2:get(h2.adapters[i].up))
  end
  T.ok(equal, "every reloaded lora_down and lora_up equals the saved one")
  local _, p3, h3 = build(5, true, 8)
  local ok, err = pcall(lora.load, p3, h3, path("kohya.safetensors"))
  T.ok(not ok and tostring(err):find("alpha"), "loading into an adapter with another alpha is refused: " .. tostring(err))
end

do -- LoRA in PEFT naming, and half precision
  local _, p, h = build(6, true)
  for _, ad in ipairs(h.adapters) do p:set(ad.up, 0.25) end
  lora.save(p, h, path("peft.safetensors"), {format = "peft", dtype = "BF16"})
  local f <close> = ck.safetensors(path("peft.safetensors"))
  local name = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"
  T.ok(f:has(name .. ".lora_A.weight") and f:has(name .. ".lora_B.weight") and #f:keys() == 2 * #h.adapters
    and f:dtype(name .. ".lora_A.weight") == "BF16",
    "PEFT keys unet.<module>.lora_A/lora_B, no alpha tensors, BF16")
  local _, p2, h2 = build(7, true)
  T.ok(lora.load(p2, h2, path("peft.safetensors")) == "peft", "the PEFT file loads back")
  T.ok(same(p2:get(h2.adapters[1].up), p:get(h.adapters[1].up)), "lora_B values survive BF16 (0.25 is exact)")
end

for _, name in ipairs(ck.listdir(tmp)) do os.remove(path(name)) end
os.remove(tmp)
T.done()
