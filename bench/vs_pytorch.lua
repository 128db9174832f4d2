-- The ckrun side of bench/vs_pytorch.sh: one sdxl-tiny training step (epsilon
-- objective, MSE, backward, AdamW), driven line by line over stdin by
-- bench/vs_pytorch.py so that its steps alternate with PyTorch's.
--
--   ckrun --trust bench/vs_pytorch.lua --batch 2 --latent 32 --lora false --checkpoint none
--
-- Prints "ready key=value ..." (parameter counts, bytes held for backward from
-- the plan), then answers each line: "step" runs one step and prints
-- "time SECONDS loss LOSS"; "dump FILE" writes every parameter and input to FILE
-- (safetensors), runs one step and a forward after it and prints
-- "losses BEFORE AFTER"; "quit" ends.
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local policy = require "ck.policy"
local diffusion = require "ck.diffusion"

local o = require("ck.options").parse(args, {
  about = "ckrun's side of bench/vs_pytorch.sh: one sdxl-tiny training step per 'step' line on stdin.",
  {"batch", "integer", 2, "samples per step", min = 1},
  {"latent", "integer", 32, "the latent side", min = 1},
  {"lora", "flag", false, "rank --rank adapters on a frozen base; false trains every parameter", arg = "true|false"},
  {"rank", "integer", 4, "the adapters' rank", min = 1},
  {"checkpoint", "string", "none", "the checkpoint policy", arg = "POLICY"},
  {"seed", "integer", 1, "the seed", min = 0},
  {"lr", "number", 1e-4, "the learning rate"},
})
if not o then return end
local batch = o.batch
local latent = o.latent
local use_lora = o.lora
local rank = o.rank
local checkpoint = policy.parse(o.checkpoint)
local seed = o.seed
local lr = o.lr
local config = unet.config("sdxl-tiny")
local tokens = 77
local pooled_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim

local model = unet.UNet2DConditionModel(config)
local adapter
if use_lora then
  model:freeze()
  adapter = lora.attach(model, {rank = rank, alpha = rank})
end
local g = ck.graph()
local objective = diffusion.objective{prediction = "eps"}
objective.seed = seed
local cond = {
  prompt_embeds = g:input("prompt_embeds", {batch, tokens, config.cross_attention_dim}),
  pooled_prompt_embeds = g:input("pooled_prompt_embeds", {batch, pooled_dim}),
  time_ids = g:input("time_ids", {batch, 6}),
}
local loss = objective:build(g, {batch, config.in_channels, latent, latent}, function(noisy, t)
  return model:forward(g, noisy, t, cond.prompt_embeds, cond.pooled_prompt_embeds, cond.time_ids)
end)
local p = g:compile{loss = loss, optimizer = "adamw", lr = lr, weight_decay = 1e-2, seed = seed,
                    checkpoint = checkpoint}
local all, trainable = g:param_count()
local base = all - (adapter and adapter.param_count() or 0)
local plan = p:plan()

-- Fresh inputs for the step about to run, drawn outside the timed region.
local function prepare()
  p:randn(objective.inputs.latents, 0x7400)
  p:randn(cond.prompt_embeds, 0x7500, 0.5)
  p:randn(cond.pooled_prompt_embeds, 0x7600, 0.5)
  local px = latent * 8
  local ids = {}
  for _ = 1, batch do
    for _, v in ipairs({px, px, 0, 0, px, px}) do ids[#ids + 1] = v end
  end
  p:set(cond.time_ids, ids)
  objective:prepare(p)
end

print(string.format("ready params=%d base_params=%d trainable=%d activation_bytes=%d peak=%d persistent=%d ops=%d " ..
  "recompute_ops=%d at_peak_activations=%d at_peak_recomputed=%d", all, base, trainable, plan.activation_bytes,
  plan.peak, plan.persistent, plan.ops, plan.recompute_ops, plan.at_peak.activations or 0,
  plan.at_peak.recomputed or 0))
io.stdout:flush()

for line in io.lines() do
  local cmd, arg = line:match("^(%S+)%s*(.-)%s*$")
  if cmd == "step" then
    prepare()
    local t0 = ck.now()
    local l = p:step()
    local dt = ck.now() - t0
    print(string.format("time %.6f loss %.9g", dt, l))
  elseif cmd == "dump" then
    prepare()
    local entries = {}
    for _, t in ipairs(g:params()) do entries[#entries + 1] = {t.name, t.name} end
    for _, name in ipairs({"latents", "noise", "timesteps", "sqrt_alpha_prod", "sqrt_one_minus_alpha_prod",
                           "loss_weight", "prompt_embeds", "pooled_prompt_embeds", "time_ids"}) do
      entries[#entries + 1] = {"input." .. name, name}
    end
    p:save(arg, entries)
    local before = p:step()
    local after = p:forward()
    print(string.format("losses %.9g %.9g", before, after))
  elseif cmd == "quit" then
    break
  else
    print("error unknown command '" .. tostring(line) .. "'")
  end
  io.stdout:flush()
end
