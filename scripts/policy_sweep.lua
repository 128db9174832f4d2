-- Policy experiments: compile one SDXL UNet LoRA training step under every
-- built-in checkpoint policy and a range of budgets, run a few steps of each on
-- the CPU, and compare the planned peak with the arena's measured high-water
-- mark, the recompute FLOPs and the measured step time; write the Pareto front
-- (peak against recompute FLOPs) as SVG. A measured peak that differs from the
-- plan, or a loss that differs from none's, is marked MISMATCH
-- (tests/sh/test_policy_sweep.sh fails on one).
--
--   ckrun scripts/policy_sweep.lua                          sdxl-tiny, 64x64 latents, batch 1
--   ckrun scripts/policy_sweep.lua --resolution 256 --batch 2 --budgets 80%,62%
--   ckrun --plan scripts/policy_sweep.lua                   plan the same policies, run nothing
--   ckrun scripts/policy_sweep.lua --help                   the options
local ck = require "ck"
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local data = require "ck.data"
local policy = require "ck.policy"
local plan = require "ck.plan"
local svg = require "ck.svg"
local options = require "ck.options"

local o = options.parse(args, {
  about = "Checkpoint policies compared: planned and measured peak, recompute FLOPs, step time; the Pareto front as SVG.",
  {"size", "choice", "tiny", "sdxl-tiny or the real SDXL UNet", choices = {"tiny", "full"}},
  {"resolution", "integer", 512, "pixels per side (latents are 1/8 of it)", arg = "PX",
   check = function(v) return v > 0 and v % 64 == 0 end, says = "must be a positive multiple of 64 pixels"},
  {"batch", "integer", 1, "samples per step", min = 1},
  {"lora", "flag", true, "rank --rank adapters on a frozen base, as train_sdxl_lora.lua; false trains every parameter",
   arg = "true|false"},
  {"fused-backward", "flag", false, "each update as soon as its gradient is complete (kohya's --fused_backward_pass)",
   arg = "true|false"},
  {"optimizer", "choice", "adamw", "the optimizer", choices = {"adamw", "adamw8bit"}},
  {"rank", "integer", 4, "the adapters' rank", min = 1},
  {"steps", "integer", 3, "steps per policy: the first measures the arena, the rest are timed", min = 1},
  {"policies", "list", "none,diffusers,selective,sqrt_n,every_n:2,every_n:3", "the fixed policies"},
  {"budgets", "list", "90%,80%,70%,62%,55%",
   "budget policies besides them: percentages of none's peak or sizes; none for no budgets"},
  {"svg", "string", "out/policy_sweep.svg", "where the Pareto front is written", arg = "FILE",
   check = options.file_to_write, says = options.FILE_TO_WRITE},
  {"seed", "integer", 1, "the seed of weights, data and noise", min = 0},
})
if not o then return end

local size = o.size
local config = unet.config(size == "full" and "sdxl" or "sdxl-tiny")
local resolution = o.resolution
local latent = resolution // 8
local batch = o.batch
local use_lora = o.lora
local fused = o["fused-backward"]
local optimizer = o.optimizer
local rank = o.rank
local steps = o.steps
local svg_path = o.svg
local seed = o.seed
local pooled_dim = sdxl.pooled_dim(config)

