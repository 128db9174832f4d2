-- The CUDA backend runs the plans the CPU runs: an SDXL-shaped UNet trained on
-- device "cuda" follows the CPU's loss curve; recompute policies give
-- gradients bitwise those of none on the device, and each predicted peak is
-- the device arena's measured high-water mark; host reads, writes, saves and
-- loads, logging statistics, the non-finite guard, bf16 storage, fp16 storage
-- with loss scaling and an fp8 frozen base work on device memory.
--
-- Run by ckrun --trust (cmake/cuda.cmake): on a CUDA device (skipped, exit 77,
-- where there is none), and on the CPU emulator of the CUDA backend
-- (CK_CUDA_MODULE=libck_cuda_emu.so, CK_DEVICE_TEST=small: a smaller UNet and
-- fewer steps, since the emulator runs every GPU thread in turn).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local policy = require "ck.policy"
local lora = require "ck.lora"

local usable = false
for _, d in ipairs(ck.devices()) do usable = usable or d == "cuda" end
if not usable then
  print("SKIP: no CUDA device is usable here (no driver, no device, or a build without the CUDA backend)")
  os.exit(77)
end

local small = os.getenv("CK_DEVICE_TEST") == "small"
local config = unet.config("sdxl-tiny")
config.dropout = 0.1
local shape, steps = {batch = 2, height = 16, width = 16}, 20
if small then
  config.block_out_channels = {8, 16, 16}
  config.norm_num_groups = 4
  config.transformer_layers_per_block = {1, 1, 1}
  config.attention_head_dim = {1, 2, 2}
  config.cross_attention_dim = 16
  config.addition_time_embed_dim = 8
  config.projection_class_embeddings_input_dim = 16 + 6 * 8
  shape, steps = {batch = 1, height = 8, width = 8}, 4
end
local B, H, W = shape.batch, shape.height, shape.width

local function build(device, checkpoint, storage, max_grad_norm, accumulate, frozen, stats, loss_scale)
  local model = config
  if frozen then -- LoRA adapters on a frozen base stored as `frozen`
    model = unet.UNet2DConditionModel(config)
    lora.attach(model)
  end
  return T.unet_step(model, {batch = B, height = H, width = W, frozen = frozen and true}, {optimizer = "adamw",
    lr = 1e-3, seed = 5, keep_grads = true, checkpoint = checkpoint, device = device, storage = storage,
    max_grad_norm = max_grad_norm, accumulate = accumulate, frozen = frozen, stats = stats, loss_scale = loss_scale})
end

local function rel(a, b) return math.abs(a - b) / math.max(1e-6, math.abs(b)) end

-- n steps of the same program on the CPU (pc) and the device (pd, measured):
-- the worst relative loss difference and the device's last high-water mark
local function follow(pc, pd, n)
  local worst, hw = 0, 0
  for _ = 1, n do
    local lc = pc:step()
    local ld, info = pd:step{measure = true}
    hw = info.high_water
    worst = math.max(worst, rel(ld, lc))
  end
  return worst, hw
end

