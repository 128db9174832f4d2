-- Every number ck.state reads from a state file is range-checked before the
-- program takes it: ck.step (0 to 999,999,999, the 9 digits of a state's
-- name), ck.updates (at most the step), ck.micro (at most the step, and below
-- the program's gradient accumulation) and the script's own counts through
-- state.count (data.epoch, data.pos). Anything else (2^63-1, 2^63, negative,
-- fractional, hexadecimal, exponent, padded, empty, NaN, infinity, 30 digits)
-- is refused with one message naming the file and the key, and leaves the
-- program's counts as they were.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local state = require "ck.state"
local T = require "check"

local tmp = string.format("out/test_state_numbers.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))

local function build(accumulate)
  local g = ck.graph()
  local x, t = g:input("x", {4, 2}), g:input("t", {4, 1})
  local loss = ck.mse_loss(ck.linear(x, g:param("w", {1, 2})), t)
  return g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 1, device = "cpu", accumulate = accumulate}
end

-- a real state of 3 steps, then copies of it with one metadata field changed
local p = build(1)
p:set("x", {1, 2, 3, 4, 5, 6, 7, 8})
p:set("t", {1, 0, 1, 0})
for _ = 1, 3 do p:step() end
state.save(p, tmp .. "/good", {run = "a"}, 3)
local good = tmp .. "/good/state-000000003.safetensors"
local src <close> = ck.safetensors(good)
local tensors = {}
for _, k in ipairs(src:keys()) do tensors[#tensors + 1] = {k, src:shape(k), src:read(k)} end
local base_meta = src:metadata()

local function variant(name, key, value, more)
  local meta = {}
  for k, v in pairs(base_meta) do meta[k] = v end
  meta[key] = value
  for k, v in pairs(more or {}) do meta[k] = v end
  local path = string.format("%s/%s.safetensors", tmp, name)
  ck.write_safetensors(path, tensors, meta)
  return path
end

local bad = {"9223372036854775807", "9223372036854775808", "-1", "-9223372036854775808", "1000000000", "1e9",
             "0x10", "5.5", " 5", "5 ", "+5", "", "nan", "inf", "-inf", "123456789012345678901234567890", "five"}
local n = 0
for _, key in ipairs({"ck.step", "ck.updates", "ck.micro"}) do
  for i, v in ipairs(bad) do
    local path = variant(string.format("bad_%s_%d", key:sub(4), i), key, v)
    local q = build(1)
    q.steps, q.updates = 7, 7
    local ok, err = pcall(state.load, q, path, {run = "a"})
    n = n + 1
    T.ok(not ok and type(err) == "string" and err:find(path, 1, true) and err:find(key, 1, true)
         and err:find("not a whole number", 1, true) and q.steps == 7 and q.updates == 7 and q.micro == 0,
         string.format("%s = '%s' is refused naming the file and the key: %s", key, v, tostring(err)))
  end
end
-- updates and micro beyond the step they belong to
for _, c in ipairs({{"ck.updates", "4"}, {"ck.micro", "4"}}) do
  local path = variant("beyond_" .. c[1]:sub(4), c[1], c[2])
  local q = build(8)
  local ok, err = pcall(state.load, q, path, {run = "a"})
  T.ok(not ok and err:find(path, 1, true) and err:find("from 0 to 3", 1, true) and q.steps == 0,
       string.format("%s = %s with ck.step = 3 is refused: %s", c[1], c[2], tostring(err)))
end
-- micro at least the program's accumulation: a state of another setup
do
  local path = variant("micro_accumulate", "ck.micro", "2")
  local q = build(2)
  local ok, err = pcall(state.load, q, path, {run = "a"})
  T.ok(not ok and err:find(path, 1, true) and err:find("ck.micro is 2", 1, true) and q.steps == 0 and q.micro == 0,
       "ck.micro = 2 with an accumulation of 2 is refused: " .. tostring(err))
end
-- the boundaries themselves are states
for _, v in ipairs({"0", "999999999"}) do
  local path = variant("edge_" .. v, "ck.step", v, {["ck.updates"] = v})
  local q = build(1)
  local ok, err = pcall(state.load, q, path, {run = "a"})
  T.ok(ok and q.steps == tonumber(v) and q.updates == tonumber(v),
       string.format("ck.step = %s loads (steps %d, updates %d) %s", v, q.steps, q.updates, tostring(err)))
end
-- a state whose step does not fit a state's name is not saved
do
  local q = build(1)
  q.steps = state.MAX_STEP + 1
  local ok, err = pcall(state.save, q, tmp .. "/huge", {}, 1)
  T.ok(not ok and err:find("at most 999999999", 1, true) and #state.list(tmp .. "/huge") == 0,
       "saving at step 1,000,000,000 is refused: " .. tostring(err))
end
-- a script that sets the counts itself: the program refuses what would overflow the step after it
for _, c in ipairs({{"steps", math.maxinteger}, {"updates", math.maxinteger}, {"steps", 1 << 53}, {"steps", -1}}) do
  local q = build(1)
  local ok, err = pcall(function() q[c[1]] = c[2] end)
  T.ok(not ok and tostring(err):find("from 0 to 2^53 - 1", 1, true) and q.steps == 0 and q.updates == 0,
       string.format("p.%s = %d is refused: %s", c[1], c[2], tostring(err)))
end
do
  local q = build(1)
  q.steps, q.updates = (1 << 53) - 1, (1 << 53) - 1
  q:set("x", {1, 2, 3, 4, 5, 6, 7, 8})
  q:set("t", {1, 0, 1, 0})
  q:step()
  T.ok(q.steps == 1 << 53, "a step from the largest count works: " .. q.steps)
end
-- state.latest passes over a file whose name and step are past the 9 digits
do
  local dir = tmp .. "/latest"
  assert(ck.mkdir(dir))
  ck.write_safetensors(dir .. "/state-000000003.safetensors", tensors, base_meta)
  local meta = {}
  for k, v in pairs(base_meta) do meta[k] = v end
  for _, big in ipairs({"9223372036854775807", "1000000000"}) do
    meta["ck.step"] = big
    ck.write_safetensors(dir .. "/state-" .. big .. ".safetensors", tensors, meta)
  end
  local latest = state.latest(dir)
  T.ok(latest == dir .. "/state-000000003.safetensors", "state.latest passes over steps past 9 digits: " .. tostring(latest))
end
-- the script's own counts
local meta = {["data.pos"] = "4", ["data.epoch"] = "9223372036854775807"}
T.ok(state.count(meta, "data.pos", "f.safetensors", 0, 6) == 4, "state.count reads a count in range")
local ok, err = pcall(function() local n = state.count(meta, "data.epoch", "f.safetensors", 0, 3); return n end)
T.ok(not ok and err:match("^[^:]*test_state_numbers%.lua:%d+: f%.safetensors: data%.epoch is '9223372036854775807', not a whole number from 0 to 3$"),
     "state.count refuses one out of range at the caller's line: " .. tostring(err))
ok, err = pcall(state.count, meta, "data.missing", "f.safetensors", 0, 3)
T.ok(not ok and err:find("data.missing is missing", 1, true), "a missing count without a default is refused: " .. tostring(err))
T.ok(state.count(meta, "data.missing", "f.safetensors", 0, 3, 2) == 2, "a missing count with a default is the default")
print(string.format("%d bad values tried", n))

for _, d in ipairs({"good", "huge", "latest"}) do
  for _, name in ipairs(ck.listdir(tmp .. "/" .. d) or {}) do os.remove(tmp .. "/" .. d .. "/" .. name) end
  os.remove(tmp .. "/" .. d)
end
for _, name in ipairs(ck.listdir(tmp) or {}) do os.remove(tmp .. "/" .. name) end
os.remove(tmp)
T.done()