-- the policies: fixed ones, then one budget per entry of --budgets
local names = {}
for _, n in ipairs(o.policies) do names[#names + 1] = n end
if not (#o.budgets == 1 and o.budgets[1] == "none") then
  for _, b in ipairs(o.budgets) do names[#names + 1] = "budget:" .. b end
end
local policies = plan.parse_policies(table.concat(names, ","))

-- one training step of the LoRA (or full) fine-tune, as train_sdxl_lora.lua builds it
local function build(b, checkpoint, plan_only)
  return sdxl.training_step{
    config = config, batch = b, latent = latent, lora = use_lora and {rank = rank},
    objective = {prediction = "v", seed = seed},
    compile = {optimizer = optimizer, lr = 1e-4, weight_decay = 1e-2, seed = seed, checkpoint = checkpoint,
               plan_only = plan_only, fused_backward = fused},
  }
end

local what = string.format("sdxl-%s, %dx%d latents, batch %d, %s", size, latent, latent, batch,
  use_lora and string.format("LoRA rank %d", rank) or "full fine-tune")

if ck.plan_mode then
  -- plan the sweep's policies (or --policies from the command line), run nothing
  local r = build(batch, policies[1], true)
  local all, trainable = r.graph:param_count()
  plan.report{
    info = {{"script", "policy_sweep"}, {"size", size}, {"resolution", resolution}, {"batch", batch},
            {"param_count", all}, {"trainable_param_count", trainable}},
    program = r.program, checkpoint = policies[1], batch = batch, policies = policies,
    build = function(b, pol) return build(b, pol, true).program end,
  }
  return
end

local dataset = data.latents("synthetic", {batch = batch, seed = seed, n = batch, height = latent, width = latent,
  cross_attention_dim = config.cross_attention_dim, pooled_dim = pooled_dim})
local indices = {}
for i = 1, batch do indices[i] = i end

local median = plan.median

local MiB = 2 ^ 20
print(string.format("policy sweep: %s, %d steps per policy (step 1 measures the arena%s)", what, steps,
  steps == 1 and ", none is timed" or steps == 2 and ", step 2 is timed" or string.format(", steps 2-%d are timed", steps)))
print(string.format("%-14s %12s %12s %6s %10s %10s %8s %6s", "policy", "predicted", "measured", "", "recompute",
  "step", "time vs", "loss ="))
print(string.format("%-14s %12s %12s %6s %10s %10s %8s %6s", "", "peak MiB", "peak MiB", "", "FLOPs %", "ms", "none",
  "none"))

-- Step 1 of each policy measures the arena's high-water mark right after its
-- compile. The timed steps then run round-robin over the policies, so load
-- from other processes falls on every policy alike; programs whose arenas
-- together would pass KEEP_BYTES run their timed steps at once and are freed.
local KEEP_BYTES = 4 * 2 ^ 30
local rows, kept, kept_bytes = {}, {}, 0

local function one_step(row, step)
  local r, p = row.run, row.run.program
  local given = dataset:load(p, r.inputs, indices)
  r.objective:prepare(p, given)
  local t0 = ck.now()
  if step == 1 then
    local info
    row.loss, info = p:step{measure = true}
    row.measured = info.high_water
  else
    row.loss = p:step()
    row.times[#row.times + 1] = ck.now() - t0
  end
end

for _, pol in ipairs(policies) do
  local row = {name = policy.name(pol), budget = pol.kind == "budget", times = {}}
  local ok, r = pcall(build, batch, pol, false)
  if not ok then
    row.error = plan.strip_where(r)
  else
    row.run = r
    row.summary = plan.summary(r.program)
    one_step(row, 1)
    if kept_bytes + row.summary.peak <= KEEP_BYTES then
      kept[#kept + 1] = row
      kept_bytes = kept_bytes + row.summary.peak
    else
      for step = 2, steps do one_step(row, step) end
      row.run = nil
    end
  end
  rows[#rows + 1] = row
  r = nil
  collectgarbage()
end
for step = 2, steps do
  for _, row in ipairs(kept) do one_step(row, step) end
end
for _, row in ipairs(kept) do row.run = nil end
collectgarbage()

local base_time, base_loss
for _, row in ipairs(rows) do
  if row.name == "none" and row.summary then
    base_time, base_loss = median(row.times), row.loss
  end
end
local mismatches, loss_diffs = {}, {}
for _, row in ipairs(rows) do
  if row.error then
    print(string.format("%-14s error: %s", row.name, row.error))
  else
    row.time = median(row.times)
    row.match = row.measured == row.summary.peak
    if not row.match then mismatches[#mismatches + 1] = row.name end
    local loss_ok = base_loss == nil or row.loss == base_loss
    if not loss_ok then loss_diffs[#loss_diffs + 1] = row.name end
    print(string.format("%-14s %12.3f %12.3f %6s %9.1f%% %10s %8s %6s", row.name, row.summary.peak / MiB,
      row.measured / MiB, row.match and "ok" or "MISMATCH", row.summary.recompute_pct,
      row.time and string.format("%.0f", row.time * 1e3) or "-",
      (row.time and base_time) and string.format("x%.2f", row.time / base_time) or "-",
      base_loss == nil and "-" or (loss_ok and "yes" or "NO")))
  end
end

-- the Pareto front: no other point has a lower-or-equal peak and
-- lower-or-equal recompute, one of them strictly lower
local points = {}
for _, row in ipairs(rows) do
  if row.summary then points[#points + 1] = row end
end
for _, p in ipairs(points) do
  p.front = true
  for _, q in ipairs(points) do
    local sp, sq = p.summary, q.summary
    if q ~= p and sq.peak <= sp.peak and sq.recompute_flops <= sp.recompute_flops
       and (sq.peak < sp.peak or sq.recompute_flops < sp.recompute_flops) then
      p.front = false
      break
    end
  end
end
local front = {}
for _, p in ipairs(points) do
  if p.front then front[#front + 1] = p end
end
table.sort(front, function(x, y) return x.summary.recompute_pct < y.summary.recompute_pct end)
local fnames = {}
for _, p in ipairs(front) do fnames[#fnames + 1] = p.name end
print("Pareto front (peak against recompute FLOPs): " .. table.concat(fnames, ", "))

local function pareto_svg()
  local W, H, left, right, top, bottom = 900, 560, 90, 200, 60, 60
  local pw, ph = W - left - right, H - top - bottom
  local xmax, ymax, ymin = 0, 0, math.huge
  for _, p in ipairs(points) do
    xmax = math.max(xmax, p.summary.recompute_pct)
    ymax = math.max(ymax, p.summary.peak / MiB)
    ymin = math.min(ymin, p.summary.peak / MiB)
  end
  local xt, _, xtop = svg.axis(math.max(xmax * 1.05, 1), xmax * 1.02, 6)
  -- the y axis starts below the lowest peak, not at zero: the differences matter
  local span = math.max(ymax - ymin, ymax * 0.05)
  local _, ys = svg.ticks(span * 1.3, 6)
  local ybot = math.max(0, math.floor((ymin - span * 0.15) / ys) * ys)
  local ytop = math.ceil((ymax + span * 0.1) / ys) * ys
  local function X(v) return left + pw * v / xtop end
  local function Y(v) return top + ph * (1 - (v - ybot) / (ytop - ybot)) end
  local doc = svg.document(W, H, "Checkpoint policies: planned peak against recompute", left, 24)
  local function add(...) doc:add(...) end
  add('<text x="%d" y="42">%s; labels: policy and measured step time relative to none</text>\n', left,
    svg.escape(what))
  for _, v in ipairs(xt) do
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e6e6e6"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>\n',
      X(v), top, X(v), top + ph, X(v), top + ph + 17, svg.fmt_tick(v))
  end
  for v = ybot, ytop + ys * 1e-9, ys do
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e6e6e6"/><text x="%d" y="%.1f" text-anchor="end">%s</text>\n',
      left, Y(v), left + pw, Y(v), left - 6, Y(v) + 4, svg.fmt_tick(v))
  end
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>\n', left, top, pw, ph)
  add('<text x="%d" y="%d" text-anchor="middle">recompute FLOPs (%% of the step without recompute)</text>\n',
    left + pw // 2, top + ph + 40)
  add('<text transform="translate(%d,%d) rotate(-90)" text-anchor="middle">planned peak (MiB)</text>\n', left - 60,
    top + ph // 2)
  -- the front as a staircase: from each point, right at its peak to the next
  if #front > 0 then
    local d = {}
    for i, p in ipairs(front) do
      local x, y = X(p.summary.recompute_pct), Y(p.summary.peak / MiB)
      if i == 1 then d[#d + 1] = string.format("M%.1f,%.1f", x, y)
      else d[#d + 1] = string.format("V%.1fH%.1f", y, x) end
    end
    add('<path class="front" d="%s" fill="none" stroke="#d62728" stroke-width="2"/>\n', table.concat(d, " "))
  end
  -- points; policies that plan the same peak and FLOPs share one label
  local labels, placed = {}, {}
  for _, p in ipairs(points) do
    local x, y = X(p.summary.recompute_pct), Y(p.summary.peak / MiB)
    local fill = p.front and "#d62728" or "white"
    local stroke = p.front and "#d62728" or "#555"
    local tip = string.format("%s: peak %.2f MiB, recompute %.2f%%%s", p.name, p.summary.peak / MiB,
      p.summary.recompute_pct, (p.time and base_time) and string.format(", step time x%.2f of none", p.time / base_time) or "")
    if p.budget then
      add('<rect class="point" x="%.1f" y="%.1f" width="9" height="9" transform="rotate(45 %.1f %.1f)" fill="%s" ' ..
        'stroke="%s" stroke-width="1.5"><title>%s</title></rect>\n', x - 4.5, y - 4.5, x, y, fill, stroke,
        svg.escape(tip))
    else
      add('<circle class="point" cx="%.1f" cy="%.1f" r="5" fill="%s" stroke="%s" stroke-width="1.5"><title>%s</title></circle>\n',
        x, y, fill, stroke, svg.escape(tip))
    end
    local text = p.name
    if p.time and base_time and p.name ~= "none" then text = text .. string.format(" x%.2f", p.time / base_time) end
    local key = string.format("%.1f,%.1f", x, y)
    local l = labels[key]
    if l then
      l.text = l.text .. " = " .. text
      l.front = l.front or p.front
    else
      l = {x = x, y = y, text = text, front = p.front}
      labels[key] = l
      labels[#labels + 1] = l
    end
  end
  -- labels right of their point, nudged up or down until they overlap no other
  for _, l in ipairs(labels) do
    local w = 6.6 * #l.text
    local lx = l.x + 8
    if lx + w > W - 10 then lx = l.x - 8 - w end
    local ly
    for _, dy in ipairs{-6, 12, -20, 26, -34, 40, -48, 54} do
      local cand = l.y + dy
      local clash = false
      for _, q in ipairs(placed) do
        if lx < q.x1 and lx + w > q.x0 and cand - 11 < q.y1 and cand + 3 > q.y0 then clash = true; break end
      end
      if not clash then ly = cand; break end
    end
    ly = ly or l.y - 6
    placed[#placed + 1] = {x0 = lx, x1 = lx + w, y0 = ly - 11, y1 = ly + 3}
    add('<text x="%.1f" y="%.1f" fill="%s">%s</text>\n', lx, ly, l.front and "#d62728" or "#333", svg.escape(l.text))
  end
  -- legend
  local lx, ly = left + pw + 20, top + 10
  add('<circle cx="%d" cy="%d" r="5" fill="white" stroke="#555" stroke-width="1.5"/><text x="%d" y="%d">fixed policy</text>\n',
    lx + 5, ly, lx + 16, ly + 4)
  add('<rect x="%.1f" y="%.1f" width="9" height="9" transform="rotate(45 %d %d)" fill="white" stroke="#555" ' ..
    'stroke-width="1.5"/><text x="%d" y="%d">budget</text>\n', lx + 0.5, ly + 20 - 4.5, lx + 5, ly + 20, lx + 16, ly + 24)
  add('<circle cx="%d" cy="%d" r="5" fill="#d62728"/><text x="%d" y="%d">on the Pareto front</text>\n', lx + 5,
    ly + 40, lx + 16, ly + 44)
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#d62728" stroke-width="2"/><text x="%d" y="%d">front</text>\n',
    lx, ly + 60, lx + 12, ly + 60, lx + 16, ly + 64)
  local fy = ly + 100
  for _, row in ipairs(rows) do
    if row.error then
      add('<text x="%d" y="%d" fill="#d62728" font-size="11">%s: not planned</text>\n', lx, fy, svg.escape(row.name))
      fy = fy + 16
    end
  end
  return doc:finish()
end

if #points > 0 then
  plan.write_atomic(svg_path, pareto_svg())
  print("wrote " .. svg_path)
end

if #points == 0 then error("no policy could be compiled", 0) end
-- the checks themselves are the tests' (tests/sh/test_policy_sweep.sh): here they are reported
if #mismatches > 0 then
  print("MISMATCH: the measured arena high-water mark differs from the planned peak for " ..
    table.concat(mismatches, ", "))
end
if #loss_diffs > 0 then
  print("MISMATCH: the loss after " .. steps .. " steps differs from none's for " .. table.concat(loss_diffs, ", ") ..
    " (recompute must not change a bit)")
end