-- 1. the loss curve
do
  local _, pc = build("cpu")
  local _, pd = build("cuda")
  T.ok(pd:device() == "cuda" and pc:device() == "cpu", "programs compile for the device asked for")
  local worst, at = 0, 0
  for s = 1, steps do
    local lc, ld = pc:step(), pd:step()
    if rel(ld, lc) > worst then worst, at = rel(ld, lc), s end
  end
  -- fp32 on both; products and reductions sum in different orders, and 20
  -- AdamW steps carry the differences along
  T.ok(worst < 1e-3, string.format("%d training steps on cuda follow the CPU's losses (largest relative difference %.2g, step %d)",
    steps, worst, at))
  local wc, wd = pc:get("conv_in.weight"), pd:get("conv_in.weight")
  local dmax = 0
  for i = 1, #wc do dmax = math.max(dmax, math.abs(wc[i] - wd[i])) end
  T.ok(#wc == #wd and dmax < 1e-4, string.format("and end with the same weights (largest difference %.2g)", dmax))
  -- an evaluation pass (p.training = false) drops nothing, on both devices
  local tc, td = pc:forward(), pd:forward()
  pc.training, pd.training = false, false
  local ec, ed = pc:forward(), pd:forward()
  T.ok(ec ~= tc and ed ~= td and rel(ed, ec) < 1e-4, string.format(
    "with dropout 0.1, an evaluation pass on cuda gives the CPU's loss (%.6f, %.6f), not the training pass's (%.6f)",
    ed, ec, td))
end

-- 2. recompute on the device: bitwise gradients, exact peaks
local function run(checkpoint)
  local g, p = build("cuda", checkpoint)
  local losses, measured = {}, {}
  for s = 1, 2 do
    local info
    losses[s], info = p:step{measure = true}
    measured[s] = info.high_water
  end
  local sums = {}
  for _, prm in ipairs(g:params()) do sums[#sums + 1] = p:checksum(prm.name, "grad") .. "/" .. p:checksum(prm.name) end
  return {losses = losses, measured = measured, plan = p:plan(), grads = table.concat(sums, " ")}
end
local base = run(nil)
T.ok(base.plan.peak == base.measured[1] and base.plan.peak == base.measured[2],
  string.format("none on cuda: the predicted peak %d is the measured high-water mark %d of the device arena",
    base.plan.peak, base.measured[2]))
-- parameters and AdamW state dominate at these sizes: the budget cuts the rest
local budget = math.floor(base.plan.persistent + 0.995 * (base.plan.peak - base.plan.persistent))
for _, e in ipairs{{"diffusers", policy.diffusers()}, {"budget", policy.budget(budget)},
                   {"selective", policy.selective()}} do
  local r = run(e[2])
  T.ok(r.plan.recompute_ops > 0 and r.grads == base.grads and r.losses[2] == base.losses[2],
    string.format("%s on cuda: %d recompute ops, losses and gradients bitwise those of none", e[1], r.plan.recompute_ops))
  T.ok(r.plan.peak == r.measured[1] and r.plan.peak == r.measured[2],
    string.format("%s on cuda: predicted peak %d equals the measured %d", e[1], r.plan.peak, r.measured[2]))
end

-- 3. host reads and writes, saves and loads through device memory
do
  local g, p, x = build("cuda")
  local v = p:get(x.sample)
  v[1], v[#v] = 0.25, -3.5
  p:set(x.sample, v)
  local back = p:get(x.sample)
  local same = #back == #v
  for i = 1, #v do same = same and back[i] == v[i] end
  T.ok(same, "p:set then p:get on cuda round-trips every value")
  p:set(x.sample, 2.0, 1) -- one entry of the batch
  back = p:get(x.sample)
  local n = #v // B
  T.ok(back[1] == 2.0 and back[n] == 2.0 and (B == 1 or back[n + 1] == v[n + 1]),
    "p:set of one batch entry on cuda keeps the others")
  p:step()
  local path = os.tmpname()
  local entries = {}
  for _, prm in ipairs(g:params()) do entries[#entries + 1] = {prm.name, prm.name} end
  p:save(path, entries)
  local before = p:checksum("conv_in.weight")
  local _, q = build("cuda")
  q:step()
  q:step()
  T.ok(q:checksum("conv_in.weight") ~= before, "(a program two steps on holds other weights)")
  local f <close> = ck.safetensors(path)
  local map = {}
  for _, prm in ipairs(g:params()) do map[prm.name] = prm.name end
  q:load(f, map)
  T.ok(q:checksum("conv_in.weight") == before, "p:save from cuda and p:load into cuda restore the weights bitwise")
  os.remove(path)
end

-- 4. logging statistics and the non-finite guard on device memory
do
  local _, pc = build("cpu", nil, nil, nil, nil, nil, {blocks = {}})
  local _, pd, x = build("cuda", nil, nil, nil, nil, nil, {blocks = {}})
  local _, rc = pc:step{stats = "all"}
  local _, rd = pd:step{stats = "all"}
  T.ok(rel(rd.grad_norm, rc.grad_norm) < 1e-4,
    string.format("the gradient norm on cuda (%.6g) is the CPU's (%.6g)", rd.grad_norm, rc.grad_norm))
  local worst = 0
  for name, a in pairs(rc.acts) do
    local b = rd.acts[name]
    worst = math.max(worst, b and rel(b.absmax, a.absmax) or 1)
  end
  T.ok(next(rc.acts) ~= nil and worst < 1e-4, string.format("block activation statistics on cuda are the CPU's (worst %.2g)", worst))
  local w = pd:checksum("conv_in.weight")
  pd:set(x.sample, 0 / 0, 1)
  local _, r = pd:step{guard = true}
  local nf = r.nonfinite or {}
  T.ok(r.skipped and pd:checksum("conv_in.weight") == w and nf.input == "sample" and nf.op ~= nil,
    string.format("a NaN input on cuda: the guard skips the update and names the first op that made one (%s in %s at %s)",
      tostring(nf.op), tostring(nf.scope), tostring(nf.where)))
end

-- 5. bf16 storage on the device: bf16 kernels where every operand is bf16,
-- fp32 kernels on converted copies elsewhere
do
  local _, pc = build("cpu", nil, "bf16")
  local _, pd = build("cuda", nil, "bf16")
  local worst, hw = follow(pc, pd, math.min(steps, 5))
  T.ok(worst < 1e-2, string.format("bf16 storage on cuda follows bf16 on the CPU (worst relative loss difference %.2g)", worst))
  T.ok(hw == pd:plan().peak, string.format("bf16 on cuda: predicted peak %d, measured %d", pd:plan().peak, hw))
end

-- 5b. fp16 storage on the device: every op with a bf16 kernel on its fp16
-- kernel (products, convolutions and attention on tensor cores with fp32
-- accumulation; the CPU widens its products and convolutions and converts
-- around its fp32 attention), fp32 kernels on copies converted as the CPU
-- converts (ops/fp16.h) where an operand is fp32, the plan exact; and dynamic
-- loss scaling: a scale so large that the gradients
-- overflow fp16 is backed off, the update skipped, on both alike
do
  local _, pc = build("cpu", nil, "fp16")
  local _, pd = build("cuda", nil, "fp16")
  local worst, hw = follow(pc, pd, math.min(steps, 5))
  T.ok(worst < 1e-2 and pd.loss_scale == pc.loss_scale and pd.updates == pc.updates, string.format(
    "fp16 storage on cuda follows fp16 on the CPU (worst relative loss difference %.2g, scale %g and %g)", worst,
    pd.loss_scale, pc.loss_scale))
  T.ok(hw == pd:plan().peak, string.format("fp16 on cuda: predicted peak %d, measured %d", pd:plan().peak, hw))
  local _, qc = build("cpu", nil, "fp16", nil, nil, nil, nil, {init = 2 ^ 60})
  local _, qd = build("cuda", nil, "fp16", nil, nil, nil, nil, {init = 2 ^ 60})
  local w = qd:checksum("conv_in.weight")
  local seen = {}
  for s = 1, 2 do
    local _, ic = qc:step()
    local _, id = qd:step()
    seen[#seen + 1] = string.format("%g%s/%g%s", ic.loss_scale, ic.overflow and "!" or "", id.loss_scale,
      id.overflow and "!" or "")
  end
  T.ok(table.concat(seen, " ") == "1.15292e+18!/1.15292e+18! 5.76461e+17!/5.76461e+17!" and qd.loss_scale == 2 ^ 58
    and qd.updates == 0 and qd:checksum("conv_in.weight") == w,
    "fp16 with a scale of 2^60 on cuda: the gradients overflow, the updates are skipped and the scale halves, as on " ..
    "the CPU (cpu/cuda scales, ! overflow: " .. table.concat(seen, " ") .. ")")
end

-- 6. gradient clipping and accumulation on the device: the summed squares,
-- the factor, the scaled gradients and the gradient sums run there, and the
-- updates follow the CPU's
do
  local _, pc = build("cpu", nil, nil, 1e-3, 2)
  local _, pd = build("cuda", nil, nil, 1e-3, 2)
  local worst = 0
  for _ = 1, 4 do worst = math.max(worst, rel(pd:step(), pc:step())) end
  local wc, wd = pc:get("conv_in.weight"), pd:get("conv_in.weight")
  local dmax = 0
  for i = 1, #wc do dmax = math.max(dmax, math.abs(wc[i] - wd[i])) end
  T.ok(pd.updates == 2 and worst < 1e-3 and dmax < 1e-4, string.format(
    "max_grad_norm 1e-3, accumulate 2 on cuda: 4 steps, 2 clipped AdamW updates follow the CPU's " ..
    "(losses %.2g, weights %.2g apart)", worst, dmax))
end

-- 7. an fp8 frozen base on the device: the fp8 -> fp32 copies run there
do
  local _, pc = build("cpu", nil, nil, nil, nil, "fp8")
  local _, pd = build("cuda", nil, nil, nil, nil, "fp8")
  local worst, hw = follow(pc, pd, 3)
  T.ok(worst < 1e-4, string.format("LoRA on an fp8 base on cuda follows the CPU (worst relative loss difference %.2g)",
    worst))
  T.ok(hw == pd:plan().peak, string.format("fp8 base on cuda: predicted peak %d, measured %d", pd:plan().peak, hw))
end

-- 7b. LoRA on a bf16 base in bf16 storage: the base's products and
-- convolutions run their bf16 kernels on tensor cores (cuBLASLt, cuDNN) in the
-- workspaces the plan gave them, and the plan stays exact
do
  local _, pc = build("cpu", nil, "bf16", nil, nil, "bf16")
  local _, pd = build("cuda", nil, "bf16", nil, nil, "bf16")
  local worst, hw = follow(pc, pd, 3)
  T.ok(worst < 1e-2, string.format("LoRA on a bf16 base on cuda follows bf16 on the CPU (worst relative loss difference %.2g)",
    worst))
  T.ok(hw == pd:plan().peak, string.format("bf16 base on cuda: predicted peak %d, measured %d", pd:plan().peak, hw))
end

-- 8. fused updates on the device (updates inside backward): bitwise the unfused program's weights
do
  local function on_cuda(fused)
    return T.unet_step(config, shape, {optimizer = "adamw", lr = 1e-3, seed = 5, device = "cuda", fused_backward = fused})
  end
  local ga, pa = on_cuda(false)
  local _, pb = on_cuda(true)
  local hw
  for _ = 1, 2 do
    pa:step()
    hw = select(2, pb:step{measure = true}).high_water
  end
  local same = true
  for _, prm in ipairs(ga:params()) do same = same and pa:checksum(prm.name) == pb:checksum(prm.name) end
  T.ok(same and hw == pb:plan().peak and pb:plan().peak < pa:plan().peak, string.format(
    "fused updates on cuda: weights bitwise the unfused ones after 2 steps; peak %d (measured %d) against %d",
    pb:plan().peak, hw, pa:plan().peak))
end

-- 9. 8-bit AdamW on the device: the codes and scales updated there follow the CPU's
do
  local function on(device)
    return T.unet_step(config, shape, {optimizer = "adamw8bit", lr = 1e-3, seed = 5, device = device})
  end
  local _, pc = on("cpu")
  local _, pd = on("cuda")
  local worst = 0
  for _ = 1, 3 do worst = math.max(worst, rel(pd:step(), pc:step())) end
  local wc, wd = pc:get("conv_in.weight"), pd:get("conv_in.weight")
  local qc, qd = pc:get("adam8_code.conv_in.weight"), pd:get("adam8_code.conv_in.weight")
  local dmax, qoff = 0, 0
  for i = 1, #wc do dmax = math.max(dmax, math.abs(wc[i] - wd[i])) end
  for i = 1, #qc do qoff = qoff + (math.abs(qc[i] - qd[i]) > 1 and 1 or 0) end
  -- the gradients differ in their last bits (sums in other orders), so a few
  -- codes near a rounding boundary land elsewhere; the weights stay as close
  -- as section 6's
  T.ok(worst < 1e-4 and dmax < 1e-4 and qoff <= #qc // 1000, string.format(
    "adamw8bit on cuda: 3 steps follow the CPU (losses %.2g, weights %.2g apart; %d of %d codes more than one apart)",
    worst, dmax, qoff, #qc))
end

T.done()
