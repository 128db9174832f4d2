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

-- Edits (insertions, deletions, substitutions) between strings a and b.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = {[0] = i}
    for j = 1, #b do
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a:byte(i) == b:byte(j) and 0 or 1))
    end
    prev = cur
  end
  return prev[#b]
end

-- o = M.options(args, known): ckrun's --name value pairs, read with a type
-- check each. known lists the names the script takes: an option outside it
-- (a misspelt --max-grad-norm would otherwise pass unnoticed) or a word
-- without --name is refused, naming the closest name. Every error names the
-- line of the script that declared or read the option.
function M.options(args, known)
  if type(known) ~= "table" then error("sdxl.options: give the list of the script's option names", 2) end
  local o = setmetatable({args = args or {}, known = {}}, Options)
  for _, k in ipairs(known) do o.known[k] = true end
  local bad = {}
  for k, v in pairs(o.args) do
    if math.type(k) == "integer" then
      bad[#bad + 1] = string.format("unexpected argument '%s' (options are --name value)", tostring(v))
    elseif k ~= "script" and not o.known[k] then
      local best, bd = nil, math.huge
      for _, n in ipairs(known) do
        local d = distance(k, n)
        if d < bd then best, bd = n, d end
      end
      bad[#bad + 1] = string.format("unknown option --%s%s", k,
        best and bd <= math.max(2, #k // 3) and " (did you mean --" .. best .. "?)" or "")
    end
  end
  if #bad > 0 then
    table.sort(bad)
    error(table.concat(bad, "; ") .. "; the options are --" .. table.concat(known, ", --"), 2)
  end
  return o
end

-- the value of --name, or default when it was not given; a name the script
-- did not declare is an error at the line of the script that read it
local function value(o, name, default)
  if not o.known[name] then error("option --" .. name .. " is read but not in the script's list of options", 3) end
  local v = o.args[name]
  if v == nil then return default end
  return v
end

function Options:get(name, default)
  local v = value(self, name, default) -- not a tail call: value's error level counts this frame
  return v
end

function Options:flag(name, default)
  local v = value(self, name, default)
  if v == true or v == "true" or v == 1 or v == "yes" then return true end
  if v == false or v == "false" or v == 0 or v == "no" then return false end
  error("--" .. name .. " must be true or false, got '" .. tostring(v) .. "'", 2)
end

-- an integer of at least min (1)
function Options:count(name, default, min)
  local v = value(self, name, default)
  min = min or 1
  if math.type(v) ~= "integer" or v < min then
    error("--" .. name .. " must be an integer >= " .. min .. ", got '" .. tostring(v) .. "'", 2)
  end
  return v
end

-- one of the strings in `choices`
function Options:choice(name, default, choices)
  local v = value(self, name, default)
  for _, c in ipairs(choices) do
    if v == c then return v end
  end
  error("--" .. name .. " must be " .. table.concat(choices, " or ") .. ", got '" .. tostring(v) .. "'", 2)
end

-- a comma-separated list, entries trimmed
function Options:list(name, default)
  local out = {}
  for s in tostring(value(self, name, default)):gmatch("[^,]+") do out[#out + 1] = s:match("^%s*(.-)%s*$") end
  return out
end

-- One training step, compiled. s:
--   config        unet.config(...)
--   batch, latent the latent batch {batch, in_channels, latent, latent}
--   lora          {rank, alpha (rank), targets, conv_rank, conv_alpha, dropout, loraplus_lr_ratio} on a
--                 frozen base, or false to train
--                 every parameter
--   objective     diffusion.objective's options (prediction "eps" unless given), and seed
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
