-- The budget search against the exact solver (--checkpoint optimal) on one
-- SDXL LoRA training step, plan only: for each budget (a share of none's
-- peak), the recompute FLOPs of each as a share of the forward FLOPs, the
-- solver's lower bound and the gap; with --gpu, the joint search's predicted
-- step time (--offload auto) beside the optimum's. bench/optimal_table.sh runs it.
--
--   ckrun bench/optimal_table.lua --size tiny --budgets 90,80,70 --optimal-seconds 60
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local options = require "ck.options"

local o = options.parse(args, {
  about = "the budget search's recompute against the exact solver's, per budget, on an SDXL LoRA step (plan only)",
  {"size", "choice", "tiny", "the UNet: sdxl-tiny, sdxl-mid or SDXL", choices = {"tiny", "mid", "full"}},
  {"resolution", "integer", function(v) return v.size == "tiny" and 256 or 1024 end, "image side in pixels",
   shown = "256 with --size tiny, else 1024", min = 64},
  {"budgets", "string", "90,80,70,62,55", "budgets in percent of none's peak, comma-separated"},
  {"optimal-seconds", "number", 60, "the solver's time limit per budget, in seconds", min = 1},
  {"marks", "flag", false, "also write to stderr what each recomputes that the other keeps, by op and block"},
  {"gpu", "string", nil, "also the joint search (--offload auto) and the optimum's predicted step time on this "
   .. "card's figures", arg = "NAME"},
})
if not o then return end

local config = unet.config(({tiny = "sdxl-tiny", mid = "sdxl-mid", full = "sdxl"})[o.size])
local latent = o.resolution // 8

-- the plan under a policy, or nil and the one-line reason it is refused
local function plan(pol, offload)
  local ok, r = pcall(sdxl.training_step, {config = config, batch = 1, latent = {latent, latent},
                                           lora = {rank = 4, alpha = 4},
                                           compile = {checkpoint = pol, plan_only = true, offload = offload,
                                                      gpu = o.gpu}})
  if not ok then return nil, (tostring(r):gsub("^.-compile: ", "")) end
  local pl = r.program:plan()
  pl.program = r.program
  return pl
end

-- what a recomputes that b keeps: count, bytes, and by producing op and by block
local function differ(a, b)
  local ga, gb = a.program:graph(), b.program:graph()
  local inb, op_of = {}, {}
  for _, id in ipairs(gb.recomputed) do inb[id] = true end
  for _, e in ipairs(ga.ops) do
    if e.phase == "forward" then for _, t in ipairs(e.outputs) do op_of[t] = e.op end end
  end
  local n, bytes, by_op, by_block = 0, 0, {}, {}
  for _, id in ipairs(ga.recomputed) do
    if not inb[id] then
      local t = ga.tensors[id + 1]
      n, bytes = n + 1, bytes + t.bytes
      local op = op_of[id] or "?"
      local sc = t.scope or ""
      local block = sc:match("^([%w_]+%.%d+)") or sc:match("^([%w_]+)") or "?"
      by_op[op] = (by_op[op] or 0) + 1
      by_block[block] = (by_block[block] or 0) + 1
    end
  end
  local function list(t)
    local ks = {}
    for k, v in pairs(t) do ks[#ks + 1] = {k, v} end
    table.sort(ks, function(x, y) return x[2] > y[2] or (x[2] == y[2] and x[1] < y[1]) end)
    local out = {}
    for i, kv in ipairs(ks) do out[i] = kv[1] .. " " .. kv[2] end
    return table.concat(out, ", ")
  end
  return string.format("%d tensors, %.2f MiB; by op: %s; by block: %s", n, bytes / 2 ^ 20, list(by_op), list(by_block))
end

local none = assert(plan(policy.none()))
print(string.format("sdxl-%s %d px: none's peak %d bytes, %d ops; solver limit %g s per budget", o.size,
                    o.resolution, none.peak, none.ops, o["optimal-seconds"]))
local head = "| budget | `budget:` recomputes (% fwd) | optimal (% fwd) | lower bound (% fwd) | gap (points) | solver |"
if o.gpu then head = head .. " joint search, predicted step (s) | optimal, predicted step (s) |" end
print(head)
print(o.gpu and "|---|---|---|---|---|---|---|---|" or "|---|---|---|---|---|---|")
local fwd
for b in o.budgets:gmatch("[^,]+") do
  local s, serr = plan(policy.budget(b .. "%"))
  local opt, oerr = plan(policy.optimal(b .. "%", o["optimal-seconds"]))
  local d = opt and opt.decision or ""
  local f = tonumber(d:match("of forward FLOPs ([%d.e+]+)"))
  fwd = f or fwd
  local function pct(p) return p and fwd and string.format("%.2f", 100 * p.recompute_flops / fwd) or "does not fit" end
  local lb = d:match("lower bound ([%d.]+)%%")
  local gap = s and opt and fwd and string.format("%.2f", 100 * (s.recompute_flops - opt.recompute_flops) / fwd) or "-"
  local how = not opt and "-" or ((d:match("proven") and "proven" or "time limit") .. "; " ..
    (d:match("the budget search's decision") and "search's decision" or "solver's decision") ..
    (d:match("decision polished") and ", polished" or ""))
  local row = string.format("| %s%% | %s | %s | %s | %s | %s |", b, pct(s), pct(opt), lb or "-", gap, how)
  if o.gpu then
    local j = plan(policy.budget(b .. "%"), "auto")
    row = row .. string.format(" %s | %s |", j and string.format("%.4f", j.predicted_step_seconds) or "does not fit",
                               opt and string.format("%.4f", opt.predicted_step_seconds) or "-")
  end
  print(row)
  io.stderr:write(b, "%: ", d ~= "" and d or tostring(oerr or serr), "\n")
  if o.marks and s and opt then
    io.stderr:write("  optimal recomputes, budget: keeps: ", differ(opt, s), "\n")
    io.stderr:write("  budget: recomputes, optimal keeps: ", differ(s, opt), "\n")
  end
end
