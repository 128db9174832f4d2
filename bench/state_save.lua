-- The cost of a training-state save on sdxl-tiny: LoRA rank 4 (adapters and
-- their AdamW state) and full training (every parameter and its AdamW state).
-- Prints the median save time over several saves and the file size.
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local state = require "ck.state"

local o = require("ck.options").parse(args, {
  about = "The cost of a training-state save on sdxl-tiny, LoRA rank 4 and full training.",
  {"dir", "string", "out/.bench_state", "where the states are written", arg = "DIR"},
  {"reps", "integer", 7, "saves per mode (the median is printed)", min = 1},
})
if not o then return end
local dir, reps = o.dir, o.reps
for _, mode in ipairs{"lora", "full"} do
  local model = unet.UNet2DConditionModel("sdxl-tiny")
  if mode == "lora" then model:freeze(); lora.attach(model) end
  local g = ck.graph()
  local _, y = unet.build(g, model, {batch = 1, height = 16, width = 16})
  local p = g:compile{loss = ck.mean(y), optimizer = "adamw"}
  local times = {}
  for r = 1, reps do
    p.steps = r
    local t0 = ck.now()
    state.save(p, dir .. "/" .. mode, {}, 1)
    times[r] = ck.now() - t0
  end
  table.sort(times)
  local path = state.latest(dir .. "/" .. mode)
  local f = assert(io.open(path, "rb"))
  local size = f:seek("end")
  f:close()
  print(string.format("| %s | %d | %.1f | %.2f |", mode, #p:state_tensors(), 1e3 * times[(reps + 1) // 2], size / 2 ^ 20))
  os.remove(path)
end
