-- The diffusion-transformer ops as scripts see them (ck.rms_norm, ck.rope,
-- ck.modulate, ck.gate, ck.layer_norm without affine; nn.RMSNorm, nn.LayerNorm's
-- options, nn.rope_table): values of a compiled graph against formulas written
-- here, and bad arguments refused with one line naming the op and the script line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local nn = require "ck.nn"
local T = require "check"

local function close(a, b, tol)
  for i = 1, #b do
    if not (math.abs(a[i] - b[i]) <= tol * (1 + math.abs(b[i]))) then return false, i end
  end
  return #a == #b
end

-- nn.rope_table: Black Forest Labs' EmbedND for Flux (axes 16, 56, 56; theta 10000)
do
  local ids = {{0, 0, 0}, {0, 3, 5}, {1, 2, 7}}
  local tab = nn.rope_table(ids, {16, 56, 56}, 10000)
  T.ok(#tab == 3 * 128, "rope_table: a row of 128 (a cosine and a sine per pair of the head dim) per token")
  -- pair j of axis a at position p turns by p * omega, omega = 1 / 10000^(2 j / dim_a) (BFL's
  -- rope(): omega in float64, then the product); pairs run axis by axis
  local ok = true
  for l, pos in ipairs(ids) do
    local pair = 0
    for a, dim in ipairs({16, 56, 56}) do
      for j = 0, dim // 2 - 1 do
        local ang = pos[a] * (1 / 10000 ^ (2 * j / dim))
        local at = (l - 1) * 128 + 2 * pair
        ok = ok and tab[at + 1] == math.cos(ang) and tab[at + 2] == math.sin(ang)
        pair = pair + 1
      end
    end
  end
  T.ok(ok, "rope_table: pair j of axis a turns by pos_a / theta^(2j / dim_a), axes in order (16 + 56 + 56 = 128)")
  T.ok(tab[1] == 1 and tab[2] == 0 and tab[128] == 0, "rope_table: position 0 is no rotation (cos 1, sin 0)")
  local bad, err = pcall(nn.rope_table, {{0, 0}}, {16, 56, 56})
  T.ok(not bad and err:find("ids%[1%] must list 3 positions"), "rope_table: ids of the wrong length: " .. tostring(err))
  bad, err = pcall(function() local t = nn.rope_table({{0, 0, 0}}, {16, 56, 56}, -1); return t end)
  T.ok(not bad and err:find("test_dit_ops.lua:%d+: rope_table: theta"),
    "rope_table: errors name the calling line: " .. tostring(err))
  bad, err = pcall(nn.rope_table, {{0, 0, 0}}, {16, 55, 57})
  T.ok(not bad and err:find("axes_dim%[2%] must be a positive even"), "rope_table: odd axis dims: " .. tostring(err))
end

-- a graph of the ops, run on fixed values
do
  local g = ck.graph()
  local x = g:input("x", {1, 2, 4})
  local w = g:input("w", {4})
  local tab = g:input("tab", {2, 4})
  local shift, scale, gate = g:input("shift", {1, 4}), g:input("scale", {1, 4}), g:input("gate", {1, 4})
  local outs = {
    rms = ck.rms_norm(x, w, 1e-6),
    ln = ck.layer_norm(x, nil, nil, 1e-6),
    rope = ck.rope(x, tab),
    mod = ck.modulate(x, shift, scale),
    gated = ck.gate(x, gate, x),
  }
  local list = {}
  for _, t in pairs(outs) do list[#list + 1] = t end
  -- fp32, and bf16 storage (the table, an input, stays fp32: rope's kernel reads it so)
  for _, precision in ipairs({"no", "bf16"}) do
    local p = g:compile{outputs = list, optimizer = "none", precision = precision}
    local xv = {1, -2, 3, 0.5, 0, 4, -1, 2}
    p:set(x, xv)
    p:set(w, {1, 2, 0.5, -1})
    local th = {0.3, -1.2, 2.0, 0.7}
    p:set(tab, {math.cos(th[1]), math.sin(th[1]), math.cos(th[2]), math.sin(th[2]),
                math.cos(th[3]), math.sin(th[3]), math.cos(th[4]), math.sin(th[4])})
    p:set(shift, {0.1, 0.2, 0.3, 0.4})
    p:set(scale, {-0.5, 0, 0.5, 1})
    p:set(gate, {2, -1, 0, 0.5})
    p:forward()
    local want = {rms = {}, ln = {}, rope = {}, mod = {}, gated = {}}
    local wv, sh, sc, gv = {1, 2, 0.5, -1}, {0.1, 0.2, 0.3, 0.4}, {-0.5, 0, 0.5, 1}, {2, -1, 0, 0.5}
    for r = 0, 1 do
      local q, m, v = 0, 0, 0
      for c = 1, 4 do q, m = q + xv[4 * r + c] ^ 2, m + xv[4 * r + c] end
      m = m / 4
      for c = 1, 4 do v = v + (xv[4 * r + c] - m) ^ 2 end
      for c = 1, 4 do
        local xi = xv[4 * r + c]
        want.rms[4 * r + c] = xi / math.sqrt(q / 4 + 1e-6) * wv[c]
        want.ln[4 * r + c] = (xi - m) / math.sqrt(v / 4 + 1e-6)
        want.mod[4 * r + c] = (1 + sc[c]) * xi + sh[c]
        want.gated[4 * r + c] = xi + gv[c] * xi
      end
      for j = 0, 1 do -- row r's two pairs at the angles of table row r
        local a = th[2 * r + j + 1]
        local x0, x1 = xv[4 * r + 2 * j + 1], xv[4 * r + 2 * j + 2]
        want.rope[4 * r + 2 * j + 1] = x0 * math.cos(a) - x1 * math.sin(a)
        want.rope[4 * r + 2 * j + 2] = x0 * math.sin(a) + x1 * math.cos(a)
      end
    end
    for k, t in pairs(outs) do
      local ok, at = close(p:get(t), want[k], precision == "bf16" and 2 ^ -7 or 1e-5)
      T.ok(ok, k .. " as its formula, precision " .. precision .. (ok and "" or (" (entry " .. tostring(at) .. ")")))
    end
  end
end

-- a 16-bit activation and the fp32 table: rope runs its 16-bit kernel, which
-- reads the table in fp32, so the plan makes no fp32 copies (no workspace)
do
  local g = ck.graph()
  local x = g:input("x", {1, 3, 4})
  local tab = g:input("tab", {3, 4})
  local s = ck.scale(x, 2)
  local y = ck.rope(s, tab)
  for _, precision in ipairs({"bf16", "fp16"}) do
    local p = g:compile{outputs = {y}, optimizer = "none", precision = precision}
    local alone = g:compile{outputs = {s}, optimizer = "none", precision = precision}:plan().workspace
    T.ok(p:plan().workspace == alone, precision .. ": rope of a 16-bit activation with an fp32 table copies " ..
      "nothing (workspace " .. p:plan().workspace .. ", the scale's alone " .. alone .. ")")
    local xv, th = {1, -2, 3, 0.5, 0, 4, -1, 2, 0.25, -0.75, 1.5, -3}, {0.3, -1.2, 2.0, 0.7, -0.4, 1.1}
    local tv = {}
    for i = 1, 6 do tv[2 * i - 1], tv[2 * i] = math.cos(th[i]), math.sin(th[i]) end
    p:set(x, xv)
    p:set(tab, tv)
    p:forward()
    local got, worst = p:get(y), 0
    for l = 0, 2 do
      for j = 0, 1 do
        local a, x0, x1 = th[2 * l + j + 1], 2 * xv[4 * l + 2 * j + 1], 2 * xv[4 * l + 2 * j + 2]
        worst = math.max(worst, math.abs(got[4 * l + 2 * j + 1] - (x0 * math.cos(a) - x1 * math.sin(a))),
                         math.abs(got[4 * l + 2 * j + 2] - (x0 * math.sin(a) + x1 * math.cos(a))))
      end
    end
    T.ok(worst < 0.05, precision .. ": rope in 16-bit storage rotates as the formula, to its rounding (" .. worst .. ")")
  end
end

-- nn layers: parameters as torch names them
do
  local g = ck.graph()
  local x = g:input("x", {2, 3, 8})
  local m = nn.class("Test")()
  local ln = m:add("ln", nn.LayerNorm{8, 1e-6, elementwise_affine = false})
  local lnw = m:add("lnw", nn.LayerNorm{8, bias = false})
  local rms = m:add("norm_q", nn.RMSNorm{8})
  ln:forward(g, x)
  lnw:forward(g, x)
  rms:forward(g, x)
  local names = {}
  for _, e in ipairs(g:params()) do names[#names + 1] = e.name end
  table.sort(names)
  T.ok(table.concat(names, " ") == "lnw.weight norm_q.weight",
    "LayerNorm{elementwise_affine=false} has no parameters, {bias=false} a weight, RMSNorm a weight: " ..
    table.concat(names, " "))
end

-- against diffusers' Flux modules (tests/ref/make_flux_ops_ref.py): FluxPosEmbed and
-- apply_rotary_emb, torch.nn.RMSNorm, LayerNorm without affine, AdaLayerNormZero and
-- the gated residual, and a whole FluxAttention (a double block's joint attention)
-- built from these ops; max |ckrun - diffusers| over max |diffusers| per output
do
  local f <close> = ck.safetensors("tests/data/flux_ops/ref.safetensors")
  local function worst(got, want)
    local e, m = 0, 0
    for i = 1, #want do
      e, m = math.max(e, math.abs(got[i] - want[i])), math.max(m, math.abs(want[i]))
    end
    return #got == #want and e / m or math.huge
  end
  local idf = f:read("rope/ids")
  local ids = {}
  for l = 1, #idf // 3 do ids[l] = {idf[3 * l - 2], idf[3 * l - 1], idf[3 * l]} end
  local tab = nn.rope_table(ids, {4, 6, 6}, 10000)
  -- diffusers' cos and sin [L, 16] repeat each pair's value twice
  local cs, sn, e = f:read("rope/cos"), f:read("rope/sin"), 0
  for i = 1, #cs do
    local pair = (i - 1) // 2
    e = math.max(e, math.abs(tab[2 * pair + 1] - cs[i]), math.abs(tab[2 * pair + 2] - sn[i]))
  end
  T.ok(#tab == #cs and e < 1e-7, string.format("rope_table is FluxPosEmbed's cos and sin (worst %.2g)", e))

  local g = ck.graph()
  local function input(name) local t = g:input(name, f:shape(name)); return t end
  local x, table_in = input("rope/x"), g:input("tab", {11, 16})
  local outs = {["rope/out"] = ck.rope(x, table_in)}
  local rx, rw = input("rms/x"), input("rms/weight")
  outs["rms/out"] = ck.rms_norm(rx, rw, 1e-6)
  outs["ln/out"] = ck.layer_norm(input("ln/x"), nil, nil, 1e-6)
  local ax, emb = input("adaln/x"), input("adaln/emb")
  local mod = ck.linear(ck.silu(emb), input("adaln/norm1.linear.weight"), input("adaln/norm1.linear.bias"))
  local gate_msa = ck.slice(mod, 1, 64, 32)
  outs["adaln/out"] = ck.modulate(ck.layer_norm(ax, nil, nil, 1e-6), ck.slice(mod, 1, 0, 32), ck.slice(mod, 1, 32, 32))
  outs["adaln/gate_msa"] = gate_msa
  outs["adaln/gated"] = ck.gate(ax, gate_msa, input("adaln/y"))
  -- FluxAttention: per stream q, k, v; RMSNorm on each head of q and k; [text; image]; rope; attention
  local function proj(t, name) return ck.linear(t, input("attn/" .. name .. ".weight"), input("attn/" .. name .. ".bias")) end
  local function head_norm(t, name)
    local L = t.shape[2]
    return ck.reshape(ck.rms_norm(ck.reshape(t, {1, L, 2, 16}), input("attn/" .. name .. ".weight"), 1e-6), {1, L, 32})
  end
  local img, txt = input("attn/hidden"), input("attn/encoder")
  local q = ck.concat(head_norm(proj(txt, "add_q_proj"), "norm_added_q"), head_norm(proj(img, "to_q"), "norm_q"), 1)
  local k = ck.concat(head_norm(proj(txt, "add_k_proj"), "norm_added_k"), head_norm(proj(img, "to_k"), "norm_k"), 1)
  local v = ck.concat(proj(txt, "add_v_proj"), proj(img, "to_v"), 1)
  local o = ck.attention(ck.rope(q, table_in), ck.rope(k, table_in), v, 2)
  outs["attn/encoder_out"] = proj(ck.slice(o, 1, 0, 3), "to_add_out")
  outs["attn/out"] = proj(ck.slice(o, 1, 3, 8), "to_out.0")

  local list = {}
  for _, t in pairs(outs) do list[#list + 1] = t end
  local p = g:compile{outputs = list, optimizer = "none"}
  for _, name in ipairs(f:keys()) do
    if not outs[name] and name ~= "rope/ids" and name ~= "rope/cos" and name ~= "rope/sin" and name ~= "attn/out"
      and name ~= "attn/encoder_out" and name ~= "adaln/gated" then
      p:set(name, f:read(name))
    end
  end
  p:set(table_in, tab)
  p:forward()
  local tol = {["attn/out"] = 2e-6, ["attn/encoder_out"] = 2e-6}
  local names = {}
  for name in pairs(outs) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local err = worst(p:get(outs[name]), f:read(name))
    T.ok(err <= (tol[name] or 1e-6), string.format("%s as diffusers' (worst %.2g of the largest)", name, err))
  end
end

-- bad arguments: one line naming the op and this script's line
do
  local g = ck.graph()
  local x = g:input("x", {1, 4, 16})
  local w = g:param("w", {16})
  local act = ck.silu(g:input("t", {4, 8}))
  local cases = {
    {function() return ck.rope(x, act) end, "rope: the table must be a graph input %(g:input%)"},
    {function() return ck.rope(x, g:input("t3", {3, 8})) end, "rope: the table has 3 positions, the input 4"},
    {function() return ck.rope(x, g:input("t5", {4, 5})) end, "rope: the table must be %(L, D%) with D even"},
    {function() return ck.rope(x, g:input("t6", {4, 6})) end, "no multiple of the table's head dim 6"},
    {function() return ck.layer_norm(x, nil, w) end, "layer_norm: a bias needs a weight"},
    {function() return ck.layer_norm(x, 1e-6) end, "tensor or nil expected"},
    {function() return ck.rms_norm(x, g:param("w8", {8})) end, "rms_norm: weight has shape %[8%], input has 16 channels"},
    {function() return ck.modulate(x, g:input("s", {1, 16}), g:input("c", {4, 16})) end,
     "modulate: scale has shape %[4, 16%], input %[1, 4, 16%] wants %[1, 16%]"},
    {function() return ck.gate(x, g:input("gg", {1, 16}), g:input("y", {1, 4, 8})) end,
     "gate: x has shape %[1, 4, 16%], y has shape %[1, 4, 8%]"},
  }
  for i, c in ipairs(cases) do
    local ok, err = pcall(c[1])
    T.ok(not ok and tostring(err):find(c[2]) and tostring(err):find("test_dit_ops.lua:%d+") and
         not tostring(err):find("\n"), "bad argument " .. i .. ": " .. tostring(err))
  end
end

T.done()
