-- The budget policy equals exhaustive search on graphs small enough to
-- enumerate: random DAGs, chains and U-shaped graphs with skip connections.
-- The search here is independent of the C one: every subset of candidates is
-- compiled through a Lua function policy, and for each budget (every distinct
-- peak the subsets reach) the least recompute FLOPs that fits is compared with
-- what policy.budget chose.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local policy = require "ck.policy"

local r = T.rng(11)

-- a chain: linear, silu, linear, silu, ... then a loss
local function chain(g, x, n)
  local h = x
  for i = 1, n do
    g:push_scope("layer" .. i)
    if i % 2 == 1 then h = ck.linear(h, g:param("weight", {8, 8}))
    else h = ck.silu(h) end
    g:pop_scope()
  end
  return h
end

-- a random DAG: each node combines one or two earlier tensors of different
-- widths; shape[i] = {kind, a, b, width} drawn once, so every build of one
-- graph is the same graph
local WIDTHS = {4, 16, 48}
local function random_shape(n)
  local s = {}
  for i = 1, n do
    s[i] = {i == 1 and 0 or math.floor(r(0, 1) * 4) % 4, 1 + math.floor(r(0, 1) * i) % i, 1 + math.floor(r(0, 1) * i) % i,
            WIDTHS[1 + math.floor(r(0, 1) * 3) % 3]}
  end
  return s
end

local function dag(g, x, shape)
  local ts = {x}
  for i = 1, #shape do
    g:push_scope("node" .. i)
    local kind, a, b, width = shape[i][1], ts[shape[i][2]], ts[shape[i][3]], shape[i][4]
    local h
    if kind == 0 or (kind >= 2 and a.shape[2] ~= b.shape[2]) then
      h = ck.linear(a, g:param("weight", {width, a.shape[2]}))
    elseif kind == 1 then h = ck.silu(a)
    elseif kind == 2 then h = a + b
    else h = ck.mul(a, b) end
    ts[#ts + 1] = h
    g:pop_scope()
  end
  -- every sink (a tensor nothing reads) reaches the loss
  local used = {}
  for i = 1, #shape do used[shape[i][2]] = true; used[shape[i][3]] = true end
  local out
  for i = 2, #ts do
    if not used[i] then out = out and (out + ck.mean(ts[i])) or ck.mean(ts[i]) end
  end
  return ck.reshape(out, {1})
end

-- a U: down convolutions, a middle, up convolutions that add the skips
local function ushape(g, x)
  local skips, h = {}, x
  for i = 1, 2 do
    g:push_scope("down" .. i)
    h = ck.silu(ck.conv2d(h, g:param("weight", {4, 4, 3, 3}), nil, {padding = 1}))
    skips[i] = h
    g:pop_scope()
  end
  g:push_scope("mid")
  h = ck.conv2d(h, g:param("weight", {4, 4, 3, 3}), nil, {padding = 1})
  g:pop_scope()
  for i = 2, 1, -1 do
    g:push_scope("up" .. i)
    h = ck.silu(ck.conv2d(h + skips[i], g:param("weight", {4, 4, 3, 3}), nil, {padding = 1}))
    g:pop_scope()
  end
  return h
end

local function make(kind, n)
  local shape = kind == "dag" and random_shape(n)
  return function(checkpoint)
    local g = ck.graph()
    local x, y
    if kind == "ushape" then
      x = g:input("x", {1, 4, 6, 6})
      y = ushape(g, x)
    else
      x = g:input("x", {96, 8})
      y = kind == "chain" and chain(g, x, n) or dag(g, x, shape)
    end
    local loss = ck.mean(y)
    return g:compile{loss = loss, optimizer = "sgd", checkpoint = checkpoint, plan_only = true}
  end
end

local function check(name, build)
  -- how many candidates: a policy function is asked once per candidate
  local k = 0
  build(function() k = k + 1; return "save" end)
  assert(k <= 14, name .. ": too many candidates to enumerate: " .. k)
  local points = {}
  for mask = 0, (1 << k) - 1 do
    local i = 0
    local p = build(function()
      i = i + 1
      return (mask >> (i - 1)) & 1 == 1 and "recompute" or "save"
    end)
    local pl = p:plan()
    points[#points + 1] = {peak = pl.peak, flops = pl.recompute_flops}
  end
  local budgets, seen = {}, {}
  for _, pt in ipairs(points) do
    if not seen[pt.peak] then seen[pt.peak] = true; budgets[#budgets + 1] = pt.peak end
  end
  table.sort(budgets)
  local agree, worst = 0, nil
  for _, b in ipairs(budgets) do
    local best
    for _, pt in ipairs(points) do
      if pt.peak <= b and (not best or pt.flops < best) then best = pt.flops end
    end
    local pl = build(policy.budget(b)):plan()
    if pl.peak <= b and pl.recompute_flops == best then agree = agree + 1
    else worst = worst or string.format("budget %d: chose peak %d, %.0f FLOPs; exhaustive %.0f", b, pl.peak, pl.recompute_flops, best) end
  end
  T.ok(worst == nil, string.format("%s: %d candidates, %d subsets, budget equals exhaustive search at all %d distinct peaks%s",
    name, k, #points, #budgets, worst and (" (" .. worst .. ")") or ""))
  -- below the smallest peak nothing fits, and the error says so
  local ok, err = pcall(build, policy.budget(budgets[1] - 1))
  T.ok(not ok and tostring(err):find("nothing fits"), name .. ": a budget below every plan is refused")
end

check("chain of 8", make("chain", 8))
check("chain of 11", make("chain", 11))
-- random DAGs where the choice matters: few enough candidates to enumerate,
-- and recomputing everything moves the peak
local dags = 0
while dags < 5 do
  local build = make("dag", 6)
  local k = 0
  local keep = build(function() k = k + 1; return "save" end):plan().peak
  local redo = build(function() return "recompute" end):plan().peak
  if k <= 13 and redo ~= keep then
    dags = dags + 1
    check("random DAG " .. dags, build)
  end
end
check("U-shaped graph with skips", make("ushape"))

T.done()
