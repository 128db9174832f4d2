-- The plan report of `ckrun --plan`: what a compiled program will use, without
-- running it. One row per checkpoint policy (--policies), the largest batch
-- that fits (--max-batch), a memory timeline as SVG (--svg), text or JSON.
local ck = require "ck"
local policy = require "ck.policy"
local svg = require "ck.svg"
local bytes = require "ck.bytes"
local errors = require "ck.errors"
local fit = require "ck.fit"

local M = {}

local MiB, GiB = 2 ^ 20, 2 ^ 30

-- bottom to top in the timeline: what lives all step first
M.CATEGORIES = {"frozen", "trainable", "optimizer_state", "inputs", "gradients", "activations", "recomputed",
                "workspace"}
M.COLORS = {frozen = "#9d9d9d", trainable = "#4e79a7", optimizer_state = "#76b7b2", inputs = "#edc948",
            gradients = "#e15759", activations = "#59a14f", recomputed = "#f28e2b", workspace = "#b07aa1"}
M.PHASES = {"forward", "recompute", "backward", "optimizer"}
M.PHASE_COLORS = {forward = "#4e79a7", recompute = "#f28e2b", backward = "#b07aa1", optimizer = "#7f7f7f"}
local SHORT = {frozen = "frozen", trainable = "trainable", optimizer_state = "optimizer", inputs = "inputs",
               gradients = "gradients", activations = "activations", recomputed = "recomputed", workspace = "workspace"}

---- small helpers, shared with scripts/policy_sweep.lua

-- shared with ck.fit and the scripts: ck.bytes's figures as text, ck.errors's
-- message without its file:line, ck.fit's batch search
M.strip_where = errors.strip_where
M.round_up = bytes.round_up
M.fmt_bytes = bytes.fmt
M.search_batch = fit.search_batch

-- JSON on one line for strings, numbers, booleans, lists, and objects given
-- as ordered lists of {key, value} pairs (tag them with M.object); NaN and
-- infinities as null, whole floats as integers (ck.json_encode)
M.object = ck.json_object
local JSON_OPTS = {spaced = true, nonfinite = "null", whole_floats = "integer"}
function M.json(v) return ck.json_encode(v, JSON_OPTS) end

