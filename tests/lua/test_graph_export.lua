-- plan.export_graph: the training list as JSON for an external solver. The
-- file, read back with ck.json_decode, agrees with the programs' own plans:
-- op and tensor counts, FLOPs, held activation bytes, producers and
-- consumers, and each policy's recompute set, peak and recompute FLOPs.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local plan = require "ck.plan"
local policy = require "ck.policy"

local function build(pol)
  local g = ck.graph()
  local x = g:input("x", {16, 8})
  local t = g:input("t", {16, 1})
  local h = x
  for i = 1, 3 do
    h = g:scope("block" .. i, function()
      local y = ck.linear(h, g:param("w", {8, 8}), g:param("b", {8}))
      return ck.silu(y) + h
    end)
  end
  local loss = ck.mse_loss(ck.linear(h, g:param("out", {1, 8})), t)
  return g:compile{loss = loss, optimizer = "adamw", checkpoint = pol, plan_only = true}
end

local dir = string.format("out/.test_graph_export_%d", math.floor(ck.now() * 1e6))
local path = dir .. "/graph.json"
local pols = {policy.none(), policy.selective(), policy.blocks{"block2"}}
plan.export_graph(path, build, pols, {info = {{"model", "mlp"}}})
local f = assert(io.open(path))
local doc = ck.json_decode(f:read("a"))
f:close()

local base = build(policy.none())
local pl = base:plan()
T.ok(doc.schema == "ckrun.graph/1" and doc.info.model == "mlp" and doc.base_policy == "none",
  "the file names its schema, the info given and the base policy")
T.ok(#doc.ops == pl.ops and doc.peak_bytes == pl.peak and doc.persistent_bytes == pl.persistent,
  string.format("one op per entry of the training list (%d), the plan's peak and persistent bytes", #doc.ops))

local flops, phases = 0, {}
for i, op in ipairs(doc.ops) do
  flops = flops + op.flops
  phases[op.phase] = (phases[op.phase] or 0) + 1
  if op.index ~= i - 1 or type(op.op) ~= "string" or not op.where:match("test_graph_export%.lua:%d+") then
    phases.bad = op
  end
end
T.ok(math.abs(flops - pl.step_flops) <= 1e-9 * pl.step_flops and not phases.bad and phases.forward and phases.backward
  and phases.optimizer and not phases.recompute,
  "ops carry their index, op name and script line; their FLOPs sum to the step's; none recomputes under none")

local by_id, act_bytes, turn = {}, 0, nil
for _, t in ipairs(doc.tensors) do by_id[t.id] = t end
for i, op in ipairs(doc.ops) do
  if op.phase ~= "forward" then turn = i - 1; break end
end
local links_ok, outbytes_ok = true, true
for _, op in ipairs(doc.ops) do
  local sum = 0
  for _, id in ipairs(op.outputs) do
    local t = by_id[id]
    local listed = false
    for _, q in ipairs(t and t.producers or {}) do listed = listed or q == op.index end
    links_ok = links_ok and listed
    sum = sum + (t and t.bytes or 0)
  end
  outbytes_ok = outbytes_ok and sum == op.out_bytes
end
for _, t in ipairs(doc.tensors) do
  for _, c in ipairs(t.consumers) do
    local reads = false
    for _, id in ipairs(doc.ops[c + 1].inputs) do reads = reads or id == t.id end
    links_ok = links_ok and reads
  end
  -- a forward activation still live at the turn to backward is held for it
  local first = t.producers[1] or 0
  local last = t.consumers[#t.consumers] or first
  if t.retained then last = #doc.ops end
  if t.category == "activations" and t.producers[1] and first < turn and last >= turn then act_bytes = act_bytes + t.bytes end
end
T.ok(links_ok, "every consumer reads the tensor as an input, every producer writes it as an output")
T.ok(outbytes_ok, "an op's out_bytes is the bytes of its outputs")
T.ok(act_bytes == pl.activation_bytes,
  string.format("activations live across the turn to backward sum to the plan's bytes held for backward (%d, %d)",
    act_bytes, pl.activation_bytes))

T.ok(#doc.policies == 3, "one entry per policy compared")
for k, pol in ipairs(pols) do
  local p = build(pol)
  local ppl, gr = p:plan(), p:graph()
  local e = doc.policies[k]
  local want = {}
  for _, t in ipairs(gr.tensors) do
    if t.kind == "recomputed" then want[#want + 1] = t.origin end
  end
  table.sort(want)
  local same = #want == #e.recomputed
  for i = 1, #want do same = same and want[i] == e.recomputed[i] and by_id[want[i]] ~= nil end
  T.ok(e.name == policy.name(pol) and e.peak_bytes == ppl.peak and e.recompute_flops == ppl.recompute_flops and
    e.recompute_ops == ppl.recompute_ops and same and (k == 1) == (#want == 0),
    string.format("%s: its peak, recompute FLOPs and ops are p:plan()'s, its recompute set (%d tensors) is its list's copies",
      e.name, #e.recomputed))
end

local ok, err = pcall(plan.export_graph, dir .. "/bad.json", build, {policy.budget(1)})
f = io.open(dir .. "/bad.json")
local bad = f and ck.json_decode(f:read("a"))
if f then f:close() end
T.ok(ok and bad and bad.policies[1].error and bad.policies[1].error:match("budget"),
  "a policy that cannot be planned keeps its error in its entry (" .. tostring(bad and bad.policies[1].error or err) .. ")")

-- the --plan report writes the same file for the policies it compares
plan.report{info = {{"model", "mlp"}}, program = build(policy.none()), checkpoint = policy.none(), batch = 16,
  build = function(_, pol) return build(pol) end, policies = {policy.none(), policy.selective()},
  export_graph = dir .. "/report.json"}
f = io.open(dir .. "/report.json")
local rep = f and ck.json_decode(f:read("a"))
if f then f:close() end
T.ok(rep and #rep.ops == #doc.ops and #rep.policies == 2 and rep.policies[2].name == "selective" and
  table.concat(rep.policies[2].recomputed, ",") == table.concat(doc.policies[2].recomputed, ","),
  "plan.report{export_graph = FILE} (ckrun --plan --export-graph) writes the graph and the policies it compares")

for _, name in ipairs{"graph.json", "bad.json", "report.json"} do os.remove(dir .. "/" .. name) end
os.remove(dir)
T.done()
