-- The SDXL UNet training step that scripts/train_sdxl_lora.lua,
-- scripts/policy_sweep.lua and bench/gpu_step.lua share (the UNet, LoRA
-- adapters on a frozen base or every parameter trained, the diffusion
-- objective, the conditioning inputs and the compiled program), and the
-- typed reading of their --options.
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

local Options = {}
Options.__index = Options

-- o = M.options(args): ckrun's --name value pairs, read with a type check
-- each. A bad value is an error naming the line of the script that read it.
function M.options(args)
  return setmetatable({args = args or {}}, Options)
end

-- the value, or default when the option was not given
function Options:get(name, default)
  local v = self.args[name]
  if v == nil then return default end
  return v
end

function Options:flag(name, default)
  local v = self:get(name, default)
  if v == true or v == "true" or v == 1 or v == "yes" then return true end
  if v == false or v == "false" or v == 0 or v == "no" then return false end
  error("--" .. name .. " must be true or false, got '" .. tostring(v) .. "'", 2)
end

-- an integer of at least min (1)
function Options:count(name, default, min)
  local v = self:get(name, default)
  min = min or 1
  if math.type(v) ~= "integer" or v < min then
    error("--" .. name .. " must be an integer >= " .. min .. ", got '" .. tostring(v) .. "'", 2)
  end
  return v
end

-- one of the strings in `choices`
function Options:choice(name, default, choices)
  local v = self:get(name, default)
  for _, c in ipairs(choices) do
    if v == c then return v end
  end
  error("--" .. name .. " must be " .. table.concat(choices, " or ") .. ", got '" .. tostring(v) .. "'", 2)
end

-- a comma-separated list, entries trimmed
function Options:list(name, default)
  local out = {}
  for s in tostring(self:get(name, default)):gmatch("[^,]+") do out[#out + 1] = s:match("^%s*(.-)%s*$") end
  return out
end

-- One training step, compiled. s:
--   config        unet.config(...)
--   batch, latent the latent batch {batch, in_channels, latent, latent}
--   lora          {rank, alpha (rank), targets} on a frozen base, or false to train every parameter
--   objective     diffusion.objective's options ({prediction = "eps"} when absent), and seed
--   compile       g:compile's options besides the loss (optimizer "adamw" unless given)
-- Returns {model, adapter (nil without lora), graph, objective, program, inputs = {prompt_embeds,
-- pooled_prompt_embeds, time_ids, latents, noise}}.
function M.training_step(s)
  local config, batch, latent = s.config, s.batch, s.latent
  local r = {}
  r.model = unet.UNet2DConditionModel(config)
  if s.lora then
    r.model:freeze()
    r.adapter = lora.attach(r.model, {rank = s.lora.rank, alpha = s.lora.alpha or s.lora.rank,
                                      targets = s.lora.targets})
  end
  local g = ck.graph()
  r.graph = g
  local o = s.objective or {}
  r.objective = diffusion.objective{prediction = o.prediction or "eps", noise_offset = o.noise_offset,
                                    min_snr_gamma = o.min_snr_gamma}
  r.objective.seed = o.seed
  r.inputs = {
    prompt_embeds = g:input("prompt_embeds", {batch, M.TOKENS, config.cross_attention_dim}),
    pooled_prompt_embeds = g:input("pooled_prompt_embeds", {batch, M.pooled_dim(config)}),
    time_ids = g:input("time_ids", {batch, 6}),
  }
  local x = r.inputs
  local loss = r.objective:build(g, {batch, config.in_channels, latent, latent}, function(noisy, t)
    return r.model:forward(g, noisy, t, x.prompt_embeds, x.pooled_prompt_embeds, x.time_ids)
  end)
  x.latents, x.noise = r.objective.inputs.latents, r.objective.inputs.noise
  local c = {loss = loss, optimizer = "adamw"}
  for k, v in pairs(s.compile or {}) do c[k] = v end
  r.program = g:compile(c)
  return r
end

return M
