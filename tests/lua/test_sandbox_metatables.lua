-- Bindings read option, value, shape and pattern tables raw, so that hostile
-- metamethods on them never run while C holds pointers into a graph or a
-- program; where Lua code does run inside a binding (a checkpoint policy
-- function, the options p:step reads), a program it closes stays valid until
-- the binding returns. Each binding runs with tables whose __index, __len,
-- __eq, __pairs and __tostring attack in seven ways (grow the graph, close the
-- program, collect garbage, raise, loop, compile, step); each call must give
-- what the raw contents say, with no metamethod called, or one error naming
-- this file and line, and never crash (the ASan build runs this file too).
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"
local ck = require "ck"
local policy = require "ck.policy"

local HERE = "test_sandbox_metatables%.lua:%d+: "
local DIR = string.format("out/test_sandbox_metatables.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(DIR))

-- a small training program, fresh for each variant
local function fresh()
  local g = ck.graph()
  local e = {g = g}
  e.x = g:input("x", {4, 3})
  e.w = g:param("w", {2, 3})
  g:push_scope("blk")
  e.h = ck.silu(ck.linear(e.x, e.w))
  g:pop_scope()
  e.y = ck.linear(e.h, g:param("w2", {2, 2}))
  e.t = g:input("t", {4, 2})
  e.loss = ck.mse_loss(e.y, e.t)
  e.p = g:compile{loss = e.loss, optimizer = "sgd", lr = 0.1, outputs = {e.y}}
  e.p:set(e.x, 0.5)
  e.p:set(e.t, 0.25)
  return e
end

local grown = 0
local ATTACKS = {
  grow = function(e)
    for _ = 1, 300 do
      grown = grown + 1
      e.g:param("grown" .. grown, {4, 4})
    end
  end,
  close = function(e) local q <close> = e.p end,
  collect = function() collectgarbage("collect") end,
  raise = function() error("hostile metamethod ran") end,
  loop = function()
    local s = 0
    for i = 1, 200000 do s = s + i end
    return s
  end,
  compile = function(e) e.g:compile{loss = e.loss, optimizer = "sgd"} end,
  step = function(e) e.p:step() end,
}
local ATTACK_NAMES = {"grow", "close", "collect", "raise", "loop", "compile", "step"}

local calls = 0
-- raw, with a metatable whose every metamethod counts, then attacks e
local function hostile(e, attack, raw)
  local function hit()
    calls = calls + 1
    ATTACKS[attack](e)
  end
  return setmetatable(raw, {
    __index = function() hit() return nil end,
    __len = function() hit() return 100000 end,
    __eq = function() hit() return true end,
    __lt = function() hit() return true end,
    __pairs = function(t) hit() return next, t, nil end,
    __tostring = function() hit() return "hostile" end,
    __concat = function() hit() return "hostile" end,
  })
end

local function all_equal(list, v, n)
  if #list ~= n then return false end
  for i = 1, n do
    if math.abs(list[i] - v) > 1e-6 then return false end
  end
  return true
end

local function has_block(p, name)
  for _, b in ipairs(p:enable_stats{grads = true, acts = true}.blocks) do
    if b == name then return true end
  end
  return false
end

local function shape_is(t, want)
  local s = t.shape
  if #s ~= #want then return false end
  for i = 1, #want do
    if s[i] ~= want[i] then return false end
  end
  return true
end

-- Each case: name, run(e, H) where H(raw) makes a hostile table, and check(e,
-- results...) -> true when the call gave what the raw contents say; err: a
-- pattern the error must match instead (after this file's name and line).
local cases = {
  {"g:param options", function(e, H)
    return e.g:param("q", {2, 2}, H{init = "ones", trainable = false, lr_scale = 0.5})
  end, function(e, q)
    local p = e.g:compile{outputs = {q}, optimizer = "none"}
    return q.kind == "frozen" and all_equal(p:get(q), 1, 4)
  end},
  {"g:param default options", function(e, H) return e.g:param("q", {3}, H{}) end,
    function(e, q) return q.kind == "param" and all_equal(e.g:compile{outputs = {q}, optimizer = "none"}:get(q), 0, 3) end},
  {"g:param normal init", function(e, H)
    return e.g:param("q", {64}, H{init = "normal", mean = 5, std = 0})
  end, function(e, q) return all_equal(e.g:compile{outputs = {q}, optimizer = "none"}:get(q), 5, 64) end},
  {"g:param bad init", function(e, H) return e.g:param("q", {2}, H{init = "bogus"}) end, nil, "unknown init 'bogus'"},
  {"g:input shape", function(e, H) return e.g:input("i", H{2, 3}) end, function(_, i) return shape_is(i, {2, 3}) end},
  {"g:param shape", function(e, H) return e.g:param("q", H{5}) end, function(_, q) return shape_is(q, {5}) end},
  {"ck.reshape dims", function(e, H) return ck.reshape(e.x, H{-1, 2, 2}) end,
    function(_, r) return shape_is(r, {3, 2, 2}) end},
  {"ck.reshape too many elements", function(e, H) return ck.reshape(e.x, H{2 ^ 40 // 1, 2 ^ 40 // 1, -1}) end, nil,
    "more elements than a tensor can hold"},
  {"ck.permute dims", function(e, H) return ck.permute(e.x, H{1, 0}) end, function(_, r) return shape_is(r, {3, 4}) end},
  {"ck.matmul options", function(e, H) return ck.matmul(e.x, e.w, H{trans_b = true}) end,
    function(_, r) return shape_is(r, {4, 2}) end},
  {"ck.conv2d options", function(e, H)
    local im = e.g:input("im", {1, 2, 5, 5})
    return ck.conv2d(im, e.g:param("k", {3, 2, 3, 3}), nil, H{padding = 1, stride = 2})
  end, function(_, r) return shape_is(r, {1, 3, 3, 3}) end},
  {"ck.timestep_embedding options", function(e, H)
    return ck.timestep_embedding(e.g:input("ts", {4}), 8, H{flip_sin_to_cos = true, max_period = 100})
  end, function(_, r) return shape_is(r, {4, 8}) end},
  {"g:compile options", function(e, H)
    return e.g:compile(H{loss = e.loss, optimizer = "sgd", lr = 0.25, outputs = H{e.y}, accumulate = 2})
  end, function(_, p) return p.lr == 0.25 and p.accumulate == 2 end},
  {"g:compile betas", function(e, H) return e.g:compile{loss = e.loss, optimizer = "adamw", betas = H{0.5, 0.75}} end,
    function(_, p) return p.steps == 0 end},
  {"g:compile seed", function(e, H) return e.g:compile{loss = e.loss, seed = H{}} end, nil,
    "seed must be a whole number of at most 64 bits, got table"},
  {"g:compile stats", function(e, H)
    return e.g:compile{loss = e.loss, optimizer = "sgd", stats = H{grads = true, acts = true, blocks = H{"blk"}}}
  end, function(_, p) return has_block(p, "blk") end},
  {"blocks policy patterns", function(e, H)
    return e.g:compile{loss = e.loss, optimizer = "sgd", checkpoint = H{kind = "blocks", patterns = H{"blk"}}}
  end, function(_, p) return p:plan().recompute_ops > 0 end},
  {"blocks policy, a pattern not a string", function(e, H)
    return e.g:compile{loss = e.loss, checkpoint = H{kind = "blocks", patterns = H{"blk", 7}}}
  end, nil, "blocks: pattern 2 is not a string"},
  {"selective policy list", function(e, H)
    return e.g:compile{loss = e.loss, optimizer = "sgd", checkpoint = H{kind = "selective", recompute = H{"silu"}}}
  end, function(_, p) return p:plan().recompute_ops > 0 end},
  {"every_n policy", function(e, H) return e.g:compile{loss = e.loss, checkpoint = H{kind = "every_n", n = 1}} end,
    function(_, p) return p:plan().ops > 0 end},
  {"p:set flat values", function(e, H)
    e.p:set(e.x, H{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
    return e.p
  end, function(e, p) return p:get(e.x)[12] == 12 and p:get(e.x)[1] == 1 end},
  {"p:set nested values", function(e, H)
    e.p:set(e.x, H{H{1, 1, 1}, H{2, 2, 2}, H{3, 3, 3}, H{4, 4, 4}})
    return e.p
  end, function(e, p) local v = p:get(e.x) return v[1] == 1 and v[12] == 4 end},
  {"p:set one entry", function(e, H)
    e.p:set(e.x, H{7, 8, 9}, 2)
    return e.p
  end, function(e, p) local v = p:get(e.x) return v[1] == 0.5 and v[4] == 7 and v[6] == 9 end},
  {"p:set too few values", function(e, H) e.p:set(e.x, H{1, 2}) end, nil, "has 12 elements, got 2 values"},
  {"p:set values holding a non-number", function(e, H) e.p:set(e.x, H{1, true, 3}) end, nil, "values must be numbers"},
  {"p:save entries and options", function(e, H)
    local path = DIR .. "/save.safetensors"
    e.p:save(path, H{H{"w", e.w}, H{"n", value = 3}},
      H{dtype = "F32", metadata = H{a = "1", b = 2, c = true}})
    return ck.safetensors(path)
  end, function(_, f)
    local keys, md = f:keys(), f:metadata()
    return #keys == 2 and f:read("n")[1] == 3 and md.a == "1" and md.b == "2" and md.c == "true"
  end},
  {"p:save metadata that is a table", function(e, H)
    e.p:save(DIR .. "/bad.safetensors", {{"w", e.w}}, {metadata = {a = H{}}})
  end, nil, "metadata 'a' must be a string, a number or a boolean, got table"},
  {"p:save metadata key not a string", function(e, H)
    e.p:save(DIR .. "/bad.safetensors", {{"w", e.w}}, {metadata = {[H{}] = "x"}})
  end, nil, "metadata keys must be strings, got table"},
  {"p:load mapping", function(e, H)
    local path = DIR .. "/load.safetensors"
    ck.write_safetensors(path, {{"wk", {2, 3}, {1, 2, 3, 4, 5, 6}}})
    local f = ck.safetensors(path)
    e.p:load(f, H{w = "wk"})
    f:close()
    return e.p
  end, function(e, p) local v = p:get(e.w) return v[1] == 1 and v[6] == 6 end},
  {"ck.write_safetensors entries", function(_, H)
    local path = DIR .. "/write.safetensors"
    ck.write_safetensors(path, H{H{"a", H{2}, H{4, 5}}})
    return ck.safetensors(path)
  end, function(_, f) local v = f:read("a") return #v == 2 and v[2] == 5 end},
  {"ck.write_safetensors count", function(_, H)
    ck.write_safetensors(DIR .. "/w2.safetensors", {{"a", H{3}, H{4, 5}}})
  end, nil, "'a': 2 values for 3 elements"},
  {"ck.json_encode", function(_, H) return ck.json_encode(H{a = H{1, 2}, b = "x"}) end,
    function(_, s) return s == '{"a":[1,2],"b":"x"}' end},
  {"ck.json_encode options", function(_, H) return ck.json_encode({1, 2}, H{spaced = true}) end,
    function(_, s) return s == "[1, 2]" end},
  {"ck.cuda_options", function(_, H)
    local ok = pcall(ck.cuda_options, H{deterministic = true})
    return ok ~= nil
  end, function() return true end},
  -- the image path's bindings
  {"ck.array shape and values", function(_, H) return ck.array(H{2, 3}, H{1, 2, 3, 4, 5, 6}) end,
    function(_, a) return #a == 6 and a:get(6) == 6 and a.shape[2] == 3 end},
  {"a:reshape and a:slice", function(_, H)
    return ck.array({2, 3}, {1, 2, 3, 4, 5, 6}):reshape(H{3, 2}):slice(1, 2, 1)
  end, function(_, a) return #a == 2 and a:get(1) == 3 end},
  {"p:set an array", function(e, H)
    e.p:set(e.x, ck.array(H{4, 3}, 0.5))
    return e.p
  end, function(e, p) return p:get(e.x)[12] == 0.5 end},
  {"ck.write_safetensors an array", function(_, H)
    local path = DIR .. "/arr.safetensors"
    ck.write_safetensors(path, H{H{"a", H{2}, ck.array({2}, {4, 5})}})
    return ck.safetensors(path)
  end, function(_, f) return f:read("a")[2] == 5 end},
  {"ck.write_png options", function(_, H)
    local path = DIR .. "/img.png"
    ck.write_png(path, ck.array({3, 4, 6}, 0), H{text = H{parameters = "a prompt"}})
    return ck.image_info(path)
  end, function(_, i) return i.width == 6 and i.height == 4 and i.text.parameters == "a prompt" end},
  {"ck.image_load options", function(_, H)
    local path = DIR .. "/img2.png"
    ck.write_png(path, ck.array({3, 4, 6}, 0))
    return ck.image_load(path, H{resize = H{3, 2}, crop = H{0, 1, 2, 2}, flip = true})
  end, function(_, a) return a.shape[2] == 2 and a.shape[3] == 2 end},
  {"ck.clip_tokenizer options and tok:encode", function(_, H)
    local tok = ck.clip_tokenizer(H{tiny = true, pad = "!"})
    return tok:encode("a red circle", H{max_length = 8})
  end, function(_, ids) return #ids == 8 and ids[8] == 0 end},
  {"p:load sources with rows and transpose", function(e, H)
    local path = DIR .. "/rows.safetensors"
    ck.write_safetensors(path, {{"big", {4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
                                {"t", {2, 2}, {1, 2, 3, 4}}})
    local f = ck.safetensors(path)
    e.p:load(f, H{w = H{key = "big", rows = H{3, 2}}, w2 = H{key = "t", transpose = true}})
    f:close()
    return e.p
  end, function(e, p) local v, u = p:get(e.w), p:get("w2") return v[1] == 7 and v[6] == 12 and u[2] == 3 end},
}

for _, case in ipairs(cases) do
  local name, run, check, err = case[1], case[2], case[3], case[4]
  for _, attack in ipairs(ATTACK_NAMES) do
    local e = fresh()
    calls = 0
    local H = function(raw) return hostile(e, attack, raw) end
    local res = table.pack(pcall(run, e, H))
    local what = name .. " (" .. attack .. ")"
    if err then
      local msg = tostring(res[2])
      T.ok(not res[1] and msg:find(HERE .. ".*" .. err:gsub("[%(%)%.%[%]%-%%']", "%%%0")) ~= nil
        and not msg:find("\n"), what .. ": one error line naming the file and line: " .. msg)
    else
      T.ok(res[1], what .. ": works" .. (res[1] and "" or ": " .. tostring(res[2])))
      if res[1] then T.ok(check(e, table.unpack(res, 2, res.n)), what .. ": gives what the raw contents say") end
    end
    T.ok(calls == 0, what .. ": no metamethod ran (" .. calls .. " calls)")
  end
end

-- A checkpoint policy function runs while the program compiles: whatever it
-- does to the graph, the tables the compile read or other programs, the
-- compile either works on what it read or fails naming the policy.
local CALLBACKS = {
  {"grows the graph", function(e) ATTACKS.grow(e) end},
  {"compiles the same graph", function(e) ATTACKS.compile(e) end},
  {"empties the pattern tables and collects", function(_, c)
    if c.stats then
      for k in pairs(c.stats.blocks) do c.stats.blocks[k] = nil end
      c.stats = nil
      c.checkpoint = nil
    end
    collectgarbage("collect")
  end},
  {"steps and closes another program", function(e)
    if pcall(function() return e.p:step() end) then ATTACKS.close(e) end
  end},
  {"raises", function() error("policy raised") end, "policy raised"},
  {"raises a table", function() error(setmetatable({}, {__tostring = function() return "x" end})) end,
    "checkpoint policy: table"},
}
for _, cb in ipairs(CALLBACKS) do
  local e = fresh()
  -- the patterns are made at run time: no constant elsewhere keeps them alive
  local c = {loss = e.loss, optimizer = "sgd", stats = {grads = true, acts = true, blocks = {"b" .. ("l"):rep(1) .. "k"}}}
  local n = 0
  c.checkpoint = function(t)
    n = n + 1
    cb[2](e, c)
    return t.block == "blk" and "recompute" or "save"
  end
  local ok, p = pcall(e.g.compile, e.g, c)
  local what = "policy callback that " .. cb[1]
  if cb[3] then
    local msg = tostring(p)
    T.ok(not ok and msg:find(cb[3], 1, true) and not msg:find("\n"), what .. ": one error line: " .. msg)
  else
    T.ok(ok and n > 0, what .. ": compiles" .. (ok and "" or ": " .. tostring(p)))
    if ok then
      local loss = p:step()
      T.ok(type(loss) == "number" and loss == loss, what .. ": the program steps")
      T.ok(has_block(p, "blk"), what .. ": the stats blocks as given")
    end
  end
end

-- p:step's options may run Lua code: a close there waits for the step to
-- finish; the program reads as closed once it has.
for _, attack in ipairs(ATTACK_NAMES) do
  local e = fresh()
  calls = 0
  local step = e.p.step
  local ok, l = pcall(step, e.p, hostile(e, attack, {lr = 0.1}))
  local what = "p:step options (" .. attack .. ")"
  local msg = tostring(l)
  T.ok(ok and type(l) == "number" or not ok and msg:find(HERE) and not msg:find("\n"),
    what .. ": works or one error line: " .. msg)
  local open = pcall(function() return e.p.steps end)
  if attack == "close" and calls > 0 then
    T.ok(not open, what .. ": closed once the step returned")
    T.ok(select(2, pcall(function() return e.p:plan() end)):find("program is closed", 1, true),
      what .. ": reads as closed")
  else
    T.ok(open, what .. ": still open")
  end
end

-- a close inside a binding's Lua code defers, a close outside does not
do
  local e = fresh()
  do local q <close> = e.p end
  T.ok(not pcall(function() return e.p:plan() end), "a program closed by a <close> variable reads as closed")
  local e2 = fresh()
  local inner_ok
  local opts = setmetatable({}, {__index = function(_, k)
    if k == "guard" then
      do local q <close> = e2.p end
      inner_ok = pcall(function() return e2.p:plan() end)
    end
  end})
  local step = e2.p.step
  local ok = pcall(step, e2.p, opts)
  if inner_ok ~= nil then
    T.ok(ok and inner_ok == false, "inside a step, a closed program refuses other bindings while the step finishes")
  else
    T.ok(ok, "p:step reads its options raw")
  end
end

-- a binding that raises lets go of its pin: a close right after is not deferred
do
  local e = fresh()
  local raising = setmetatable({}, {__index = function() error("options raised") end})
  -- programs of a 64 MiB arena, touched: freeing one gives back its pages
  -- (where the allocator gives memory back at all: not under AddressSanitizer)
  local function big_program()
    local g = ck.graph()
    local big = g:input("big", {16 * 1024 * 1024})
    local p = g:compile{outputs = {ck.silu(big)}, optimizer = "none"}
    p:set(big, 1)
    return p, big
  end
  local function freed_by_close(p)
    local before = ck.rss()
    do local q <close> = p end
    return before - ck.rss()
  end
  local MiB = 1024 * 1024
  local calibrate = freed_by_close(big_program())
  local p, big = big_program()
  local set_raised = not pcall(p.set, p, big, {1, "x"})
  local step_raised = not pcall(p.step, p, raising)
  local freed = freed_by_close(p)
  local what = "after p:set raised (and p:step " .. (step_raised and "raised" or "read its options raw")
    .. "), a close frees the program at once: " .. freed // MiB .. " MiB given back"
  T.ok(set_raised and not pcall(function() return p:plan() end), "after p:set raised, a close closes")
  if calibrate > 48 * MiB then T.ok(freed > 48 * MiB, what)
  else print("skip " .. what .. " (this allocator keeps freed memory: " .. calibrate // MiB .. " MiB came back)") end
  -- a coroutine that dies inside a binding keeps the pin until it is collected:
  -- the close is deferred, the program reads as closed
  local e2 = fresh()
  -- (p:set's values are read raw, so a value that is no number is what raises)
  local co = coroutine.create(function() return e2.p:set(e2.x, {1, "x"}) end)
  coroutine.resume(co)
  do local q <close> = e2.p end
  T.ok(not pcall(function() return e2.p:plan() end), "closed after a coroutine died inside p:set")
  -- closing the dead coroutine lets go of its pin: the program is freed there
  T.ok(coroutine.close(co) == false, "closing the coroutine reports the error it died of")
  T.ok(not pcall(function() return e2.p:plan() end), "the program stays closed after its pin went")
  co = nil
  collectgarbage("collect")
end

for _, f in ipairs(ck.listdir(DIR)) do os.remove(DIR .. "/" .. f) end
os.remove(DIR)
T.done()