-- write the whole file next to its final name, then rename: a reader never
-- sees half a file and an old file survives a failed write. Every failure
-- (the sandbox's refusals included) is one error naming the file.
local function try(f, ...)
  local ok, r, err = pcall(f, ...)
  if not ok then return nil, M.strip_where(r) end
  return r, err
end

function M.write_atomic(path, text)
  local tmp = path .. ".tmp"
  local f, err = try(io.open, tmp, "wb")
  local dir = path:match("^(.*)/[^/]*$")
  if not f and dir and dir ~= "" then -- perhaps the folder is missing
    if try(ck.mkdir, dir) then f, err = try(io.open, tmp, "wb") end
  end
  if not f then error("cannot write '" .. path .. "': " .. tostring(err), 0) end
  local ok, werr = f:write(text)
  local closed, cerr = f:close()
  if not ok or not closed then
    os.remove(tmp)
    error("cannot write '" .. path .. "': " .. tostring(werr or cerr), 0)
  end
  local renamed, rerr = try(os.rename, tmp, path)
  if not renamed then
    try(os.remove, tmp)
    error("cannot write '" .. path .. "': " .. tostring(rerr), 0)
  end
end

---- policies

local HEADS = {none = true, diffusers = true, selective = true, sqrt_n = true, every_n = true, budget = true,
               blocks = true, auto = true, optimal = true}

-- "none,diffusers,budget:62%,blocks:mid_block,down_blocks.2" -> policy tables.
-- A comma inside blocks:... continues its pattern list. An unknown name is an
-- error without a script line: it came from the command line.
-- the median of a list of numbers (nil for an empty one), for measured step times
function M.median(t)
  if #t == 0 then return nil end
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local m = (#s + 1) // 2
  if #s % 2 == 1 then return s[m] end
  return (s[m] + s[m + 1]) / 2
end

function M.parse_policies(s)
  local items = {}
  for piece in tostring(s):gmatch("[^,]+") do
    local a = piece:find("%S") -- trimmed in linear time ("^%s*(.-)%s*$" is quadratic in a run of spaces)
    local item = a and piece:match(".*%S", a) or ""
    local head = item:match("^([%w_]+)")
    if item ~= "" then
      if not HEADS[head] and #items > 0 and items[#items]:match("^blocks%s*:") then
        items[#items] = items[#items] .. "," .. item
      else
        items[#items + 1] = item
      end
    end
  end
  if #items == 0 then error("--policies: give a comma-separated list, e.g. none,diffusers,budget:62%", 0) end
  local list = {}
  for i, item in ipairs(items) do
    local ok, pol = pcall(policy.parse, item)
    if not ok then error("--policies: " .. M.strip_where(pol), 0) end
    list[i] = pol
  end
  return list
end

---- one policy's numbers

-- p:plan() as a flat summary; recompute_pct is recompute FLOPs as a share of
-- the step's FLOPs without recompute
function M.summary(p)
  local pl = p:plan()
  local base = pl.step_flops - pl.recompute_flops
  local device, fixed, granule = p:device()
  return {
    device = device, device_fixed = fixed, device_granule = granule, device_bytes = pl.device_bytes,
    peak = pl.peak, arena = pl.arena, live_peak = pl.live_peak, persistent = pl.persistent, transient = pl.transient,
    workspace = pl.workspace, ops = pl.ops, recompute_ops = pl.recompute_ops,
    activation_bytes = pl.activation_bytes, step_flops = pl.step_flops, recompute_flops = pl.recompute_flops,
    recompute_pct = base > 0 and 100 * pl.recompute_flops / base or 0, at_peak = pl.at_peak,
    group_arena = pl.group_arena, conv_workspace = pl.conv_workspace, conv_workspace_max = pl.conv_workspace_max,
    conv_rule = pl.conv_rule,
    -- the cost model's prediction (vm/plan/cost.c) and offload's host bytes
    predicted_step = pl.predicted_step_seconds, speed_of = pl.speed_of, speed_assumed = pl.speed_assumed, predicted_copies = pl.predicted_copy_seconds,
    predicted_stalled = pl.predicted_stall_seconds, host_bytes = pl.host_bytes, offload_bytes = pl.offload_bytes,
    transfers = pl.transfers, prefetch = pl.prefetch, decision = pl.decision,
    -- streamed frozen weights: their pinned bytes, and the bytes a step brings in
    weights_host_bytes = pl.weights_host_bytes, stream_bytes = pl.stream_bytes,
    streamed_trained_bytes = pl.streamed_trained_bytes, streamed_state_bytes = pl.streamed_state_bytes,
  }
end

---- the memory timeline as SVG

-- per bucket of consecutive ops, the op with the most live bytes: the stacked
-- total of a bucket is the true maximum over it, so peaks survive
local function downsample(tl, cats, n, buckets)
  local totals = {}
  for i = 1, n do
    local s = 0
    for _, c in ipairs(cats) do s = s + tl[c][i] end
    totals[i] = s
  end
  local nb = math.min(n, buckets)
  local out = {}
  for j = 1, nb do
    local a, b = (j - 1) * n // nb + 1, j * n // nb
    local best = a
    for i = a + 1, b do
      if totals[i] > totals[best] then best = i end
    end
    out[j] = {x0 = a - 1, x1 = b, op = best}
  end
  return out, totals
end

-- runs of equal phase: {phase, first op, last op}
local function phase_runs(phases)
  local runs = {}
  for i, ph in ipairs(phases) do
    local r = runs[#runs]
    if r and r[1] == ph then r[3] = i else runs[#runs + 1] = {ph, i, i} end
  end
  return runs
end

-- panels: {name =, timeline = p:timeline(), summary = M.summary(p)} or {name =, error =}.
-- opts: title, buckets (default 999: two points each, at most 2000 a layer).
function M.timeline_svg(panels, opts)
  opts = opts or {}
  local W, left, right = 1200, 90, 30
  local plot_w = W - left - right
  local top, panel_h, plot_h, strip_h = 78, 330, 230, 12
  local failed_h = 50
  local H = top + 10
  for _, pn in ipairs(panels) do H = H + (pn.summary and panel_h or failed_h) end
  local doc = svg.document(W, H, opts.title or "ckrun memory plan: live bytes over the op list", left, 22)
  local function add(...) doc:add(...) end
  -- legend: categories, then phases
  local lx = left
  for _, c in ipairs(M.CATEGORIES) do
    add('<rect x="%d" y="34" width="12" height="12" fill="%s"/><text x="%d" y="45">%s</text>\n', lx, M.COLORS[c],
      lx + 16, (c:gsub("_", " ")))
    lx = lx + 24 + 7 * #c
  end
  lx = left
  for _, ph in ipairs(M.PHASES) do
    add('<rect x="%d" y="54" width="12" height="12" fill="%s"/><text x="%d" y="65">%s</text>\n',
      lx, M.PHASE_COLORS[ph], lx + 16, ph)
    lx = lx + 30 + 7 * #ph
  end
  add('<line x1="%d" y1="60" x2="%d" y2="60" stroke="#d62728" stroke-width="1.5" stroke-dasharray="6,3"/>' ..
    '<text x="%d" y="65">planned peak (arena)</text>\n', lx + 10, lx + 40, lx + 46)

  -- one y scale for every panel, so panels compare at a glance
  local ymax = 0
  for _, pn in ipairs(panels) do
    if pn.summary then ymax = math.max(ymax, pn.summary.peak) end
  end
  ymax = ymax / MiB
  local ticks, _, ytop = svg.axis(ymax * 1.08, ymax * 1.02, 5)

  local y0 = top
  for k, pn in ipairs(panels) do
    local py0, py1 = y0 + 22 + strip_h + 4, y0 + 22 + strip_h + 4 + plot_h -- plot top and bottom
    add('<g class="panel" id="panel-%d">\n', k)
    if not pn.summary then
      add('<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>\n', left, y0 + 14, svg.escape(pn.name))
      add('<text x="%d" y="%d" fill="#d62728">not planned: %s</text>\n', left, y0 + 34, svg.escape(pn.error or "?"))
    else
      local s, tl = pn.summary, pn.timeline
      local n = #tl.phase
      add('<text x="%d" y="%d"><tspan font-size="14" font-weight="bold">%s</tspan>  peak %s, held for backward %s, ' ..
        'recompute %.1f%% of the step\'s FLOPs, %d ops</text>\n', left, y0 + 14, svg.escape(pn.name),
        M.fmt_bytes(s.peak), M.fmt_bytes(s.activation_bytes), s.recompute_pct, n)
      local function X(op) return left + plot_w * op / math.max(n, 1) end
      local function Y(bytes) return py1 - plot_h * (bytes / MiB) / ytop end
      -- phases: a strip above the plot and light bands behind it
      for _, r in ipairs(phase_runs(tl.phase)) do
        local x0, x1 = X(r[2] - 1), X(r[3])
        local wdt = math.max(x1 - x0, 0.5)
        local col = M.PHASE_COLORS[r[1]] or "#cccccc"
        add('<rect x="%.1f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s: ops %d-%d</title></rect>\n',
          x0, y0 + 22, wdt, strip_h, col, r[1], r[2], r[3])
        add('<rect x="%.1f" y="%d" width="%.2f" height="%d" fill="%s" fill-opacity="0.08"/>\n', x0, py0, wdt, plot_h, col)
      end
      -- grid and y axis (MiB)
      for _, v in ipairs(ticks) do
        local y = py1 - plot_h * v / ytop
        add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>' ..
          '<text x="%d" y="%.1f" text-anchor="end">%s</text>\n', left, y, left + plot_w, y, left - 6, y + 4, svg.fmt_tick(v))
      end
      add('<text transform="translate(%d,%d) rotate(-90)" text-anchor="middle">memory (MiB)</text>\n', left - 58,
        (py0 + py1) // 2)
      -- stacked categories: each drawn as the area under its cumulative top,
      -- highest first, so every path needs only one line of points
      local cats = {}
      for _, c in ipairs(M.CATEGORIES) do
        if tl[c] then cats[#cats + 1] = c end
      end
      local extra = {}
      for c in pairs(tl) do
        if c ~= "phase" and not M.COLORS[c] then extra[#extra + 1] = c end
      end
      table.sort(extra)
      for _, c in ipairs(extra) do cats[#cats + 1] = c end
      local buckets, totals = downsample(tl, cats, n, opts.buckets or 999)
      local layers, cum = {}, {}
      for j = 1, #buckets do cum[j] = 0 end
      for ci, c in ipairs(cats) do
        local any = false
        for j, bk in ipairs(buckets) do
          local v = tl[c][bk.op]
          if v > 0 then any = true end
          cum[j] = cum[j] + v
        end
        if any then
          local top_ = {}
          for j = 1, #buckets do top_[j] = cum[j] end
          layers[#layers + 1] = {name = c, top = top_, color = M.COLORS[c] or string.format("hsl(%d,50%%,60%%)", ci * 47)}
        end
      end
      for li = #layers, 1, -1 do
        local L = layers[li]
        -- a step per bucket; a run of buckets at one height is one segment
        local pts = {string.format("M%.1f,%.1f", X(0), py1)}
        local j = 1
        while j <= #buckets do
          local k, v = j, L.top[j]
          while k < #buckets and L.top[k + 1] == v do k = k + 1 end
          local y = Y(v)
          pts[#pts + 1] = string.format("V%.1fH%.1f", y, X(buckets[k].x1))
          j = k + 1
        end
        pts[#pts + 1] = string.format("V%.1fZ", py1)
        add('<path class="cat" d="%s" fill="%s" stroke="none"><title>%s</title></path>\n', table.concat(pts, " "),
          L.color, L.name)
      end
      -- x axis: op index
      add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>\n', left, py1, left + plot_w, py1)
      add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>\n', left, py0, left, py1)
      local xt = svg.ticks(n, 10)
      for _, v in ipairs(xt) do
        if v <= n then
          add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>\n',
            X(v), py1, X(v), py1 + 4, X(v), py1 + 17, svg.fmt_tick(v))
        end
      end
      add('<text x="%d" y="%d" text-anchor="middle">op (in execution order)</text>\n', left + plot_w // 2, py1 + 33)
      -- the planned peak (arena high-water mark) and where the live bytes top out
      local yp = Y(s.peak)
      add('<line class="peak" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-width="1.5" ' ..
        'stroke-dasharray="6,3"/>\n', left, yp, left + plot_w, yp)
      local at = 1
      for i = 2, n do
        if totals[i] > totals[at] then at = i end
      end
      local xa = X(at - 0.5)
      add('<circle cx="%.1f" cy="%.1f" r="4" fill="#d62728"/>\n', xa, Y(totals[at]))
      local label = string.format("peak %.1f MiB (live %.1f MiB at op %d, %s)", s.peak / MiB, totals[at] / MiB, at,
        tl.phase[at])
      local anchor = xa > left + plot_w * 0.6 and "end" or "start"
      add('<text x="%.1f" y="%.1f" fill="#d62728" text-anchor="%s">%s</text>\n', xa + (anchor == "end" and -8 or 8),
        yp - 6, anchor, svg.escape(label))
    end
    add('</g>\n')
    y0 = y0 + (pn.summary and panel_h or failed_h)
  end
  return doc:finish()
end

---- the graph for external solvers

M.GRAPH_SCHEMA = "ckrun.graph/1"

local function sorted_ids(t)
  local out = {}
  for i, v in ipairs(t) do out[i] = v end
  table.sort(out)
  return out
end

-- one policy's figures on the exported graph, from its program's p:graph()
local function policy_entry(name, gr, bytes_of)
  local rec, bytes, nrec = sorted_ids(gr.recomputed), 0, 0
  for _, id in ipairs(rec) do bytes = bytes + (bytes_of[id] or 0) end
  for _, op in ipairs(gr.ops) do
    if op.phase == "recompute" then nrec = nrec + 1 end
  end
  return ck.json_object{{"name", name}, {"peak_bytes", gr.peak}, {"live_peak_bytes", gr.live_peak},
    {"activation_bytes", gr.activation_bytes}, {"step_flops", gr.step_flops}, {"recompute_flops", gr.recompute_flops},
    {"ops", #gr.ops}, {"recompute_ops", nrec}, {"recomputed", rec}, {"recomputed_bytes", bytes}}
end

-- The training op list of a model as JSON at path (written whole, then
-- renamed), for a solver that picks what to recompute (Checkmate's MILP):
-- the ops and tensors of the list planned under policy none, and for each
-- policy compared which tensors it recomputes, its peak and recompute FLOPs.
-- model: a function(policy) -> program (plan_only will do), or a compiled
-- program (then its own list is the graph, and policies must be given as
-- {name =, graph = p:graph()}). policies: a list of policies, names
-- ("diffusers", "budget:62%") or {name =, graph =}; a string is a --policies list.
-- opts.info: {{key, value}, ...} recorded as "info". Returns the document.
function M.export_graph(path, model, policies, opts)
  opts = opts or {}
  local build = type(model) == "function" and model or nil
  local base = build and build(policy.none()) or model
  assert(base and base.graph, "plan.export_graph: give a program or a function(policy) -> program")
  local gr = base:graph()
  local bytes_of = {}
  for _, t in ipairs(gr.tensors) do bytes_of[t.origin or t.id] = bytes_of[t.origin or t.id] or t.bytes end
  if type(policies) == "string" then policies = M.parse_policies(policies) end
  local list = {}
  for _, pol in ipairs(policies or {}) do
    if type(pol) == "string" then pol = policy.parse(pol) end
    if type(pol) == "table" and pol.graph then
      list[#list + 1] = policy_entry(pol.name, pol.graph, bytes_of)
    else
      local name = policy.name(pol)
      if not build then
        list[#list + 1] = ck.json_object{{"name", name}, {"error", "export_graph was given a program, not a function(policy) that compiles one"}}
      else
        local ok, p = pcall(build, pol)
        if ok then list[#list + 1] = policy_entry(name, p:graph(), bytes_of)
        else list[#list + 1] = ck.json_object{{"name", name}, {"error", M.strip_where(p)}} end
      end
    end
  end
  local info = {}
  for _, kv in ipairs(opts.info or {}) do info[#info + 1] = {kv[1], kv[2]} end
  local doc = ck.json_object{
    {"schema", M.GRAPH_SCHEMA}, {"ckrun_version", ck.version}, {"info", ck.json_object(info)},
    {"base_policy", build and "none" or nil},
    {"peak_bytes", gr.peak}, {"live_peak_bytes", gr.live_peak}, {"persistent_bytes", gr.persistent},
    {"activation_bytes", gr.activation_bytes}, {"step_flops", gr.step_flops}, {"recompute_flops", gr.recompute_flops},
    {"ops", gr.ops}, {"tensors", gr.tensors}, {"policies", list},
  }
  M.write_atomic(path, ck.json_encode(doc) .. "\n")
  return doc
end

---- the report

local function own_name(o)
  if o.checkpoint == nil then return "none" end
  return policy.name(o.checkpoint)
end

-- plans every row; a policy that cannot be planned keeps its error in its row
local function plan_rows(o, list, want_timeline, want_graph)
  local rows = {}
  local own = own_name(o)
  for _, pol in ipairs(list) do
    local row = {name = policy.name(pol), policy = pol}
    local p
    if pol.kind == "auto" and o.build and not (row.name == own and o.program) then
      -- what --checkpoint auto chooses at this batch (ck.fit), planned as its row
      local ok, c = pcall(fit.choose, {build = o.build, checkpoint = pol, batch = o.batch})
      if ok then row.policy, row.auto = c.checkpoint, c.reason else row.error = M.strip_where(c) end
    end
    if row.error then -- nothing to plan: auto found nothing that fits
    elseif row.name == own and o.program then
      p = o.program
    elseif o.build then
      local ok, r = pcall(o.build, o.batch, row.policy)
      if ok then p = r else row.error = M.strip_where(r) end
    else
      row.error = "this script gives plan.report no build function, so it plans only its own policy"
    end
    if p then
      row.summary = M.summary(p)
      if want_timeline then row.timeline = p:timeline() end
      if want_graph then row.graph = p:graph() end
    end
    rows[#rows + 1] = row
  end
  return rows
end

local function max_batch(o, row, limit)
  local function peak_of(b)
    if b == o.batch and row.summary then return row.summary.peak end
    if not o.build then return nil, "this script gives plan.report no build function" end
    local pol, report = row.policy, {} -- the policy, with a table for the decision's figures
    if type(pol) == "table" then
      pol = {}
      for k, v in pairs(row.policy) do pol[k] = v end
      pol.report = report
    end
    local ok, p = pcall(o.build, b, pol)
    if not ok then return nil, M.strip_where(p), report.floor end
    local pk = p:plan().peak
    p = nil
    collectgarbage()
    return pk
  end
  return M.search_batch(peak_of, limit)
end

local function at_peak_object(ap)
  local t = {}
  for _, c in ipairs(M.CATEGORIES) do
    if ap[c] then t[#t + 1] = {c, ap[c]} end
  end
  return M.object(t)
end

local function print_json(o, rows, limit, svg)
  local parts = {}
  for _, kv in ipairs(o.info or {}) do parts[#parts + 1] = {kv[1], kv[2]} end
  local first
  for _, r in ipairs(rows) do
    if r.summary then first = r; break end
  end
  if first then
    local s = first.summary
    parts[#parts + 1] = {"checkpoint", first.name}
    parts[#parts + 1] = {"device", s.device}
    parts[#parts + 1] = {"device_fixed_bytes", s.device_fixed}
    parts[#parts + 1] = {"device_granule_bytes", s.device_granule}
    for _, k in ipairs{"peak", "arena", "group_arena", "live_peak", "persistent", "transient", "workspace"} do
      parts[#parts + 1] = {k .. "_bytes", s[k]}
    end
    parts[#parts + 1] = {"ops", s.ops}
    for _, kv in ipairs(require("ck.memory").json_fields(o.program)) do parts[#parts + 1] = kv end
  end
  if limit then
    parts[#parts + 1] = {"max_batch_limit_bytes", limit}
    if first and first.max_batch then parts[#parts + 1] = {"max_batch", first.max_batch.batch} end
  end
  local list = {}
  for _, r in ipairs(rows) do
    local e = {{"name", r.name}}
    if r.summary then
      local s = r.summary
      for _, kv in ipairs{{"peak_bytes", s.peak}, {"device_bytes", s.device_bytes}, {"live_peak_bytes", s.live_peak},
        {"persistent_bytes", s.persistent},
        {"transient_bytes", s.transient}, {"workspace_bytes", s.workspace},
        {"conv_workspace_bytes", s.conv_workspace}, {"conv_workspace_max_bytes", s.conv_workspace_max},
        {"activation_bytes", s.activation_bytes},
        {"step_flops", s.step_flops}, {"recompute_flops", s.recompute_flops}, {"recompute_pct", s.recompute_pct},
        {"ops", s.ops}, {"recompute_ops", s.recompute_ops}, {"at_peak", at_peak_object(s.at_peak)},
        {"predicted_step_seconds", s.predicted_step}, {"predicted_on", s.speed_of},
        {"predicted_on_assumed", s.speed_assumed},
        {"pinned_host_bytes", s.host_bytes and s.host_bytes + (s.weights_host_bytes or 0)},
        {"streamed_weights_bytes", s.weights_host_bytes}, {"stream_bytes", s.stream_bytes},
        -- of the streamed bytes, the trained weights' (--full) and the optimizer state's, where there are any
        {"streamed_trained_bytes", (s.streamed_trained_bytes or 0) > 0 and s.streamed_trained_bytes or nil},
        {"streamed_optimizer_state_bytes", (s.streamed_state_bytes or 0) > 0 and s.streamed_state_bytes or nil},
        {"offload_bytes", s.offload_bytes}, {"transfers", s.transfers},
        {"offload_decision", s.decision},
        {"fit", r.auto}} do
        e[#e + 1] = kv
      end
      local mb = r.max_batch
      if mb then
        e[#e + 1] = {"max_batch", mb.batch}
        e[#e + 1] = {"max_batch_peak_bytes", mb.peak}
        if mb.batch == 0 then
          e[#e + 1] = {"batch1_peak_bytes", mb.first.peak}
          e[#e + 1] = {"batch1_error", mb.first.err}
        elseif mb.next then
          e[#e + 1] = {"next_batch_peak_bytes", mb.next_peak}
          e[#e + 1] = {"next_batch_error", mb.next_error}
        end
        if mb.capped then e[#e + 1] = {"max_batch_capped", true} end
      end
    else
      e[#e + 1] = {"error", r.error}
    end
    list[#list + 1] = M.object(e)
  end
  parts[#parts + 1] = {"policies", list}
  if svg then parts[#parts + 1] = {"svg", svg} end
  print(M.json(M.object(parts)))
end

local function print_text(o, rows, limit, svg)
  for _, kv in ipairs(o.info or {}) do print(string.format("%-24s %s", kv[1], tostring(kv[2]))) end
  local first
  for _, r in ipairs(rows) do
    if r.summary then first = r; break end
  end
  if #rows == 1 then print(string.format("%-24s %s", "checkpoint", rows[1].name)) end
  if first then
    local s = first.summary
    local lbl = #rows > 1 and " (" .. first.name .. ")" or ""
    print(string.format("%-24s %s%s", "device", s.device,
      s.device_fixed > 0 and " (and " .. M.fmt_bytes(s.device_fixed) .. " of library workspace outside the plan)" or ""))
    if s.device_granule > 1 or s.device_fixed > 0 then
      print(string.format("%-24s %s%s: the arena in the allocator's %s pages, and the library workspace",
        "device memory", M.fmt_bytes(s.device_bytes), lbl, M.fmt_bytes(s.device_granule)))
    end
    if s.group_arena and s.group_arena > s.arena then -- programs sharing its weights need more (sampling, buckets)
      print(string.format("%-24s %s%s: the largest list the run's programs execute (this one's: %s, training, " ..
        "validation, logging)", "arena", M.fmt_bytes(s.group_arena), lbl, M.fmt_bytes(s.arena)))
    else
      print(string.format("%-24s %s%s: the largest list the run executes (training, validation, logging)", "arena",
        M.fmt_bytes(s.arena), lbl))
    end
    print(string.format("%-24s %s%s", "persistent", M.fmt_bytes(s.persistent), lbl))
    print(string.format("%-24s %s at the peak%s", "transient", M.fmt_bytes(s.transient), lbl))
    if s.device == "cuda" and s.conv_workspace > 0 then
      print(string.format("%-24s %s over the list's convolutions, the largest %s%s: %s", "conv workspace",
        M.fmt_bytes(s.conv_workspace), M.fmt_bytes(s.conv_workspace_max), lbl, s.conv_rule == "chosen" and
        "the algorithms chosen per shape on this device" or "the stated rule (no device: columns of one image, at most 32 MiB)"))
    end
    print(string.format("%-24s %d%s", "ops", s.ops, lbl))
    if s.predicted_step then
      print(string.format("%-24s %.4g s on %s's figures%s%s: a prediction from the cost model's table, not a " ..
        "measurement", "predicted step", s.predicted_step, s.speed_of,
        s.speed_assumed and " (the card not named: --gpu NAME)" or "", lbl))
    end
    if s.host_bytes and s.host_bytes > 0 then
      print(string.format("%-24s %s%s: %s offloaded each way in %d transfers, prefetch %d entries", "pinned host",
        M.fmt_bytes(s.host_bytes), lbl, M.fmt_bytes(s.offload_bytes), s.transfers, s.prefetch))
    end
    if s.weights_host_bytes and s.weights_host_bytes > 0 then
      -- the group's streamed bytes: frozen weights, trained weights (--full) and optimizer state
      local trained, state = s.streamed_trained_bytes or 0, s.streamed_state_bytes or 0
      local parts = {}
      for _, p in ipairs{{"frozen weights", s.weights_host_bytes - trained - state}, {"trained weights", trained},
                         {"optimizer state", state}} do
        if p[2] > 0 then parts[#parts + 1] = {M.fmt_bytes(p[2]), p[1]} end
      end
      local what = parts[1][2]
      if #parts > 1 then
        for k, p in ipairs(parts) do parts[k] = p[1] .. " " .. p[2] end
        what = "weights and optimizer state (" .. table.concat(parts, ", ") .. ")"
      end
      print(string.format("%-24s %s of %s in pinned host memory%s: %s brought in a step, prefetch %d entries",
        "streamed weights", M.fmt_bytes(s.weights_host_bytes), what, lbl, M.fmt_bytes(s.stream_bytes), s.prefetch))
    end
    if s.decision then print(string.format("%-24s %s", "offload", s.decision)) end
  end
  -- one unit for the whole table
  local big = 0
  for _, r in ipairs(rows) do
    if r.summary then big = math.max(big, r.summary.peak) end
  end
  local unit, uname = MiB, "MiB"
  if big >= 10 * GiB then unit, uname = GiB, "GiB" end
  local places = unit == GiB and 2 or 1
  local function cell(b, width)
    return string.format("%" .. (width or 12) .. "." .. places .. "f", M.round_up(b / unit, places))
  end
  local namew = 12
  for _, r in ipairs(rows) do namew = math.max(namew, #r.name) end
  local cols = {}
  for _, c in ipairs(M.CATEGORIES) do cols[#cols + 1] = string.format("%12s", SHORT[c]) end
  print("")
  -- the predicted step and the pinned host bytes, where the plan has them
  local timed, pinned = false, false
  for _, r in ipairs(rows) do
    if r.summary then
      timed = timed or r.summary.predicted_step ~= nil
      pinned = pinned or (r.summary.host_bytes or 0) + (r.summary.weights_host_bytes or 0) > 0
    end
  end
  local extra_head1 = (timed and string.format(" %10s", "step") or "") .. (pinned and string.format(" %10s", "pinned") or "")
  local extra_head2 = (timed and string.format(" %10s", "s (pred.)") or "") ..
    (pinned and string.format(" %10s", uname) or "")
  print(string.format("%-" .. namew .. "s %10s %10s %10s%s  | at the peak (%s):", "", "peak", "held for", "recompute",
    extra_head1, uname))
  print(string.format("%-" .. namew .. "s %10s %10s %10s%s  |%s", "policy", uname, "bwd " .. uname, "FLOPs",
    extra_head2, table.concat(cols)))
  for _, r in ipairs(rows) do
    if r.summary then
      local s = r.summary
      local cells = {}
      for _, c in ipairs(M.CATEGORIES) do cells[#cells + 1] = cell(s.at_peak[c] or 0) end
      local extra = (timed and (s.predicted_step and string.format(" %10.4g", s.predicted_step) or
        string.format(" %10s", "-")) or "") ..
        (pinned and cell((s.host_bytes or 0) + (s.weights_host_bytes or 0), 11) or "") -- streamed weights too
      print(string.format("%-" .. namew .. "s %s %s %9.1f%%%s  |%s", r.name, cell(s.peak, 10), cell(s.activation_bytes, 10),
        s.recompute_pct, extra, table.concat(cells)))
    else
      print(string.format("%-" .. namew .. "s error: %s", r.name, r.error))
    end
  end
  for _, r in ipairs(rows) do
    if r.auto then print(string.format("%s: %s", r.name, r.auto)) end
  end
  if first then
    print("")
    require("ck.memory").print_rows(o.program)
  end
  if limit then
    print("")
    print(string.format("largest batch whose planned peak fits %s:", M.fmt_bytes(limit)))
    for _, r in ipairs(rows) do
      local mb = r.max_batch
      if mb then
        local line
        if mb.batch == 0 then
          local f = mb.first
          line = "even batch 1 does not fit: " ..
            (f.peak and ("it needs " .. M.fmt_bytes(f.peak)) or ("it cannot be planned: " .. tostring(f.err)))
          if mb.next ~= 1 then line = line .. string.format(" (nor does any batch up to %d)", mb.next) end
        elseif mb.capped then
          line = string.format("at least %d (peak %s; the search stops there)", mb.batch, M.fmt_bytes(mb.peak))
        else
          line = string.format("batch %d (peak %s; batch %d %s)", mb.batch, M.fmt_bytes(mb.peak), mb.next,
            mb.next_peak and ("needs " .. M.fmt_bytes(mb.next_peak)) or ("cannot be planned: " .. tostring(mb.next_error)))
        end
        print(string.format("  %-" .. namew .. "s %s", r.name, line))
      end
    end
  end
  if svg then print("memory timeline written to " .. svg) end
end

-- o: info = {{key, value}, ...}, program (compiled under checkpoint), checkpoint,
-- batch, build = function(batch, policy) -> a plan_only program, and policies
-- (a list to report when the command line gives no --policies; default: checkpoint)
function M.report(o)
  assert(type(o) == "table" and o.program, "plan.report: give {program = ..., checkpoint = ..., info = ...}")
  local list = ck.plan_policies and M.parse_policies(ck.plan_policies) or o.policies or {o.checkpoint or policy.none()}
  local svg = ck.plan_svg
  local rows = plan_rows(o, list, svg ~= nil, (o.export_graph or ck.plan_export_graph) ~= nil)
  local failed, errors = 0, {}
  for _, r in ipairs(rows) do
    if not r.summary then
      failed = failed + 1
      errors[#errors + 1] = r.name .. ": " .. r.error
    end
  end
  if failed == #rows then
    error(#rows == 1 and ("cannot plan " .. errors[1]) or ("no policy could be planned (" .. table.concat(errors, "; ") .. ")"), 0)
  end
  local limit = ck.plan_max_batch
  if limit then
    for _, r in ipairs(rows) do
      if r.summary then r.max_batch = max_batch(o, r, limit) end
    end
  end
  if svg then
    local title = "ckrun memory plan"
    for _, kv in ipairs(o.info or {}) do
      if kv[1] == "script" or kv[1] == "size" or kv[1] == "resolution" or kv[1] == "batch" then
        title = title .. ", " .. kv[1] .. " " .. tostring(kv[2])
      end
    end
    local panels = {}
    for _, r in ipairs(rows) do panels[#panels + 1] = {name = r.name, summary = r.summary, timeline = r.timeline, error = r.error} end
    M.write_atomic(svg, M.timeline_svg(panels, {title = title}))
  end
  -- --export-graph FILE (ck.plan_export_graph): the graph and the policies compared
  local export = o.export_graph or ck.plan_export_graph
  if export then
    local model = o.build and function(pol) return o.build(o.batch, pol) end or o.program
    local given = {}
    for _, r in ipairs(rows) do given[#given + 1] = r.graph and {name = r.name, graph = r.graph} or r.policy end
    M.export_graph(export, model, given, {info = o.info})
  end
  if ck.json then print_json(o, rows, limit, svg) else print_text(o, rows, limit, svg) end
  return rows
end

return M
