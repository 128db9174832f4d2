-- Programs that share weights (compile{share = p}): one per input shape (an
-- aspect-ratio bucket), all training one set of weights. They hold one copy
-- of the parameters, the optimizer state and the counters, in one arena as
-- large as the largest needs; steps alternating between them train exactly as
-- one program given the same batches does; a program may add inputs and
-- frozen weights of its own (a decoder), which hold until another member runs
-- and are refused after that until written again.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

-- a small conv net on [B, 3, H, W] images: a frozen stem, a trained head;
-- its parameters do not depend on H and W
local function build(b, h, w, opts)
  local g = ck.graph()
  local x = g:input("x", {b, 3, h, w})
  local y = g:input("y", {b, 4, h, w})
  local stem = g:param("stem.weight", {8, 3, 3, 3}, {trainable = false, init = "normal", std = 0.3})
  local head = g:param("head.weight", {4, 8, 3, 3}, {init = "normal", std = 0.1})
  local hb = g:param("head.bias", {4}, {init = "zeros"})
  local hid = ck.silu(ck.conv2d(x, stem, nil, {padding = 1}))
  local out = ck.conv2d(hid, head, hb, {padding = 1})
  local c = {loss = ck.mse_loss(out, y), optimizer = "adamw", lr = 1e-2, seed = 7}
  for k, v in pairs(opts or {}) do c[k] = v end
  return g:compile(c)
end

local r = T.rng(5)
local function batch(b, h, w) return T.random_values(r, b * 3 * h * w), T.random_values(r, b * 4 * h * w) end

local function same_bits(a, b, names)
  for _, n in ipairs(names) do
    if a:checksum(n) ~= b:checksum(n) then return false, n end
  end
  return true
end
local WEIGHTS = {"stem.weight", "head.weight", "head.bias"}

do -- same shapes: steps alternating between two programs of one group equal one program's steps bitwise
  for _, opts in ipairs{{}, {accumulate = 2}, {max_grad_norm = 0.1}} do
    local label = next(opts) and (next(opts) .. "=" .. tostring(opts[next(opts)])) or "plain"
    local one = build(2, 6, 6, opts)
    local a = build(2, 6, 6, opts)
    local bopts = {share = a}
    for k, v in pairs(opts) do bopts[k] = v end
    local b = build(2, 6, 6, bopts)
    for s = 1, 6 do
      local x, y = batch(2, 6, 6)
      one:set("x", x); one:set("y", y); one:step()
      local p = s % 2 == 1 and a or b
      p:set("x", x); p:set("y", y); p:step()
    end
    local same, n = same_bits(one, a, WEIGHTS)
    T.ok(same, label .. ": 6 steps alternating between two sharing programs equal 6 steps of one" ..
      (n and (" (" .. n .. " differs)") or ""))
    T.ok(same_bits(a, b, WEIGHTS), label .. ": both programs read the one set of weights")
    T.ok(a.steps == 6 and b.steps == 6 and a.updates == one.updates and b.updates == one.updates,
      string.format("%s: the group counts steps and updates once (steps %d/%d, updates %d/%d, want %d)", label,
        a.steps, b.steps, a.updates, b.updates, one.updates))
  end
end

do -- different shapes: one arena, as large as the largest program needs; weights trained by both
  local a = build(2, 4, 4)
  local w0 = a:get("head.weight")
  local b = build(1, 12, 8, {share = a})
  local c = build(2, 8, 8, {share = a})
  local pa, pb, pc = a:plan(), b:plan(), c:plan()
  local most = math.max(pa.arena, pb.arena, pc.arena)
  T.ok(pa.group_arena == most and pb.group_arena == most and pc.group_arena == most,
    string.format("the group's arena is the largest program's (%d, %d, %d -> %d)", pa.arena, pb.arena, pc.arena,
      pa.group_arena))
  T.ok(pb.shared == pa.persistent and pb.persistent > pb.shared,
    string.format("the shared region is the first program's persistent bytes (%d), a member's own inputs above it",
      pa.persistent))
  local x, y = batch(1, 12, 8)
  b:set("x", x); b:set("y", y); b:step()
  local w1 = a:get("head.weight")
  local moved = false
  for i = 1, #w0 do moved = moved or w0[i] ~= w1[i] end
  T.ok(moved, "a step of one program moves the weights the first reads")
  x, y = batch(2, 8, 8)
  c:set("x", x); c:set("y", y)
  local l = c:step()
  T.ok(l == l and a.steps == 2, "a third program of another shape trains the same weights (step 2)")
  -- the first closed, the others keep the arena and the weights
  local before = b:checksum("head.weight")
  do local first <close> = a end
  T.ok(not pcall(function() return a:checksum("head.weight") end), "the first program is closed")
  T.ok(b:checksum("head.weight") == before, "closing the first program leaves the shared weights to the others")
  x, y = batch(1, 12, 8)
  b:set("x", x); b:set("y", y)
  local l2 = b:step()
  T.ok(l2 == l2 and b.steps == 3, "a member still trains after the first is gone")
