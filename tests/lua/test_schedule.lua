-- Learning-rate schedules (ck.optim.schedule), as diffusers' get_scheduler
-- gives them to a LambdaLR stepped after each optimizer step: the rate of step
-- k at points where each formula has a known value, and bad settings refused
-- with one error naming the calling line.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"
local optim = require "ck.optim"

local lr, W, N = 2e-3, 10, 110 -- N training steps, W of warmup: 100 decay steps
local function near(a, b) return math.abs(a - b) <= 1e-12 + 1e-9 * math.abs(b) end
local function at(name, k, extra)
  local o = {name = name, lr = lr, steps = N, warmup = W}
  for key, v in pairs(extra or {}) do o[key] = v end
  return optim.schedule(o)(k)
end

T.ok(at("constant", 0, {warmup = 0}) == lr and at("constant", 57, {warmup = 0}) == lr,
  "constant without warmup: the base rate from the first step")
for _, name in ipairs(optim.SCHEDULES) do
  T.ok(at(name, 0) == 0 and near(at(name, 5), lr / 2) and near(at(name, W), lr),
    name .. ": warmup rises linearly from 0 at the first step to the base rate at step W")
end
T.ok(at("constant_with_warmup", 109) == lr, "constant_with_warmup keeps the base rate after warmup")
T.ok(near(at("linear", 60), lr / 2) and near(at("linear", 85), lr / 4) and at("linear", 110) == 0,
  "linear: half at the middle of the decay, a quarter at 3/4, 0 at the last step")
T.ok(near(at("cosine", 60), lr / 2) and near(at("cosine", 35), lr * (1 + math.sqrt(0.5)) / 2) and
  near(at("cosine", 110), 0), "cosine: half at the middle, (1 + cos(pi/4))/2 at a quarter, 0 at the end")
T.ok(near(at("cosine_with_restarts", 60, {cycles = 2}), lr) and near(at("cosine_with_restarts", 35, {cycles = 2}), lr / 2)
  and at("cosine_with_restarts", 110, {cycles = 2}) == 0,
  "cosine_with_restarts, 2 cycles: half a quarter in, back to the base rate at the middle, 0 at the end")
local lr_end = 1e-7
T.ok(near(at("polynomial", 60, {power = 2}), (lr - lr_end) / 4 + lr_end) and
  near(at("polynomial", 200), lr_end), "polynomial, power 2: (lr - lr_end)/4 + lr_end at the middle, lr_end after the end")

local function refused(o, pattern)
  local ok, err = pcall(function() local f = optim.schedule(o); return f end)
  return not ok and err:match("test_schedule%.lua:%d+:") and err:match(pattern), err
end
T.ok(refused({name = "cosin", lr = lr, steps = N}, "unknown learning%-rate schedule 'cosin' %(constant,"),
  "an unknown schedule is refused naming the choices")
T.ok(refused({name = "cosine", lr = lr}, "needs the number of training steps"), "cosine without steps is refused")
T.ok(refused({name = "linear", lr = lr, steps = N, warmup = -1}, "warmup must be"), "a negative warmup is refused")
T.ok(refused({name = "constant", lr = 0}, "positive lr"), "a zero rate is refused")
T.done()
