-- 8-bit AdamW (compile{optimizer = "adamw8bit"}, bitsandbytes' AdamW8bit):
-- the moments stored as bytes indexing bitsandbytes' dynamic codes, in blocks
-- of 256 values with one fp32 scale each. Checked against a reference written
-- here in double from the same definition (the codes built from
-- create_dynamic_map's formula, nearest-code quantization): 3 steps on an MLP
-- with blocks cut short and one value per block; the optimizer state takes a
-- quarter of AdamW's bytes (plus the scales); sdxl-tiny trained whole follows
-- fp32 AdamW's losses; recompute is bitwise; a training state saves and loads
-- the codes exactly; and codes that are not bytes are refused.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local policy = require "ck.policy"

-- bitsandbytes' create_dynamic_map(signed): midpoints of linspace(0.1, 1, k) in each decade, 0 and 1
local function code(signed)
  local out = {0, 1}
  for i = 0, 6 do
    local items = signed and 2 ^ i + 1 or 2 ^ (i + 1) + 1
    for j = 0, items - 2 do
      local lo, hi = 0.1 + 0.9 * j / (items - 1), 0.1 + 0.9 * (j + 1) / (items - 1)
      local mid = 10 ^ (i - 6) * (lo + hi) / 2
      out[#out + 1] = mid
      if signed then out[#out + 1] = -mid end
    end
  end
  table.sort(out)
  for k = 1, #out do out[k] = string.unpack("f", string.pack("f", out[k])) end -- as stored, in fp32
  return out
end
local CM, CV = code(true), code(false)
T.ok(#CM == 256 and #CV == 256 and CM[1] > -1 and CM[256] == 1 and CV[1] == 0, "both codes have 256 values")

local function nearest(c, x) -- 0-based index; ties to the larger
  local best = 1
  for k = 2, 256 do
    if math.abs(c[k] - x) <= math.abs(c[best] - x) then best = k end
  end
  return best - 1
end

-- the reference: state = {m codes, v codes, m scales, v scales} over n values in blocks of 256
local function ref_step(w, g, st, lr, t, o)
  local n, B = #w, 256
  local nb = (n + B - 1) // B
  for b = 0, nb - 1 do
    local i0, i1 = b * B + 1, math.min(n, (b + 1) * B)
    local ms, vs, mm, mv = {}, {}, 0, 0
    for i = i0, i1 do
      local m = CM[st.qm[i] + 1] * st.sm[b + 1] * o.b1 + (1 - o.b1) * g[i]
      local v = CV[st.qv[i] + 1] * st.sv[b + 1] * o.b2 + (1 - o.b2) * g[i] ^ 2
      w[i] = w[i] * (1 - lr * o.wd) - lr / (1 - o.b1 ^ t) * m / (math.sqrt(v) / math.sqrt(1 - o.b2 ^ t) + o.eps)
      ms[i], vs[i], mm, mv = m, v, math.max(mm, math.abs(m)), math.max(mv, v)
    end
    st.sm[b + 1], st.sv[b + 1] = mm, mv
    for i = i0, i1 do
      st.qm[i] = nearest(CM, mm > 0 and ms[i] / mm or 0)
      st.qv[i] = nearest(CV, mv > 0 and vs[i] / mv or 0)
    end
  end
end

do -- an MLP: l1.weight 300 values (a block and a short one), l1.bias 100, l2.weight 200, l2.bias 2
  local g = ck.graph()
  local x, t = g:input("x", {8, 3}), g:input("t", {8, 2})
  local w1, b1 = g:param("l1.weight", {100, 3}), g:param("l1.bias", {100}, {init = "uniform", a = -0.1, b = 0.1})
  local w2, b2 = g:param("l2.weight", {2, 100}), g:param("l2.bias", {2})
  local y = ck.linear(ck.silu(ck.linear(x, w1, b1)), w2, b2)
  local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw8bit", lr = 1e-2, weight_decay = 0.1, seed = 3,
                      keep_grads = true}
  local r = T.rng(4)
  p:set(x, T.random_values(r, 24))
  p:set(t, T.random_values(r, 16))
  local names = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
  local ref, st = {}, {}
  for _, nm in ipairs(names) do
    local w = p:get(nm)
    local nb = (#w + 255) // 256
    ref[nm] = w
    st[nm] = {qm = {}, qv = {}, sm = {}, sv = {}}
    for i = 1, #w do st[nm].qm[i], st[nm].qv[i] = 0, 0 end
    for b = 1, nb do st[nm].sm[b], st[nm].sv[b] = 0, 0 end
  end
  local worst, codes_off = 0, 0
  for step = 1, 3 do
    p:step()
    for _, nm in ipairs(names) do
      ref_step(ref[nm], p:grad(nm), st[nm], 1e-2, step, {b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1})
      local w = p:get(nm)
      for i = 1, #w do worst = math.max(worst, math.abs(w[i] - ref[nm][i]) / math.max(1e-2, math.abs(ref[nm][i]))) end
      local q = p:get("adam8_code." .. nm)
      local n = #w
      for i = 1, n do
        if q[i] ~= st[nm].qm[i] then codes_off = codes_off + 1 end
        if q[n + i] ~= st[nm].qv[i] then codes_off = codes_off + 1 end
      end
      -- carry on from the program's own state, so that one rounding apart does not compound
      for i = 1, n do st[nm].qm[i], st[nm].qv[i], ref[nm][i] = q[i], q[n + i], w[i] end
      local s = p:get("adam8_scale." .. nm)
      local nb = #s // 2
      for b = 1, nb do st[nm].sm[b], st[nm].sv[b] = s[b], s[nb + b] end
    end
  end
  T.ok(worst < 1e-5, string.format("3 steps: weights as the double-precision reference (worst relative %.2g)", worst))
  T.ok(codes_off <= 6, string.format("and the codes it stores are the reference's nearest codes (%d of 3612 one apart)",
    codes_off))
  local bytes = 0
  for _, nm in ipairs(names) do bytes = bytes + #p:get(nm) end
  local optbytes = p:plan().at_peak.optimizer_state
  T.ok(optbytes < 2 * bytes + 64 * 20 + 16 * 64, string.format(
    "optimizer state: %d bytes for %d values (fp32 AdamW: %d)", optbytes, bytes, 8 * bytes))
  local ok, err = pcall(function() p:set("adam8_code.l2.bias", {0, 1, 2.5, 3}) end)
  T.ok(not ok and err:match("test_adam8%.lua:%d+:") and err:match("bytes"), "a code that is not a byte is refused: "
    .. tostring(err))
end

do -- sdxl-tiny trained whole: 8-bit AdamW follows fp32 AdamW; recompute is bitwise; the state saves exactly
  local function build(opt, checkpoint)
    return T.unet_step("sdxl-tiny", {batch = 2, height = 8}, {optimizer = opt, lr = 1e-3, seed = 5, checkpoint = checkpoint,
                                                              device = "cpu"})
  end
  local _, pa = build("adamw")
  local g8, p8 = build("adamw8bit")
  local worst = 0
  local l8
  for _ = 1, 8 do
    local la
    la, l8 = pa:step(), p8:step()
    worst = math.max(worst, math.abs(l8 - la) / la)
  end
  T.ok(worst < 0.02, string.format("8 steps: losses within %.2g of fp32 AdamW's", worst))
  T.ok(p8:plan().at_peak.optimizer_state * 3.5 < pa:plan().at_peak.optimizer_state, string.format(
    "optimizer state %d bytes against %d", p8:plan().at_peak.optimizer_state, pa:plan().at_peak.optimizer_state))
  local _, pr = build("adamw8bit", policy.diffusers())
  local _, pn = build("adamw8bit")
  local same = true
  for _ = 1, 3 do same = same and pr:step() == pn:step() end
  T.ok(same and pr:checksum("conv_in.weight") == pn:checksum("conv_in.weight")
    and pr:checksum("adam8_code.conv_in.weight") == pn:checksum("adam8_code.conv_in.weight"),
    "under diffusers checkpointing: losses, weights and codes bitwise those of none")
  -- a state saved and loaded into a fresh program continues bitwise
  assert(ck.mkdir("out")) -- a fresh clone has none
  local path = string.format("out/.test_adam8.%d.safetensors", math.floor(ck.now() * 1e6))
  local entries = {}
  for _, nm in ipairs(p8:state_tensors()) do entries[#entries + 1] = {nm, nm} end
  p8:save(path, entries)
  local _, p9 = build("adamw8bit")
  local f <close> = ck.safetensors(path)
  T.ok(f:dtype("adam8_code.conv_in.weight") == "U8" and f:dtype("adam8_scale.conv_in.weight") == "F32",
    "the saved state keeps the codes as bytes (U8)")
  local map = {}
  for _, e in ipairs(entries) do map[e[1]] = e[2] end
  p9:load(f, map)
  p9.steps, p9.updates = p8.steps, p8.updates
  T.ok(p9:step() == p8:step() and p9:checksum("adam8_code.conv_in.weight") == p8:checksum("adam8_code.conv_in.weight"),
    "a saved and loaded state continues bitwise")
  os.remove(path)
end

T.done()
