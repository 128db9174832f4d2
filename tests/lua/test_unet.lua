-- The SDXL UNet in ck.unet: its parameters are exactly diffusers' keys and
-- shapes (tiny and full configs), and the tiny model runs forward and trains.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"

-- "name [d0,d1,...]" per line -> {name = "d0,d1,..."}, count
local function read_keys(path)
  local keys, n = {}, 0
  for line in io.lines(path) do
    local name, shape = line:match("^(%S+)%s+%[([%d,]*)%]%s*$")
    if name then
      keys[name] = shape
      n = n + 1
    end
  end
  return keys, n
end

-- compares the graph's parameters with a key list; returns a description of
-- the first differences, or nil when the two are the same set with the same shapes
local function diff_keys(g, path)
  local want, nwant = read_keys(path)
  local have, nhave = {}, 0
  for _, p in ipairs(g:params()) do
    have[p.name] = table.concat(p.shape, ",")
    nhave = nhave + 1
  end
  local diffs = {}
  local function note(s) if #diffs < 5 then diffs[#diffs + 1] = s end end
  for name, shape in pairs(want) do
    if not have[name] then note("missing " .. name)
    elseif have[name] ~= shape then note(name .. " is [" .. have[name] .. "], want [" .. shape .. "]") end
  end
  for name in pairs(have) do
    if not want[name] then note("unexpected " .. name) end
  end
  if nwant ~= nhave then note(string.format("%d parameters, want %d", nhave, nwant)) end
  table.sort(diffs)
  return #diffs > 0 and table.concat(diffs, "; ") or nil
end

local function check_keys(g, path, what)
  local d = diff_keys(g, path)
  T.ok(d == nil, what .. " parameter names and shapes equal " .. path .. (d and (": " .. d) or ""))
end

local function clock(t0) return string.format("%.2fs", os.clock() - t0) end

do -- sdxl-tiny: parameter count, names and shapes; output shape
  local g = ck.graph()
  local _, y = unet.build(g, "sdxl-tiny", {batch = 1, height = 32, width = 32})
  local all = g:param_count()
  T.ok(all == 8011332, "sdxl-tiny has 8011332 parameters (got " .. all .. ")")
  check_keys(g, "tests/data/sdxl_tiny_keys.txt", "sdxl-tiny")
  T.ok(table.concat(y.shape, ",") == "1,4,32,32", "sdxl-tiny output is [1,4,32,32]")
end

do -- full sdxl at 128x128 latents: graph only, never compiled (it would take ~10 GB)
  local t0 = os.clock()
  local g = ck.graph()
  local _, y = unet.build(g, "sdxl", {batch = 1, height = 128, width = 128})
  local all = g:param_count()
  T.ok(all == 2567463684, "sdxl has 2567463684 parameters (got " .. all .. ")")
  check_keys(g, "tests/data/sdxl_full_keys.txt", "sdxl")
  T.ok(table.concat(y.shape, ",") == "1,4,128,128", "sdxl output is [1,4,128,128] (graph built in " .. clock(t0) .. ")")
end

do -- parameter and op scopes are module paths
  local g = ck.graph()
  local m, y = unet.build(g, "sdxl-tiny")
  local k = g:get("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight")
  T.ok(k ~= nil and k.scope == "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k",
    "to_k.weight is recorded in its module's scope")
  T.ok(y.scope == "conv_out", "the output is made in scope conv_out (got '" .. tostring(y.scope) .. "')")
  local mod = m:get("up_blocks.1.attentions.2.transformer_blocks.0.ff.net.0.proj")
  T.ok(mod ~= nil and mod:type() == "nn.Linear" and mod.out_features == 2 * 4 * 64,
    "the module tree finds ff.net.0.proj of up_blocks.1 by path")
end

do -- frozen = true: every base parameter is frozen
  local g = ck.graph()
  unet.build(g, "sdxl-tiny", {frozen = true})
  local all, train = g:param_count()
  T.ok(all == 8011332 and train == 0, "frozen sdxl-tiny has no trainable parameters (" .. train .. ")")
end

-- deterministic small input values
local function fill(p, t, seed, scale)
  local r = T.rng(seed)
  p:set(t, T.random_values(r, t.numel, -scale, scale))
end

local function set_inputs(p, x)
  fill(p, x.sample, 1, 1)
  p:set(x.timesteps, {500})
  fill(p, x.encoder_hidden_states, 2, 1)
  fill(p, x.text_embeds, 3, 1)
  p:set(x.time_ids, {32, 32, 0, 0, 32, 32})
end

do -- sdxl-tiny compiles, runs forward with a finite output, and one training step changes the loss
  local t0 = os.clock()
  local g = ck.graph()
  local _, y, x = unet.build(g, "sdxl-tiny", {batch = 1, height = 32, width = 32})
  local target = g:input("target", {1, 4, 32, 32})
  local loss = ck.mse_loss(y, target)
  local p = g:compile{loss = loss, outputs = {y}, optimizer = "adamw", lr = 1e-3, seed = 7}
  set_inputs(p, x)
  fill(p, target, 4, 1)
  local l0 = p:forward()
  local out = p:get(y)
  local finite = #out == 4 * 32 * 32
  local absmax = 0
  for _, v in ipairs(out) do
    if v ~= v or v == math.huge or v == -math.huge then finite = false end
    absmax = math.max(absmax, math.abs(v))
  end
  T.ok(finite and absmax > 0, string.format("forward output has 4096 finite values (max |y| %.3g)", absmax))
  T.ok(l0 == l0 and l0 > 0, string.format("forward loss %.5f is finite and positive", l0))
  local ls = p:step()
  local l1 = p:forward()
  T.ok(ls == l0, "the step's loss is the forward loss before the update")
  T.ok(l1 == l1 and l1 ~= l0, string.format("one AdamW step changes the loss (%.6f -> %.6f)", l0, l1))
  print("     compile, forward, step, forward took " .. clock(t0) .. " CPU")
end

T.done()
