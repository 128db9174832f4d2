-- Flux.1's training step: ck.flux's transformer, ck.flux_lora's adapter on
-- it (or every parameter trained), the latents packed and the prediction
-- unpacked inside the graph, and a flow-matching objective, compiled.
--
--   local step = require "ck.flux_step"
--   local r = step.training_step{config = "flux-tiny", batch = 2, latent = {4, 6}, tokens = 5, lora = {rank = 4}}
local ck = require "ck"
local flux = require "ck.flux"
local flux_lora = require "ck.flux_lora"

local M = {}

-- The flow-matching objective when the caller gives none: x_t = (1 - sigma)
-- x0 + sigma noise, the target noise - x0, the mean squared error weighted
-- per sample. Inputs latents, noise [B, C, H, W], timesteps [B] (sigma),
-- sigma [B, 1, 1, 1] (the same values), loss_weight [B, 1, 1, 1].
local function flow_objective()
  local o = {}
  function o:build(g, shape, model_fn)
    local b = shape[1]
    local x0, noise = g:input("latents", shape), g:input("noise", shape)
    local t = g:input("timesteps", {b})
    local sigma, w = g:input("sigma", {b, 1, 1, 1}), g:input("loss_weight", {b, 1, 1, 1})
    self.inputs = {latents = x0, noise = noise, timesteps = t, sigma = sigma, weight = w}
    local target = noise - x0
    local pred = model_fn(x0 + target * sigma, t)
    local d = pred - target
    self.loss = ck.mean(d * d * w)
    self.prediction_tensor = pred
    return self.loss
  end
  return o
end

-- One training step, compiled (the shape of ck.sdxl.training_step). s:
--   config     ck.flux.config(...) or a name
--   batch      samples per step; latent = {h, w} or one number: the latents' size (even)
--   tokens     text tokens per prompt (T5's; 512 for dev, 256 for schnell as kohya's defaults)
--   mask       kohya's --apply_t5_attn_mask: the joint attention leaves each sample's padded text
--              tokens out (inputs t5_attn_mask and joint_ones, flux.inputs')
--   lora       ck.flux_lora.attach's options (rank, alpha = rank, targets = "kohya" | "diffusers" | a
--              list, dropout, loraplus_lr_ratio) on a frozen base, or false to train every parameter
--   objective  an object with build(g, {B, C, H, W}, model_fn(noisy, t) -> prediction) -> loss (ck.train's
--              flow matching); by default the plain flow-matching loss above
--   compile    g:compile's options besides the loss (optimizer "adamw" unless given)
-- Returns {model, adapter (ck.flux_lora's), graph, objective, program, inputs = {encoder_hidden_states,
-- pooled_projections, guidance, rope, latents, noise, ...}, rope_values (the flat table to p:set
-- the rope input to)}. The latents are packed and the prediction unpacked inside the graph.
function M.training_step(s)
  local config = flux.config(s.config)
  local batch, latent, tokens = s.batch or 1, s.latent, s.tokens or 512
  local lh, lw = latent, latent
  if type(latent) == "table" then lh, lw = latent[1], latent[2] end
  local r = {}
  r.model = flux.FluxTransformer2DModel(config)
  if s.lora then
    r.model:freeze()
    r.adapter = flux_lora.attach(r.model, {rank = s.lora.rank, alpha = s.lora.alpha or s.lora.rank,
      targets = s.lora.targets or "kohya", dropout = s.lora.dropout, loraplus_lr_ratio = s.lora.loraplus_lr_ratio})
  end
  local g = ck.graph()
  r.graph = g
  local x = flux.inputs(g, config, {batch = batch, height = lh, width = lw, tokens = tokens, latents = false,
                                    mask = s.mask})
  local mask = flux.joint_mask(x)
  r.inputs = x
  r.objective = s.objective or flow_objective()
  local latent_channels = config.in_channels // 4
  local loss = r.objective:build(g, {batch, latent_channels, lh, lw}, function(noisy, t)
    local y = r.model:forward(g, flux.pack(noisy), x.encoder_hidden_states, x.pooled_projections, t, x.rope,
                              x.guidance, mask)
    return flux.unpack(y, lh, lw)
  end)
  for k, v in pairs(r.objective.inputs or {}) do x[k] = x[k] or v end
  r.rope_values = flux.rope_values(config, tokens, lh, lw)
  local c = {loss = loss, optimizer = "adamw"}
  for k, v in pairs(s.compile or {}) do c[k] = v end
  r.program = g:compile(c)
  return r
end

return M
