-- The Lion optimizer, compile{optimizer = "lion"}: three steps against
-- lion-pytorch's update computed here in double from the raw gradients
-- (p *= 1 - lr*wd; p -= lr * sign(b1*m + (1 - b1)*g); m = b2*m + (1 - b2)*g),
-- its one moment as optimizer state (half AdamW's), its defaults (betas 0.9,
-- 0.99; no weight decay), and recompute bitwise.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"

local names = T.MLP_PARAMS
local function build(opts)
  local g, c, x, t = T.mlp(16, {optimizer = "lion", lr = 1e-2, seed = 4, keep_grads = true}, opts)
  local p = g:compile(c)
  T.set_random(p, 9, {x, t})
  return p
end

local function sign(v) return v > 0 and 1 or v < 0 and -1 or 0 end

for _, case in ipairs{{"defaults", {}, 0.9, 0.99, 0}, {"betas 0.95/0.98, weight decay 0.1",
                      {betas = {0.95, 0.98}, weight_decay = 0.1}, 0.95, 0.98, 0.1}} do
  local label, opts, b1, b2, wd = case[1], case[2], case[3], case[4], case[5]
  local p = build(opts)
  local w, m = {}, {}
  for _, n in ipairs(names) do
    w[n] = p:get(n)
    m[n] = {}
    for i = 1, #w[n] do m[n][i] = 0 end
  end
  local worst = 0
  for _ = 1, 3 do
    p:step()
    for _, n in ipairs(names) do
      local g, got = p:grad(n), p:get(n)
      for i = 1, #g do
        local c = b1 * m[n][i] + (1 - b1) * g[i]
        w[n][i] = w[n][i] * (1 - 1e-2 * wd) - 1e-2 * sign(c)
        m[n][i] = b2 * m[n][i] + (1 - b2) * g[i]
        worst = math.max(worst, math.abs(got[i] - w[n][i]))
      end
      for i = 1, #g do w[n][i] = got[i] end -- the next step starts from the program's weights
    end
  end
  T.ok(worst < 1e-6, string.format("lion, %s: 3 steps as lion-pytorch's update (largest difference %.2g)", label, worst))
end

do
  local pl, pa = build(), build{optimizer = "adamw"}
  local pn = build{optimizer = "sgd"}
  local lion_state = pl:plan().persistent - pn:plan().persistent
  local adam_state = pa:plan().persistent - pn:plan().persistent
  T.ok(lion_state > 0 and 2 * lion_state == adam_state, string.format(
    "Lion keeps one moment: %d bytes of optimizer state against AdamW's %d", lion_state, adam_state))
end

do
  local a, b = build(), build{checkpoint = function() return "recompute" end}
  for _ = 1, 3 do a:step(); b:step() end
  local same = b:plan().recompute_ops > 0
  for _, n in ipairs(names) do same = same and a:checksum(n) == b:checksum(n) end
  T.ok(same, "lion under full recompute: weights bitwise those of none")
end
T.done()
