-- The planner's cost as the graph grows: compiles (plan only, nothing
-- allocated) the SDXL LoRA training step of a size with every transformer
-- depth multiplied by --depth-mult, under one checkpoint policy, and prints
-- the op count, the plan's peak and its recompute FLOPs in one line.
-- bench/plan_scale.sh times it as a whole process.
--
--   ckrun bench/plan_scale.lua --size tiny --depth-mult 32 --checkpoint budget:80%
local ck = require "ck"
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local options = require "ck.options"

local o = options.parse(args, {
  about = "compile one SDXL LoRA training step, plan only, and print its op count and plan",
  {"size", "choice", "tiny", "the UNet: sdxl-tiny, sdxl-mid or SDXL", choices = {"tiny", "mid", "full"}},
  {"depth-mult", "integer", 1, "every level's transformer depth (transformer_layers_per_block) times this", min = 1},
  {"resolution", "integer", function(v) return v.size == "tiny" and 256 or 1024 end, "image side in pixels",
   shown = "256 with --size tiny, else 1024", min = 64},
  {"batch", "integer", 1, "samples per step", min = 1},
  {"checkpoint", "string", "none", "the checkpoint policy (as train_sdxl_lora.lua's --checkpoint)"},
  {"offload", "choice", "none", "saved activations' offload (as train_sdxl_lora.lua's --offload)",
   choices = {"none", "activations", "auto"}},
  {"gpu", "string", nil, "the card whose figures the cost model predicts by (default: the CPU's)", arg = "NAME"},
})
if not o then return end

local config = unet.config(({tiny = "sdxl-tiny", mid = "sdxl-mid", full = "sdxl"})[o.size])
for i, d in ipairs(config.transformer_layers_per_block) do
  config.transformer_layers_per_block[i] = d * o["depth-mult"]
end
local latent = o.resolution // 8
local r = sdxl.training_step{config = config, batch = o.batch, latent = {latent, latent},
                             lora = {rank = 4, alpha = 4},
                             compile = {checkpoint = policy.parse(o.checkpoint), plan_only = true,
                                        offload = o.offload, gpu = o.gpu}}
local p = r.program:plan()
print(string.format("ops %d peak %d recompute_flops %.0f step_flops %.0f decide_s %.4f plan_s %.4f", p.ops, p.peak,
                    p.recompute_flops, p.step_flops, p.decide_seconds, p.plan_seconds))
