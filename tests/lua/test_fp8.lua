-- fp8 frozen weights (compile{frozen = "fp8"}, kohya's --fp8_base; and
-- frozen = "bf16", the base alone in bf16): a LoRA's
-- frozen base is stored as float8 e4m3fn, a quarter of fp32's bytes and half
-- of bf16's; kernels read fp32 copies of it (exact: every fp8 value is a
-- float), so a step is bitwise the step of the same program in fp32 (or bf16)
-- whose base holds the fp8-rounded values. Checked on sdxl-tiny: the bytes, the
-- rounding against a nearest-value search written here, bitwise losses and
-- adapters against that program, the plan's peak against the measured
-- high-water mark, recompute bitwise, and the errors: a value fp8 cannot hold,
-- an unknown frozen storage.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"
local policy = require "ck.policy"

local function build(opts)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  lora.attach(model)
  local c = {optimizer = "adamw", lr = 1e-3, seed = 5, keep_grads = true, device = "cpu"}
  for k, v in pairs(opts) do c[k] = v end
  local g, p = T.unet_step(model, {batch = 2, height = 8, frozen = true}, c)
  return g, p
end

local function frozen_names(g)
  local names = {}
  for _, prm in ipairs(g:params()) do
    if prm.kind == "frozen" then names[#names + 1] = prm.name end
  end
  return names
end

local function adapters(g, p)
  local s = {}
  for _, prm in ipairs(g:params()) do
    if prm.kind == "param" then s[#s + 1] = p:checksum(prm.name) end
  end
  return table.concat(s, " ")
end

-- e4m3fn's non-negative values, code 0..126, and the nearest one to x (ties to
-- the even code; past 464 the cast gives NaN)
local VALUES = {}
for c = 0, 126 do
  local e, m = c >> 3, c & 7
  VALUES[c] = e == 0 and m * 2.0 ^ -9 or (8 + m) * 2.0 ^ (e - 10)
end
local function rounded(x)
  local a, best = math.abs(x), 0
  for c = 1, 126 do
    local d, db = math.abs(VALUES[c] - a), math.abs(VALUES[best] - a)
    if d < db or (d == db and c % 2 == 0) then best = c end
  end
  return x < 0 and -VALUES[best] or VALUES[best]
end

local g32, p32 = build{}
local g8, p8 = build{frozen = "fp8"}
local names = frozen_names(g8)
T.ok(#names > 100, #names .. " frozen tensors")

do -- the bytes
  local _, p16 = build{storage = "bf16"}
  local _, p16f8 = build{storage = "bf16", frozen = "fp8"}
  local f32, f8 = p32:plan().at_peak.frozen, p8:plan().at_peak.frozen
  local f16, f16f8 = p16:plan().at_peak.frozen, p16f8:plan().at_peak.frozen
  T.ok(f8 * 4 == f32 and f16f8 * 2 == f16 and f16f8 == f8,
    string.format("the frozen base takes %d bytes in fp8, %d in bf16, %d in fp32", f8, f16, f32))
  T.ok(p8:plan().persistent < p32:plan().persistent - 0.7 * f32,
    string.format("persistent bytes: %d with an fp8 base, %d with fp32's", p8:plan().persistent, p32:plan().persistent))
end

do -- the stored values are the nearest fp8 values of what was set
  local worst, n = 0, 0
  for _, name in ipairs{"conv_in.weight", "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight",
                        "time_embedding.linear_1.bias"} do
    local want, got = p32:get(name), p8:get(name)
    for i = 1, #want do
      n = n + 1
      if got[i] ~= rounded(want[i]) then worst = worst + 1 end
    end
  end
  T.ok(worst == 0, string.format("%d weights of 3 tensors read back as their nearest fp8 value (%d differ)", n, worst))
end

-- the same program in fp32 (and in bf16) with the base set to the fp8 values
local function same_as_rounded(storage, checkpoint, frozen)
  local ga, pa = build{storage = storage, frozen = frozen or "fp8", checkpoint = checkpoint}
  local gb, pb = build{storage = storage}
  for _, name in ipairs(names) do pb:set(name, pa:get(name)) end
  local same, hw_ok = true, true
  for _ = 1, 3 do
    local la, info = pa:step{measure = true}
    local hw = info.high_water
    local lb = pb:step()
    same = same and la == lb
    hw_ok = hw_ok and hw == pa:plan().peak
  end
  return same and adapters(ga, pa) == adapters(gb, pb), hw_ok, pa
end

do
  local same, hw_ok = same_as_rounded("fp32")
  T.ok(same, "3 AdamW steps with an fp8 base: losses and adapters bitwise those of fp32 with the rounded base")
  T.ok(hw_ok, "the planned peak is the measured high-water mark at every step")
  local same16 = same_as_rounded("bf16")
  T.ok(same16, "bf16 storage with an fp8 base: bitwise bf16 storage with the rounded base")
  local samer, _, pr = same_as_rounded("fp32", policy.diffusers())
  T.ok(samer and pr:plan().recompute_ops > 0,
    string.format("under diffusers checkpointing (%d recompute ops): still bitwise", pr:plan().recompute_ops))
  local sameb, hwb, pb = same_as_rounded("fp32", nil, "bf16")
  T.ok(sameb and hwb and pb:plan().at_peak.frozen * 2 == p32:plan().at_peak.frozen,
    "frozen = \"bf16\" with fp32 activations: half the base's bytes, bitwise fp32 with the bf16-rounded base")
end

do -- the loss with the rounded base stays near fp32's
  local l32, l8 = p32:step(), p8:step()
  T.ok(math.abs(l8 - l32) < 0.05 * l32, string.format("first loss %.5f with the fp8 base, %.5f in fp32", l8, l32))
end

do -- what fp8 cannot hold is refused, naming the tensor and the line
  local w = p8:get("conv_in.weight")
  w[5] = 500
  local ok, err = pcall(function() p8:set("conv_in.weight", w) end)
  T.ok(not ok and err:match("test_fp8%.lua:%d+:") and err:match("conv_in%.weight") and err:match("fp8"),
    "500 in an fp8 weight is refused: " .. tostring(err))
  w[5] = 460 -- rounds to 448
  p8:set("conv_in.weight", w)
  T.ok(p8:get("conv_in.weight")[5] == 448, "460 is stored as 448, the largest fp8 value")
  local g = ck.graph()
  local x = g:input("x", {2, 3})
  local w = g:param("w", {4, 3}):freeze()
  local ok2, err2 = pcall(function() return g:compile{outputs = {ck.linear(x, w)}, frozen = "fp4"} end)
  T.ok(not ok2 and err2:match("test_fp8%.lua:%d+:") and err2:match("frozen must be fp8 or bf16"),
    "an unknown frozen storage is refused naming the line: " .. tostring(err2))
end

T.done()
