-- The SDXL UNet training step that ck.family.sdxl (the family of
-- scripts/train_sdxl_lora.lua's trainer), scripts/policy_sweep.lua and
-- bench/gpu_step.lua share (the UNet, LoRA adapters on a frozen base or every
-- parameter trained, the diffusion objective, the conditioning inputs and the
-- compiled program).
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local diffusion = require "ck.diffusion"

local M = {}

M.TOKENS = 77 -- text tokens per prompt (CLIP's context)

-- The width of the pooled text embedding (text_embeds) a UNet config expects.
function M.pooled_dim(config)
  return config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
end

-- One training step, compiled. s:
--   config        unet.config(...)
--   batch, latent the latent batch {batch, in_channels, latent, latent}; latent may be {h, w}
--   lora          {rank, alpha (rank), targets, conv_rank, conv_alpha, dropout, loraplus_lr_ratio} on a
--                 frozen base, or false to train
--                 every parameter
--   objective     diffusion.objective's options (prediction "eps" unless given), and seed
--   compile       g:compile's options besides the loss (optimizer "adamw" unless given)
--   tokens        the text tokens per prompt (77; kohya's --max_token_length N gives N + 2)
-- Returns {model, adapter (nil without lora), graph, objective, program, inputs = {prompt_embeds,
-- pooled_prompt_embeds, time_ids, latents, noise}}.
function M.training_step(s)
  local config, batch, latent = s.config, s.batch, s.latent
  local r = {}
  r.model = unet.UNet2DConditionModel(config)
  if s.lora then
    r.model:freeze()
    r.adapter = lora.attach(r.model, {rank = s.lora.rank, alpha = s.lora.alpha or s.lora.rank,
                                      targets = s.lora.targets, conv_rank = s.lora.conv_rank,
                                      conv_alpha = s.lora.conv_alpha, dropout = s.lora.dropout,
                                      loraplus_lr_ratio = s.lora.loraplus_lr_ratio})
  end
  local g = ck.graph()
  r.graph = g
  local o = {prediction = "eps"}
  for k, v in pairs(s.objective or {}) do o[k] = v end
  r.objective = diffusion.objective(o)
  r.objective.seed = o.seed
  r.inputs = {
    prompt_embeds = g:input("prompt_embeds", {batch, s.tokens or M.TOKENS, config.cross_attention_dim}),
    pooled_prompt_embeds = g:input("pooled_prompt_embeds", {batch, M.pooled_dim(config)}),
    time_ids = g:input("time_ids", {batch, 6}),
  }
  local x = r.inputs
  local lh, lw = latent, latent
  if type(latent) == "table" then lh, lw = latent[1], latent[2] end
  local loss = r.objective:build(g, {batch, config.in_channels, lh, lw}, function(noisy, t)
    return r.model:forward(g, noisy, t, x.prompt_embeds, x.pooled_prompt_embeds, x.time_ids)
  end)
  x.latents, x.noise = r.objective.inputs.latents, r.objective.inputs.noise
  local c = {loss = loss, optimizer = "adamw"}
  for k, v in pairs(s.compile or {}) do c[k] = v end
  r.program = g:compile(c)
  return r
end

return M
