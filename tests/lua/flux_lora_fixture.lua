-- The Flux LoRA adapter of tests/data/flux_lora: flux-tiny with kohya's targets
-- at rank 4, alpha 2, every factor set from a seeded generator (so that lora_up
-- is not zero and every module changes the output), and the graph it runs in:
-- the reference inputs of tests/data/flux/ref.safetensors. Shared by
-- test_flux_lora.lua and tests/ref/make_flux_lora_files.lua, which writes the
-- committed files.
local ck = require "ck"
local flux = require "ck.flux"
local flux_keys = require "ck.flux_keys"
local flux_lora = require "ck.flux_lora"
local T = require "check"

local M = {}

M.REF = "tests/data/flux/"
M.DIR = "tests/data/flux_lora/"
M.RANK, M.ALPHA, M.SEED = 4, 2, 30
-- the strength the reference loads both files at
M.STRENGTH = 0.7

-- flux-tiny on the reference inputs (batch 2, 4x6 latents packed, 5 text
-- tokens), frozen, loaded with the reference weights; attach(model) adapts
-- it before the forward. Returns {g, p, y, model, adapter (attach's result)}.
function M.graph(attach, opts)
  opts = opts or {}
  local g = ck.graph()
  local c = flux.config("flux-tiny")
  local model = flux.FluxTransformer2DModel(c)
  model:freeze()
  local adapter = attach and attach(model)
  local x = flux.inputs(g, c, {batch = 2, height = 4, width = 6, tokens = 5})
  local y = model:forward(g, x.hidden_states, x.encoder_hidden_states, x.pooled_projections, x.timestep, x.rope,
                          x.guidance)
  local p
  if opts.loss then
    local target = g:input("target", y.shape)
    p = g:compile{loss = ck.mse_loss(y, target), outputs = {y}, optimizer = "none", keep_grads = true}
    p:set(target, opts.loss)
  else
    p = g:compile{outputs = {y}, optimizer = "none"}
  end
  local f <close> = ck.safetensors(M.REF .. "ref.safetensors")
  p:set(x.hidden_states, f:read("packed"))
  for _, k in ipairs{"encoder_hidden_states", "pooled_projections", "timestep", "guidance"} do p:set(x[k], f:read(k)) end
  p:set(x.rope, flux.rope_values(c, 5, 4, 6))
  local base = {}
  for _, t in ipairs(g:params()) do if t.kind == "frozen" and not t.name:find("lora_", 1, true) then base[#base + 1] = t end end
  flux_keys.load(p, flux_keys.open(M.REF .. "transformer"), base)
  return {g = g, p = p, y = y, model = model, adapter = adapter, inputs = x}
end

-- the fixture's adapter values: each factor of each module in order, from one generator
function M.set_values(p, h)
  local r = T.rng(M.SEED)
  for _, ad in ipairs(h.adapters) do
    local d = T.random_values(r, ad.rank * ad.in_features, -0.5, 0.5)
    local u = T.random_values(r, ad.out_features * ad.rank, -0.3, 0.3)
    p:set(ad.down, d)
    p:set(ad.up, u)
  end
end

-- writes kohya.safetensors and peft.safetensors into dir
function M.write(dir)
  local r = M.graph(function(model) return flux_lora.attach(model, {rank = M.RANK, alpha = M.ALPHA}) end)
  M.set_values(r.p, r.adapter)
  flux_lora.save(r.p, r.adapter, dir .. "kohya.safetensors", {title = "flux-tiny fixture"})
  flux_lora.save(r.p, r.adapter, dir .. "peft.safetensors", {format = "peft"})
  return r
end

return M
