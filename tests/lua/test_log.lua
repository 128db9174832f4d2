-- Logging: each cadence picks exactly the expected steps; statistics are
-- exact (gradient norms and block activation statistics equal what the host
-- computes from the tensors), cost nothing on steps that do not log (the plain
-- list runs and training is bitwise the same), and under recompute add no
-- memory beyond their own outputs; event files frame every record with valid
-- CRCs, put file_version first and survive a cut at any byte; a non-finite
-- loss stops or skips as asked, naming the step and the first op.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local log = require "ck.log"
local unet = require "ck.unet"
local policy = require "ck.policy"

local dir = string.format("out/test_log.%d", math.floor(ck.wall_time() * 1000) % 1000000000)
assert(ck.mkdir(dir))

local function picks(c, n, observe)
  local got = {}
  for s = 1, n do
    if c:due(s) then got[#got + 1] = s end
    if observe then c:observe(s, observe(s)) end
  end
  return table.concat(got, ",")
end

-- ---- cadences
T.ok(picks(log.every(5), 23) == "5,10,15,20", "every(5) picks steps 5, 10, 15, 20 of 23")
T.ok(picks(log.every(1), 4) == "1,2,3,4", "every(1) picks every step")
T.ok(picks(log.at{3, 7, 7, 40}, 10) == "3,7", "at{3, 7, 40} picks 3 and 7 of 10")
do
  local t = 0
  local c = log.seconds(1.0, {clock = function() return t end})
  local got = {}
  local times = {0, 0.4, 0.99, 1.0, 1.5, 2.2, 2.3, 3.2, 3.21, 10}
  for s, at in ipairs(times) do
    t = at
    if c:due(s) then got[#got + 1] = s end
  end
  T.ok(table.concat(got, ",") == "1,4,6,8,10", "seconds(1) with a fake clock picks the first step and each one a second after the last (" .. table.concat(got, ",") .. ")")
end
do
  local seen = {}
  local c = log.when(function(step, last)
    seen[#seen + 1] = tostring(last)
    return step == 2 or (last ~= nil and step - last == 3)
  end)
  T.ok(picks(c, 12) == "2,5,8,11", "when(fn) picks what fn says, given the last step picked")
  T.ok(seen[1] == "nil" and seen[3] == "2" and seen[6] == "5", "when(fn) sees last = nil before the first pick")
end
do
  local c = log.every(4)
  local a, b = c:due(4), c:due(4)
  T.ok(a and b and not c:due(5), "a cadence shared by groups answers once per step")
end
do -- loss spike: flat losses with noise, a spike at 30; k = 3 steps after it
  local r = T.rng(7)
  local loss = {}
  for s = 1, 60 do loss[s] = 1 + 0.01 * r() end
  loss[30] = 5
  local c = log.adaptive{base = log.every(20), k = 3, window = 20, spike = 4}
  local got = picks(c, 60, function(s) return {loss = loss[s]} end)
  T.ok(got == "20,31,32,33,40,60", "adaptive: base every 20, and the 3 steps after a loss spike at 30 (" .. got .. ")")
end
do -- gradient-norm jump and a non-finite loss
  local c = log.adaptive{base = log.never(), k = 2, spike = false, jump = 3}
  local norm = {[1] = 1, [2] = 1.2, [3] = 1.1, [4] = 5, [8] = 6, [9] = 1}
  local got = picks(c, 10, function(s) return {loss = s == 7 and 0 / 0 or 1, grad_norm = norm[s]} end)
  T.ok(got == "5,6,8,9", "adaptive: 2 steps after a gradient-norm jump (4) and after a non-finite loss (7) (" .. got .. ")")
end
T.ok(not pcall(log.every, 0) and not pcall(log.new, {metrics = {bogus = 1}}), "a bad cadence or an unknown metric group is an error")

-- ---- statistics on a small model
local function mlp()
  local g = ck.graph()
  local x = g:input("x", {8, 3})
  local t = g:input("t", {8, 2})
  local h = g:scope("enc", function()
    return ck.silu(ck.linear(x, g:param("l1.weight", {16, 3}), g:param("l1.bias", {16})))
  end)
  local y = g:scope("head", function() return ck.linear(h, g:param("out.weight", {2, 16})) end)
  return g, x, t, h, y, ck.mse_loss(y, t)
end

local function fill(p, x, t)
  local r = T.rng(11)
  p:set(x, T.random_values(r, 24))
  p:set(t, T.random_values(r, 16))
end

do
  local g, x, t, h, y, loss = mlp()
  local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3, keep_grads = true, outputs = {h, y},
                      stats = {blocks = {}}}
  fill(p, x, t)
  local plain_ops = p:plan().ops
  local info = p:enable_stats{blocks = {}}
  T.ok(info.grads == 3 and info.acts == 2 and #info.blocks == 2, "enable_stats: a norm per trainable parameter, statistics per block (enc, head)")
  T.ok(p:plan().ops == plain_ops, "enable_stats leaves the plain training list as it was")
  local l, r = p:step{stats = {"grads", "acts"}}
  local sq, blocks = 0, {}
  for _, name in ipairs{"enc.l1.weight", "enc.l1.bias", "head.out.weight"} do
    local s = 0
    for _, v in ipairs(p:grad(name)) do s = s + v * v end
    local b = name:match("^[^.]+")
    blocks[b] = (blocks[b] or 0) + s
    sq = sq + s
  end
  local close = function(a, b) return math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)) end
  T.ok(close(r.grad_norm, math.sqrt(sq)), string.format("global gradient norm %.7g equals the host's %.7g", r.grad_norm, math.sqrt(sq)))
  T.ok(close(r.grad_norms.enc, math.sqrt(blocks.enc)) and close(r.grad_norms.head, math.sqrt(blocks.head)), "per-block gradient norms equal the host's")
  local hv = p:get(h)
  local sum, sum2, amax = 0, 0, 0
  for _, v in ipairs(hv) do sum, sum2, amax = sum + v, sum2 + v * v, math.max(amax, math.abs(v)) end
  local mean = sum / #hv
  local std = math.sqrt(sum2 / #hv - mean * mean)
  local a = r.acts.enc
  T.ok(close(a.mean, mean) and close(a.std, std) and close(a.absmax, amax), string.format("block 'enc' output statistics equal the host's (mean %.5g std %.5g absmax %.5g)", a.mean, a.std, a.absmax))
  T.ok(r.acts.head ~= nil and r.plan_peak >= p:plan().peak, "the head block has statistics; the logging list's planned peak is reported")
  local ok, err = pcall(p.step, p, {stats = "bogus"})
  T.ok(not ok and err:match("unknown statistics 'bogus'"), "an unknown statistics name is an error")
end

do -- one arena, sized once: compile{stats=} plans the logging lists before the arena exists
  local g, x, t, _, _, loss = mlp()
  local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3, stats = {blocks = {}}}
  fill(p, x, t)
  local before = p:plan()
  local info = p:enable_stats{blocks = {}}
  local most = math.max(before.peak, info.peak.grads, info.peak.acts, info.peak.all)
  T.ok(info.peak.all > before.peak and before.arena == most, string.format(
    "compile{stats=}: the arena (%d bytes) is the largest of the training list (%d) and the logging lists (%d)",
    before.arena, before.peak, info.peak.all))
  for _, st in ipairs{{"grads"}, {"acts"}, {"grads", "acts"}} do
    local _, r = p:step{stats = st, measure = true}
    T.ok(r.high_water == r.plan_peak and r.high_water <= before.arena, string.format(
      "a logging step (%s) writes up to its plan's peak %d, inside the arena", table.concat(st, "+"), r.high_water))
  end
  T.ok(p:plan().arena == before.arena, "logging steps leave the arena as compile sized it")
  -- without compile{stats=}: a logging list larger than the arena is refused, and nothing changes
  local q = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3}
  fill(q, x, t)
  local arena = q:plan().arena
  local ok, err = pcall(q.enable_stats, q, {blocks = {}})
  T.ok(not ok and err:match("^[^:]*test_log%.lua:%d+: enable_stats: the logging steps need an arena of %d+ bytes")
    and err:match("compile{stats"), "enable_stats past the arena is one error naming the line and compile{stats=}: " .. tostring(err))
  local l = q:step()
  T.ok(q:plan().arena == arena and l == l, "after the refusal the program trains on, its arena as it was")
  local ok2, err2 = pcall(q.step, q, {stats = "grads"})
  T.ok(not ok2 and err2:match("not enabled"), "and its logging steps stay off")
  -- a malformed stats table is an error naming the line
  for _, bad in ipairs{{grads = "yes"}, {blocks = "mid_block"}, {blocks = {1}}, "all"} do
    local okb, eb = pcall(g.compile, g, {loss = loss, optimizer = "adamw", stats = bad})
    T.ok(not okb and eb:match("test_log%.lua:%d+:.*stats"), "compile{stats = bad} is refused: " .. tostring(eb))
  end
  -- what a logger asks for
  local req = log.stats_request{every = 5, blocks = {"enc"}}
  T.ok(req.grads and req.acts and req.blocks[1] == "enc", "log.stats_request: the groups a logger's cadences can pick")
  T.ok(log.stats_request{metrics = {grad_norm = false, grad_norms = false, acts = false}} == nil,
    "log.stats_request: nil when no cadence needs statistics")
