-- The pieces of the plan report (ck.plan): the --policies list, the JSON it
-- prints, the largest-batch search, the recompute share, the SVG timeline's
-- downsampling (peaks survive) and atomic writes.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local plan = require "ck.plan"
local policy = require "ck.policy"

---- --policies

do
  local list = plan.parse_policies("none, diffusers,budget:62%,blocks:mid_block,down_blocks.1,every_n:3")
  local names = {}
  for i, p in ipairs(list) do names[i] = policy.name(p) end
  T.ok(table.concat(names, " ") == "none diffusers budget:62% blocks:mid_block,down_blocks.1 every_n:3",
    "policy list parses, a comma inside blocks: continues its patterns (" .. table.concat(names, " ") .. ")")
  local ok, err = pcall(plan.parse_policies, "none,bogus")
  T.ok(not ok and err:match("^%-%-policies: unknown checkpoint policy 'bogus'") ~= nil,
    "an unknown policy name is one clear error without a file:line (" .. tostring(err) .. ")")
  ok, err = pcall(plan.parse_policies, " , ")
  T.ok(not ok and err:match("^%-%-policies:") ~= nil, "an empty policy list is an error")
end

---- JSON

do
  local s = plan.json(plan.object{{"a", 1}, {"b", "x\"y\\z\n\t\1"}, {"c", {1.5, 2 ^ 40, 0 / 0}}, {"d", true},
    {"skipped", nil}, {"e", plan.object{}}})
  T.ok(s == '{"a": 1, "b": "x\\"y\\\\z\\n\\t\\u0001", "c": [1.5, 1099511627776, null], "d": true, "e": {}}',
    "JSON: keys in order, strings escaped, whole floats as integers, NaN as null (" .. s .. ")")
end

---- the largest batch that fits

do
  local calls = 0
  local function linear(b) calls = calls + 1; return 10 + 3 * b end
  local r = plan.search_batch(linear, 40)
  T.ok(r.batch == 10 and r.peak == 40 and r.next == 11 and r.next_peak == 43,
    string.format("batch search: the largest batch at or under the limit, and the next one over (%s, %s)", r.batch, r.next))
  T.ok(calls <= 10, "batch search: doubling then bisection plans few batches (" .. calls .. ")")
  r = plan.search_batch(linear, 12)
  T.ok(r.batch == 0 and r.first.peak == 13, "batch search: batch 0 when even batch 1 does not fit")
  -- a percentage budget: small batches cannot be planned, larger ones can
  local function pct(b)
    if b < 5 then return nil, "budget: nothing fits", 20 + b end
    return 10 + 3 * b
  end
  r = plan.search_batch(pct, 40)
  T.ok(r.batch == 10, "batch search: a budget that plans only from batch 5 on still finds batch 10 (" .. r.batch .. ")")
  calls = 0
  local function never(b) calls = calls + 1; return nil, "budget: nothing fits", 100 + b end
  r = plan.search_batch(never, 40)
  T.ok(r.batch == 0 and calls == 1 and r.first.err:match("nothing fits"),
    "batch search: stops when the smallest plannable peak is over the limit")
  r = plan.search_batch(function() return 1 end, 10)
  T.ok(r.capped and r.batch >= 1024, "batch search: a batch that always fits stops at a cap (" .. r.batch .. ")")
end

---- recompute share from a real plan

do
  local g = ck.graph()
  local x = g:input("x", {64, 32})
  local h = x
  for i = 1, 4 do h = ck.silu(ck.linear(h, g:param("l" .. i, {32, 32}))) end
  local loss = ck.mean(h * h)
  local p = g:compile{loss = loss, optimizer = "adamw", checkpoint = policy.selective(), plan_only = true}
  local s = plan.summary(p)
  local pl = p:plan()
  T.ok(s.recompute_flops > 0 and math.abs(s.recompute_pct - 100 * pl.recompute_flops / (pl.step_flops - pl.recompute_flops)) < 1e-9,
    string.format("recompute share is of the step without recompute (%.2f%%)", s.recompute_pct))
  local tl = p:timeline()
  local svg = plan.timeline_svg({{name = "selective", summary = s, timeline = tl}, {name = "broken", error = "no"}})
  local _, panels = svg:gsub('<g class="panel"', "")
  T.ok(panels == 2, "timeline SVG: one panel per policy, a failed one included")
  T.ok(svg:find("fill=\"#f28e2b\"", 1, true) ~= nil and svg:find(">recompute</text>", 1, true) ~= nil,
    "timeline SVG: recompute regions and recomputed bytes are drawn")
end

---- downsampling keeps the peak

do
  local n = 13000
  local tl = {phase = {}, frozen = {}, activations = {}, workspace = {}}
  for i = 1, n do
    tl.phase[i] = i <= 5000 and "forward" or (i <= 12000 and "backward" or "optimizer")
    tl.frozen[i] = 100 * 2 ^ 20
    tl.activations[i] = (i <= 5000 and i or 10000 - i) * 2 ^ 12
    tl.workspace[i] = 0
  end
  tl.workspace[4321] = 300 * 2 ^ 20 -- one op's spike, far above the rest
  local peak = tl.frozen[1] + tl.activations[4321] + tl.workspace[4321]
  local svg = plan.timeline_svg({{name = "synthetic", timeline = tl,
    summary = {peak = peak, activation_bytes = 0, recompute_pct = 0}}})
  local most, top_y = 0, math.huge
  for d in svg:gmatch('<path class="cat" d="([^"]*)"') do
    local pts = 0
    for _ in d:gmatch("[MVH]") do pts = pts + 1 end
    most = math.max(most, pts)
  end
  -- the first path drawn is the top of the stack
  local d = svg:match('<path class="cat" d="([^"]*)"')
  for y in d:gmatch("V([%d.]+)") do top_y = math.min(top_y, tonumber(y)) end
  local cy = tonumber(svg:match('<circle cx="[%d.]+" cy="([%d.]+)"'))
  T.ok(most <= 2000, "timeline SVG: 13000 ops draw at most 2000 points per layer, closing ones included (" .. most .. ")")
  T.ok(math.abs(top_y - cy) < 0.11, string.format("timeline SVG: a one-op spike survives downsampling (top %.1f, peak %.1f)", top_y, cy))
end

---- atomic writes

do
  -- under the working directory: the sandbox lets scripts write there
  local dir = string.format("out/.test_plan_report_%d", math.floor(ck.now() * 1e6))
  local path = dir .. "/sub/out.svg"
  plan.write_atomic(path, "<svg/>")
  local f = io.open(path)
  T.ok(f and f:read("a") == "<svg/>" and io.open(path .. ".tmp") == nil, "write_atomic: the file is written, no .tmp left")
  if f then f:close() end
  local ok = pcall(plan.write_atomic, dir .. "/sub", "x") -- a directory stands there
  local g = io.open(path)
  T.ok(not ok and g and g:read("a") == "<svg/>" and io.open(dir .. "/sub.tmp") == nil,
    "write_atomic: a failed write raises, leaves no .tmp, and damages nothing")
  if g then g:close() end
  os.remove(path)
  os.remove(dir .. "/sub")
  os.remove(dir)
end

T.done()
