-- bf16 storage (compile{storage = "bf16"}): activations, their gradients and
-- frozen weights are stored in 16 bits while trainable weights, their
-- gradients, the AdamW state, the inputs and the loss stay fp32; kernels
-- compute in fp32 (the activations, softmax, elementwise ops and copies read
-- and write bf16 directly; the rest work on converted copies). On sdxl-tiny: the activations held for
-- backward take half the bytes, the loss curve follows fp32's within bf16's
-- precision, the plan stays exact, recompute stays bitwise, host reads see the
-- stored (rounded) values (fp16 and loss scaling: test_mixed_precision.lua).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"
local policy = require "ck.policy"

local function build(storage, checkpoint, adapters)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  if adapters then lora.attach(model) end
  local g, p, x = T.unet_step(model, {batch = 2, height = 16, frozen = adapters}, {optimizer = "adamw", lr = 1e-3,
    seed = 5, keep_grads = true, storage = storage, checkpoint = checkpoint, device = "cpu"})
  return g, p, x
end

local function curve(p, n)
  local ls, hw = {}, {}
  for s = 1, n do
    local info
    ls[s], info = p:step{measure = true}
    hw[s] = info.high_water
  end
  return ls, hw
end

-- the loss curve and the bytes
local _, p32 = build("fp32")
local g16, p16 = build("bf16")
local l32 = curve(p32, 10)
local l16, hw16 = curve(p16, 10)
local worst = 0
for s = 1, 10 do worst = math.max(worst, math.abs(l16[s] - l32[s]) / l32[s]) end
T.ok(worst < 1e-2, string.format("10 AdamW steps in bf16 follow fp32's losses (%.4f -> %.4f against %.4f -> %.4f; worst %.2g)",
  l16[1], l16[10], l32[1], l32[10], worst))
T.ok(l16[10] < 0.5 * l16[1], "and learn")
local a32, a16 = p32:plan().activation_bytes, p16:plan().activation_bytes
T.ok(a16 <= 0.51 * a32 and a16 >= 0.45 * a32,
  string.format("activations held for backward: %d bytes in bf16, %d in fp32 (%.3f)", a16, a32, a16 / a32))
T.ok(hw16[1] == p16:plan().peak and hw16[10] == p16:plan().peak,
  string.format("bf16: the predicted peak %d is the measured high-water mark %d", p16:plan().peak, hw16[10]))
T.ok(p16:plan().persistent == p32:plan().persistent, "trainable weights and AdamW state stay fp32 (same persistent bytes)")

-- recompute under bf16 is bitwise
local function grads(g, p)
  local s = {}
  for _, prm in ipairs(g:params()) do s[#s + 1] = p:checksum(prm.name, "grad") end
  return table.concat(s, " ")
end
do
  local ga, pa = build("bf16")
  local gb, pb = build("bf16", policy.diffusers())
  local la, lb = curve(pa, 2), curve(pb, 2)
  T.ok(pb:plan().recompute_ops > 0 and la[2] == lb[2] and grads(ga, pa) == grads(gb, pb),
    string.format("bf16 under diffusers checkpointing (%d recompute ops): losses and gradients bitwise those of none",
      pb:plan().recompute_ops))
end

-- LoRA on a frozen base: the base is stored in bf16, the adapters in fp32
do
  local _, pf = build("fp32", nil, true)
  local gl, pl = build("bf16", nil, true)
  local f32, f16 = pf:plan().at_peak.frozen, pl:plan().at_peak.frozen
  T.ok(f16 * 2 == f32, string.format("a frozen base takes half the bytes in bf16 (%d against %d)", f16, f32))
  local name = "conv_in.weight"
  local w = pl:get(name)
  local v = {}
  for i = 1, #w do v[i] = 1 + 2 ^ -10 end -- not a bf16 value: rounds to 1
  pl:set(name, v)
  local back = pl:get(name)
  T.ok(back[1] == 1 and back[#back] == 1, "a frozen bf16 weight holds what was set, rounded to bf16")
  local lora_name
  for _, prm in ipairs(gl:params()) do if prm.name:match("lora") then lora_name = prm.name break end end
  local a = pl:get(lora_name)
  a[1] = 1 + 2 ^ -10
  pl:set(lora_name, a)
  T.ok(pl:get(lora_name)[1] == 1 + 2 ^ -10, "an fp32 adapter weight holds it exactly")
end

T.done()
