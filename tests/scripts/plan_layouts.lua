-- One line per (UNet size, policy, batch): the plan of the SDXL LoRA training
-- step, compiled plan only on the device ckrun was started for, with its
-- peak, live peak, recompute FLOPs and layout digest (every list of the
-- program, every entry and offset). tests/sh/test_plan_layouts.sh compares
-- the lines with tests/data/plans/layouts_<device>.txt byte for byte.
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local log = require "ck.log"

local POLICIES = {"none", "diffusers", "selective", "sqrt_n", "every_n:3", "blocks:mid_block,up_blocks.1",
                  "budget:90%", "budget:80%", "budget:70%", "budget:62%", "budget:55%", "auto:60MiB"}
local cases = {
  {size = "sdxl-tiny", latent = 32, batch = 2, policies = POLICIES},
  {size = "sdxl-tiny", latent = {24, 40}, batch = 1, policies = {"none", "diffusers", "budget:75%"}, stats = true},
  {size = "sdxl-mid", latent = 64, batch = 1, policies = {"none", "diffusers", "selective", "budget:90%", "budget:70%"}},
  {size = "sdxl", latent = 128, batch = 1, policies = {"none", "diffusers", "budget:80%", "auto:16GiB"}},
}
for _, c in ipairs(cases) do
  for _, name in ipairs(c.policies) do
    local config = unet.config(c.size)
    local ok, r = pcall(sdxl.training_step, {
      config = config, batch = c.batch, latent = c.latent, lora = {rank = 4, alpha = 4},
      compile = {checkpoint = policy.parse(name), plan_only = true,
                 stats = c.stats and log.stats_request{every = 5, blocks = log.unet_blocks} or nil}})
    local lat = type(c.latent) == "table" and c.latent[1] .. "x" .. c.latent[2] or c.latent .. "x" .. c.latent
    local head = string.format("%s %s batch %d %s: ", c.size, lat, c.batch, name)
    if not ok then
      print(head .. tostring(r):gsub("^[^\n]-:%d+: ", ""))
    else
      local p = r.program:plan()
      print(head .. string.format("ops %d peak %d live_peak %d recompute_flops %.0f layout %s", p.ops, p.peak,
                                  p.live_peak, p.recompute_flops, p.layout_digest))
    end
  end
end
