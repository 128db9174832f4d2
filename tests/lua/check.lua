-- Small assertion helpers shared by the Lua tests: each check prints one line,
-- done() prints "N passed, N failed" and raises when anything failed.
local M = {passed = 0, failed = 0}

function M.ok(cond, what)
  if cond then
    M.passed = M.passed + 1
    print("ok   " .. what)
  else
    M.failed = M.failed + 1
    print("FAIL " .. what)
  end
  return cond
end

function M.done()
  print(string.format("%d passed, %d failed", M.passed, M.failed))
  if M.failed > 0 then error(M.failed .. " checks failed", 0) end
end

-- deterministic pseudo-random numbers for test data (xorshift, independent of math.random)
function M.rng(seed)
  local s = seed * 2654435761 % 4294967296
  if s == 0 then s = 1 end
  return function(lo, hi)
    s = s ~ ((s << 13) & 0xffffffff)
    s = s ~ (s >> 17)
    s = s ~ ((s << 5) & 0xffffffff)
    local u = (s & 0xffffff) / 16777216
    return (lo or -1) + ((hi or 1) - (lo or -1)) * u
  end
end

function M.random_values(r, n, lo, hi)
  local t = {}
  for i = 1, n do t[i] = r(lo, hi) end
  return t
end

-- Sets each of `tensors` (in order) to values in [-1, 1) from M.rng(seed).
function M.set_random(p, seed, tensors)
  local r = M.rng(seed)
  for _, t in ipairs(tensors) do p:set(t, M.random_values(r, t.numel)) end
end

-- An SDXL-shaped UNet's training step on fixed random inputs: what is a config
-- name, a config or a module (ck.unet.build); shape {batch, height, width
-- (height), frozen}; opts, g:compile's options besides the loss (the mean
-- squared error against a random target). Returns g, p, x (the UNet's inputs), t.
function M.unet_step(what, shape, opts)
  local ck, unet = require "ck", require "ck.unet"
  local g = ck.graph()
  local _, y, x = unet.build(g, what, shape)
  local t = g:input("target", y.shape)
  local c = {loss = ck.mse_loss(y, t)}
  for k, v in pairs(opts or {}) do c[k] = v end
  local p = g:compile(c)
  local B, H = shape.batch, shape.height
  local W = shape.width or H
  M.set_random(p, 3, {x.sample, t, x.encoder_hidden_states, x.text_embeds})
  local ts, ids = {}, {}
  for b = 1, B do
    ts[b] = b == 1 and 17 or 901
    for _, v in ipairs{H * 8, W * 8, 0, 0, H * 8, W * 8} do ids[#ids + 1] = v end
  end
  p:set(x.timesteps, ts)
  p:set(x.time_ids, ids)
  return g, p, x, t
end

-- Every trainable parameter's gradient and value checksums, a line each
-- ("name=grad/value"): two programs whose digests agree trained alike, bitwise.
function M.param_digest(g, p)
  local sums = {}
  for _, prm in ipairs(g:params()) do
    if prm.kind == "param" then
      sums[#sums + 1] = prm.name .. "=" .. p:checksum(prm.name, "grad") .. "/" .. p:checksum(prm.name)
    end
  end
  return table.concat(sums, "\n")
end

-- The losses of n steps of p (2 by default), then M.param_digest.
function M.train_digest(g, p, n)
  local losses = {}
  for s = 1, n or 2 do losses[s] = p:step() end
  return table.concat(losses, " ") .. "\n" .. M.param_digest(g, p)
end

-- A two-layer MLP (3 -> 8 SiLU -> 2, mean squared error) on `batch` rows for
-- the optimizer tests. Returns the graph, its compile settings (the loss, then
-- those of `defaults`, then of `opts` over them: the test compiles, so that
-- errors name its line) and its input and target tensors; M.MLP_PARAMS names
-- its parameters.
M.MLP_PARAMS = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
function M.mlp(batch, defaults, opts)
  local ck = require "ck"
  local g = ck.graph()
  local x = g:input("x", {batch, 3})
  local t = g:input("t", {batch, 2})
  local h = ck.silu(ck.linear(x, g:param("l1.weight", {8, 3}), g:param("l1.bias", {8})))
  local y = ck.linear(h, g:param("l2.weight", {2, 8}), g:param("l2.bias", {2}))
  local c = {loss = ck.mse_loss(y, t)}
  for _, src in ipairs{defaults or {}, opts or {}} do
    for k, v in pairs(src) do c[k] = v end
  end
  return g, c, x, t
end

return M