end

do -- logging steps do not change training: losses and weights bitwise equal
  local function train(with_log)
    local g, x, t, _, _, loss = mlp()
    local lo = {every = 2, acts_every = 3, blocks = {}}
    local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3, stats = with_log and log.stats_request(lo)}
    fill(p, x, t)
    local lg = with_log and log.new(lo) or nil
    local ls = {}
    for s = 1, 7 do ls[s] = lg and lg:step(p) or p:step() end
    return table.concat(ls, ","), p:checksum("enc.l1.weight") .. p:checksum("head.out.weight")
  end
  local l1, w1 = train(false)
  local l2, w2 = train(true)
  T.ok(l1 == l2 and w1 == w2, "7 steps with statistics every 2 and 3 steps train bitwise as 7 plain steps")
end

do -- the logger observes a step the caller runs: request says what the step computes, observe records it
  local g, x, t, _, _, loss = mlp()
  local lo = {every = 2, blocks = {}, dir = dir .. "/observe", tensorboard = false, steps = 3, progress = false}
  local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3, stats = log.stats_request(lo)}
  fill(p, x, t)
  local lg = log.new(lo)
  local asked, losses = {}, {}
  for s = 1, 3 do
    local want = lg:request(p, {lr = 5e-3})
    asked[s] = table.concat(want.stats, "+")
    local t0 = ck.now()
    local l, info = p:step(want)
    losses[s] = lg:observe(p, l, info, t0, t0 + 0.25)
    T.ok(info.step_time == 0.25 and (s ~= 2 or info.grad_norm), "observe: step " .. s .. " takes the caller's times")
  end
  T.ok(asked[1] == "" and asked[2] == "grads" and asked[3] == "", "request: the statistics the cadences are due for, " ..
    "on their steps only (" .. table.concat(asked, ",") .. ")")
  T.ok(math.abs(p.lr - 5e-3) < 1e-9, "request: the learning rate the caller gives (" .. p.lr .. ")")
  local ok, err = pcall(function() local l = lg:observe(p, 1, {}, 0, 0) return l end)
  T.ok(not ok and err:match("test_log%.lua:%d+: log: a step observed without its request"),
    "observe without request is refused at the caller's line (" .. tostring(err) .. ")")
  local paths = lg:close()
  local recs = {}
  for line in io.lines(paths.jsonl) do recs[#recs + 1] = ck.json_decode(line) end
  T.ok(#recs == 3 and recs[2].grad_norm and not recs[1].grad_norm and math.abs(recs[3].loss - losses[3]) < 1e-6 and
    recs[1].step_time == 0.25, "observe: one record a step, with what the step computed (" .. #recs .. " records)")
end

-- ---- statistics under recompute (sdxl-tiny): no memory beyond their outputs
do
  local function build(checkpoint, no_stats)
    local g = ck.graph()
    local _, y, x = unet.build(g, "sdxl-tiny", {batch = 1, height = 16, width = 16})
    local t = g:input("target", y.shape)
    local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-3, seed = 5, checkpoint = checkpoint,
                        stats = not no_stats and {blocks = log.unet_blocks} or nil}
    local r = T.rng(3)
    p:set(x.sample, T.random_values(r, 4 * 16 * 16))
    p:set(t, T.random_values(r, 4 * 16 * 16))
    p:set(x.encoder_hidden_states, T.random_values(r, 77 * 64))
    p:set(x.text_embeds, T.random_values(r, 64))
    p:set(x.timesteps, {17})
    p:set(x.time_ids, {128, 128, 0, 0, 128, 128})
    return p
  end
  local p = build(policy.parse("diffusers"))
  -- the stat nodes come after the training list's recomputed copies were numbered: the plain lists
  -- read as they did (their timeline, their graph export) once the copies are renumbered above them
  local plain_p = build(policy.parse("diffusers"), true)
  local ta, tb = p:timeline(), plain_p:timeline()
  local same = #ta.phase == #tb.phase
  for i = 1, #ta.phase do
    same = same and ta.phase[i] == tb.phase[i] and ta.recomputed[i] == tb.recomputed[i] and ta.activations[i] == tb.activations[i]
  end
  T.ok(same and #ta.phase > 0, string.format("with statistics planned, the training list's timeline is that of the plain program (%d entries)", #ta.phase))
  local ga, gb = p:graph(), plain_p:graph()
  T.ok(ga and gb and #ga.ops == #gb.ops, "and its graph export lists the same entries")
  plain_p = nil
  local plain = p:plan()
  local info = p:enable_stats{blocks = log.unet_blocks}
  local stats_bytes = 64 * (info.grads + info.acts)
  T.ok(info.acts >= 20 and info.blocks[1] ~= nil, string.format("sdxl-tiny: statistics of %d blocks, norms of %d gradients", info.acts, info.grads))
  T.ok(info.peak.acts - plain.peak <= stats_bytes,
    string.format("under diffusers checkpointing, activation statistics add %d bytes to the %d-byte peak (their outputs: <= %d)",
      info.peak.acts - plain.peak, plain.peak, stats_bytes))
  T.ok(info.peak.all - plain.peak <= stats_bytes, "all statistics together add no more than their outputs")
  local l, r = p:step{stats = "all", measure = true}
  T.ok(r.high_water == r.plan_peak, string.format("the logging step's measured peak equals its plan (%d bytes)", r.high_water))
  local names = {}
  for k in pairs(r.acts) do names[#names + 1] = k end
  table.sort(names)
  T.ok(r.acts["down_blocks.1.attentions.0"] and r.acts["mid_block.resnets.0"] and r.acts["up_blocks.0.resnets.0"],
    "UNet blocks are named as diffusers names them (" .. names[1] .. ", ...)")
  local q = build(nil)
  local l2 = q:step()
  T.ok(l == l2, "the logging step's loss equals a plain step's of the same model")
end

-- ---- non-finite loss: stop and skip
do
  local function setup(mode, path)
    local g, x, t, _, _, loss = mlp()
    local lo = {dir = path, on_nonfinite = mode, every = 1, blocks = {}, tensorboard = false}
    local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 3, stats = log.stats_request(lo)}
    fill(p, x, t)
    return p, x, log.new(lo)
  end
  local p, x, lg = setup("skip", dir .. "/skip")
  lg:step(p)
  local before = p:checksum("enc.l1.weight")
  p:set(x, 0 / 0)
  local l, info = lg:step(p)
  local after = p:checksum("enc.l1.weight")
  T.ok(l ~= l and info.skipped and before == after, "skip: the non-finite step's update is dropped (weights unchanged)")
  T.ok(info.nonfinite.op == "linear" and info.nonfinite.scope == "enc" and info.nonfinite.input == "x",
    "skip: the first op with a non-finite output is named (linear in enc, reading x)")
  local _, rn = p:step{stats = {"acts", "grads"}, guard = true}
  local e = rn.acts.enc
  T.ok(rn.skipped and e.mean ~= e.mean and e.absmax ~= e.absmax and rn.grad_norm ~= rn.grad_norm,
    "statistics of a non-finite step are NaN (mean, absmax, gradient norm), not hidden")
  local r = T.rng(11)
  p:set(x, T.random_values(r, 24))
  local l3 = lg:step(p)
  T.ok(l3 == l3 and p:checksum("enc.l1.weight") ~= after, "skip: training goes on after the skipped step")
  -- skipped updates do not count for AdamW (its bias correction sees update 2,
  -- as torch.optim.AdamW behind a GradScaler that skips): the same weights as
  -- two good steps on the same batch
  local q = setup("skip", dir .. "/skip_ref")
  q:step()
  q:step()
  T.ok(p.steps == 4 and p.updates == 2 and p:checksum("enc.l1.weight") == q:checksum("enc.l1.weight") and
    p:checksum("head.out.weight") == q:checksum("head.out.weight"),
    string.format("skip: after 4 steps with 2 skipped (%d updates), the weights are bitwise those of 2 good steps", p.updates))
  local paths = lg:close()
  local lines = {}
  for line in io.lines(paths.jsonl) do lines[#lines + 1] = line end
  T.ok(#lines == 3 and lines[2]:match('"event":"nonfinite"') and lines[2]:match('"action":"skip"') and
    lines[2]:match('"op":"linear"') and lines[2]:match('"step":2'), "skip: the event is logged with the step, the action and the op")

  p, x, lg = setup("stop", dir .. "/stop")
  lg:step(p)
  before = p:checksum("enc.l1.weight")
  p:set(x, 0 / 0)
  local ok, err = pcall(lg.step, lg, p)
  T.ok(not ok and err:match("step 2: loss is not finite") and err:match("first non%-finite output: linear in enc"),
    "stop: an error names the step and the first op (" .. tostring(err) .. ")")
  T.ok(p:checksum("enc.l1.weight") == before, "stop: the update of the non-finite step is not applied")
  local n = 0
  for line in io.lines(dir .. "/stop/metrics.jsonl") do n = n + 1 end
  T.ok(n == 2, "stop: the event record was written and the log closed")
end

-- ---- event files
do
  local crc, masked = ck.crc32c("123456789")
  T.ok(crc == 0xE3069283, string.format("CRC-32C of '123456789' is e3069283 (%08x)", crc))
  local lg = ck.log_open{dir = dir, jsonl = false}
  for s = 1, 6 do lg:write{step = s, loss = 1 / s, nested = {a = s, b = {2 * s, 3 * s}}, note = "text is skipped"} end
  local _, path = lg:paths()
  lg:close()
  local ev, tail = ck.read_events(path)
  T.ok(ev and #ev == 7 and tail == 0, "an event file of 6 records reads back as 7 events (file_version first), nothing left over")
  T.ok(ev[1].file_version == "brain.Event:2" and not ev[1].values, "the first event carries file_version = brain.Event:2")
  T.ok(ev[4].step == 3 and math.abs(ev[4].values.loss - 1 / 3) < 1e-7 and ev[4].values["nested/b/2"] == 9,
    "values are scalar summaries tagged by path (nested/b/2)")
  local f = assert(io.open(path, "rb"))
  local data = f:read("a")
  f:close()
  -- record boundaries from the framing
  local ends, at = {}, 0
  while at < #data do
    local len = string.unpack("<I8", data, at + 1)
    at = at + 12 + len + 4
    ends[#ends + 1] = at
  end
  local cut_ok = true
  local cut = dir .. "/cut.tfevents"
  for n = 0, #data do
    local w = assert(io.open(cut, "wb"))
    w:write(data:sub(1, n))
    w:close()
    local e, rest = ck.read_events(cut)
    local whole = 0
    for _, e_end in ipairs(ends) do if e_end <= n then whole = whole + 1 end end
    if not e or #e ~= whole or rest ~= n - (ends[whole] or 0) then
      cut_ok = false
      print("  cut at " .. n .. ": " .. tostring(e and #e) .. " events, expected " .. whole)
      break
    end
  end
  T.ok(cut_ok, string.format("a file cut at any of its %d bytes yields exactly its whole records", #data + 1))
  local bad = data:sub(1, 40) .. string.char((data:byte(41) + 1) % 256) .. data:sub(42)
  local w = assert(io.open(cut, "wb"))
  w:write(bad)
  w:close()
  local e, err = ck.read_events(cut)
  T.ok(e == nil and err:match("CRC does not match"), "a flipped byte fails the CRC check")
  local lgx = ck.log_open{dir = dir, tensorboard = false, jsonl_name = "bad.jsonl"}
  local ok1, e1 = pcall(lgx.write, lgx, {step = 1, f = print})
  local ok2, e2 = pcall(lgx.write, lgx, {step = 1, mixed = {1, 2, x = 3}})
  lgx:close()
  T.ok(not ok1 and e1:match("test_log%.lua:%d+: log record: 'f' is a function") and not ok2 and e2:match("keys must be strings"),
    "a record holding a function or a mixed table is an error naming the script line")
  local lg2, lg3 = ck.log_open{dir = dir, jsonl = false}, ck.log_open{dir = dir, jsonl = false}
  local _, p2 = lg2:paths()
  local _, p3 = lg3:paths()
  lg2:close()
  lg3:close()
  T.ok(p2 ~= p3 and p2 ~= path, "each writer gets its own event file")
end

-- ---- JSONL, sync and async
do
  for _, async in ipairs{false, true} do
    local sub = dir .. (async and "/async" or "/sync")
    assert(ck.mkdir(sub))
    local lg = ck.log_open{dir = sub, async = async, tensorboard = false, queue = 4, flush_interval = 5}
    local t0 = ck.wall_time()
    for s = 1, 50 do lg:write{step = s, loss = s / 2, grad_norms = {b = s}, time = t0 + s} end
    lg:flush()
    local submitted, written = lg:counts()
    local p = lg:paths()
    local lines = {}
    for line in io.lines(p) do lines[#lines + 1] = line end
    lg:close()
    T.ok(submitted == 50 and written == 50 and #lines == 50, (async and "async" or "sync") ..
      ": 50 records through a queue of 4, flushed, are 50 lines")
    local want = string.format('{"step":7,"time":%.6f,"grad_norms":{"b":7},"loss":3.5}', t0 + 7)
    T.ok(lines[7] == want, (async and "async" or "sync") .. ": a line carries the step, the capture time given and the fields (" .. lines[7] .. ")")
  end
end

local function remove_tree(path)
  local entries = ck.listdir(path)
  if entries then
    for _, e in ipairs(entries) do remove_tree(path .. "/" .. e) end
  end
  os.remove(path)
end
remove_tree(dir)

T.done()
