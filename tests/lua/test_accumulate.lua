-- Gradient accumulation, compile{accumulate = N}: each step adds its gradients
-- into persistent sums and every N-th step updates with their mean (then the
-- sums start over). N steps of batch b update the weights as one step of batch
-- N*b would (the loss is a mean, so its gradient is the mean of the halves');
-- steps between updates change no weight; clipping applies to the mean; a
-- step the guard skips adds nothing; recompute changes no bit; a program given
-- another's weights, sums and counters (a resume) continues bitwise.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"

local names = T.MLP_PARAMS
local B = 8
local r = T.rng(21)
local X, Y = T.random_values(r, 2 * B * 3), T.random_values(r, 2 * B * 2)
local function rows(v, from, n, w)
  local out = {}
  for i = 1, n * w do out[i] = v[(from - 1) * w + i] end
  return out
end

local function build(batch, opts)
  local g, c, x, t = T.mlp(batch, {optimizer = "sgd", lr = 0.5, weight_decay = 0, seed = 4}, opts)
  return g:compile(c), x, t
end

-- the first or second half of the big batch
local function feed(p, x, t, half)
  p:set(x, rows(X, (half - 1) * B + 1, B, 3))
  p:set(t, rows(Y, (half - 1) * B + 1, B, 2))
end

local function worst_diff(a, b)
  local w = 0
  for _, n in ipairs(names) do
    local va, vb = a:get(n), b:get(n)
    for i = 1, #va do w = math.max(w, math.abs(va[i] - vb[i]) / math.max(1e-3, math.abs(va[i]))) end
  end
  return w
end

local function same_bits(a, b)
  for _, n in ipairs(names) do
    if a:checksum(n) ~= b:checksum(n) then return false end
  end
  return true
end

for _, case in ipairs{{"sgd", {}}, {"adamw", {optimizer = "adamw"}}, {"adamw, clipped at 0.05", {optimizer = "adamw", max_grad_norm = 0.05}}} do
  local label, opts = case[1], case[2]
  local big, bx, bt = build(2 * B, opts)
  bx, bt = bx, bt
  big:set(bx, X)
  big:set(bt, Y)
  local acc_opts = {accumulate = 2}
  for k, v in pairs(opts) do acc_opts[k] = v end
  local small, sx, st = build(B, acc_opts)
  local w0 = small:get("l1.weight")
  feed(small, sx, st, 1)
  small:step()
  local unchanged = true
  for i, v in ipairs(small:get("l1.weight")) do unchanged = unchanged and v == w0[i] end
  T.ok(unchanged and small.updates == 0 and small.micro == 1,
    label .. ": the first of 2 accumulated steps changes no weight (updates 0, micro 1)")
  feed(small, sx, st, 2)
  small:step()
  big:step()
  local d = worst_diff(big, small)
  T.ok(small.updates == 1 and small.micro == 0 and d < 1e-5,
    string.format("%s: 2 steps of batch %d accumulated update as 1 step of batch %d (worst difference %.2g)",
      label, B, 2 * B, d))
  for half = 1, 2 do feed(small, sx, st, half); small:step() end -- the sums started over
  big:step()
  d = worst_diff(big, small)
  T.ok(small.updates == 2 and d < 2e-5, string.format("%s: and the next 2 as the next big step (%.2g)", label, d))
end

-- the guard: a non-finite step adds nothing to the sums
do
  local a, ax, at = build(B, {accumulate = 2})
  local b, bx, bt = build(B, {accumulate = 2})
  feed(a, ax, at, 1); a:step()
  feed(a, ax, at, 2); a:step()
  feed(b, bx, bt, 1); b:step{guard = true}
  local bad = rows(X, 1, B, 3)
  bad[1] = 0 / 0
  b:set(bx, bad)
  local _, info = b:step{guard = true}
  feed(b, bx, bt, 2); b:step{guard = true}
  T.ok(info.skipped and b.micro == 0 and b.updates == 1 and same_bits(a, b),
    "a step the guard skips adds nothing: the update after it is bitwise that of the two good steps")
end

-- recompute: bitwise
do
  local a, ax, at = build(B, {accumulate = 2, optimizer = "adamw"})
  local b, bx, bt = build(B, {accumulate = 2, optimizer = "adamw", checkpoint = function() return "recompute" end})
  for s = 1, 4 do
    feed(a, ax, at, (s - 1) % 2 + 1); a:step()
    feed(b, bx, bt, (s - 1) % 2 + 1); b:step()
  end
  T.ok(b:plan().recompute_ops > 0 and same_bits(a, b), "recompute under accumulation: weights bitwise those of none")
end

-- a resume between two accumulated steps: weights, sums, AdamW state and counters carried over
do
  local a, ax, at = build(B, {accumulate = 3, optimizer = "adamw"})
  local c, cx, ct = build(B, {accumulate = 3, optimizer = "adamw"})
  for s = 1, 4 do feed(a, ax, at, (s - 1) % 2 + 1); a:step() end -- 1 update, then 1 step summed
  for _, n in ipairs(a:state_tensors()) do c:set(n, a:get(n)) end
  c.steps, c.updates, c.micro = a.steps, a.updates, a.micro
  local held = false
  for _, n in ipairs(a:state_tensors()) do held = held or n:match("^grad_sum%.") ~= nil end
  for s = 5, 6 do
    feed(a, ax, at, (s - 1) % 2 + 1); a:step()
    feed(c, cx, ct, (s - 1) % 2 + 1); c:step()
  end
  T.ok(held and a.updates == 2 and c.updates == 2 and same_bits(a, c),
    "the gradient sums are state; a program given it mid-accumulation (micro 1) continues bitwise")
end

do -- the sums count as optimizer state in the plan
  local p1 = build(B)
  local p3 = build(B, {accumulate = 3})
  local params = (8 * 3 + 8 + 2 * 8 + 2) * 4
  T.ok(p3:plan().persistent - p1:plan().persistent >= params, string.format(
    "accumulate = 3 holds one fp32 sum per trainable value (%d more persistent bytes, %d values)",
    p3:plan().persistent - p1:plan().persistent, params / 4))
end

for _, bad in ipairs{0, 1.5, -2} do
  local ok, err = pcall(function() local p = build(B, {accumulate = bad}); return p end)
  T.ok(not ok and err:match("test_accumulate%.lua:%d+:") and err:match("accumulate must be"),
    "accumulate = " .. bad .. " is refused naming the line")
end
local ok, err = pcall(function() local p = build(B, {accumulate = 2, optimizer = "none"}); return p end)
T.ok(not ok and err:match("accumulate needs an optimizer"), "accumulate without an optimizer is refused: " .. tostring(err))
T.done()