end

do -- plan-only groups plan the same sizes
  local a = build(2, 4, 4, {plan_only = true})
  local b = build(1, 12, 8, {plan_only = true, share = a})
  local ra = build(2, 4, 4)
  local rb = build(1, 12, 8, {share = ra})
  T.ok(a:plan().group_arena == ra:plan().group_arena and b:plan().arena == rb:plan().arena,
    "a plan-only group plans the bytes a runnable one allocates")
end

do -- refused: a weight of its own, a mismatched shape, mixing plan-only and runnable
  local a = build(2, 4, 4)
  local g = ck.graph()
  local x = g:input("x", {1, 3, 4, 4})
  local y = g:input("y", {1, 4, 4, 4})
  local extra = g:param("other.weight", {4, 3, 3, 3})
  local ok, err = pcall(function() return g:compile{loss = ck.mse_loss(ck.conv2d(x, extra, nil, {padding = 1}), y), share = a} end)
  T.ok(not ok and tostring(err):find("'other.weight'", 1, true) and tostring(err):find("may add inputs and frozen weights only", 1, true),
    "a sharing program with a trainable weight of its own is refused, naming it (" .. tostring(err) .. ")")
  local g2 = ck.graph()
  local x2 = g2:input("x", {1, 3, 4, 4})
  local y2 = g2:input("y", {1, 4, 4, 4})
  local stem = g2:param("stem.weight", {8, 3, 5, 5}, {trainable = false})
  local head = g2:param("head.weight", {4, 8, 3, 3})
  local hb = g2:param("head.bias", {4})
  local out = ck.conv2d(ck.silu(ck.conv2d(x2, stem, nil, {padding = 2})), head, hb, {padding = 1})
  ok, err = pcall(function() return g2:compile{loss = ck.mse_loss(out, y2), share = a} end)
  T.ok(not ok and tostring(err):find("'stem.weight'", 1, true) and tostring(err):find("differs", 1, true),
    "a frozen weight of another shape than the group's is refused, naming it (" .. tostring(err) .. ")")
  ok, err = pcall(build, 2, 4, 4, {plan_only = true, share = a})
  T.ok(not ok and tostring(err):find("plan-only", 1, true), "a plan-only program cannot join a runnable group")
  ok, err = pcall(build, 2, 4, 4, {share = "a"})
  T.ok(not ok, "share must be a program")
end

do -- a member's own frozen weights: a decoder after the shared stem, forward only
  local a = build(2, 4, 4)
  local g = ck.graph()
  local x = g:input("x", {1, 3, 4, 4})
  local stem = g:param("stem.weight", {8, 3, 3, 3}, {trainable = false})
  local dec = g:param("decoder.weight", {3, 8, 3, 3}, {trainable = false, init = "normal", std = 0.2})
  local y = ck.conv2d(ck.silu(ck.conv2d(x, stem, nil, {padding = 1})), dec, nil, {padding = 1})
  local d = g:compile{outputs = {y}, optimizer = "none", share = a, seed = 3}
  local pl, dp = a:plan(), d:plan()
  T.ok(dp.shared and dp.group_arena >= dp.arena and dp.group_arena >= pl.arena,
    "the group's arena holds the member with its own weight")
  local xs = T.random_values(r, 3 * 16)
  local dw = d:get("decoder.weight")
  d:set("x", xs)
  d:forward()
  local first = d:get(y)
  -- the shared stem changes nothing it holds of its own; a step of the first program overwrites the region above
  local function step_a()
    local bx, by = batch(2, 4, 4)
    a:set("x", bx)
    a:set("y", by)
    a:step()
  end
  local function equal(u, v)
    if #u ~= #v then return false end
    for i = 1, #u do if u[i] ~= v[i] then return false end end
    return true
  end
  step_a()
  d:set("x", xs)
  local ok, err = pcall(d.forward, d)
  T.ok(not ok and tostring(err):find("'decoder.weight'", 1, true) and tostring(err):find("load it again", 1, true),
    "after another member ran, the member's own weight is refused, naming it (" .. tostring(err) .. ")")
  d:init_own()
  d:set("x", xs)
  d:forward()
  local stem_now = a:get("stem.weight")
  T.ok(equal(d:get("decoder.weight"), dw), "init_own gives the own weight its compiled values again")
  -- the frozen stem did not train, so the output is the first one again
  T.ok(equal(d:get(y), first), "with its weight restored, the member computes what it did before")
  step_a()
  d:set("decoder.weight", dw) -- writing the weight itself is as good
  d:set("x", xs)
  d:forward()
  T.ok(equal(d:get(y), first), "a member whose own weight was written again runs")
  T.ok(#stem_now == 8 * 27, "the shared stem is read through either member")
end

T.done()
