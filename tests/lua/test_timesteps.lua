-- A sample's own timestep is used as given: ck.data hands the objective a
-- whole number from 0 to the scheduler's last timestep, exactly as stored, and
-- refuses anything else with one message naming the sample's file: out of
-- range (1e9, 1000, -5, -1), not whole (2.5, 999.5), not finite (NaN, inf,
-- -inf), a tensor other than [1], or past a smaller scheduler's last; stored
-- as F32 or F16 alike.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local data = require "ck.data"
local T = require "check"

local tmp = string.format("out/test_timesteps.%d", math.floor(ck.now() * 1e6))

local B, D, P = 1, 8, 4
local g = ck.graph()
local inputs = {
  latents = g:input("latents", {B, 4, 2, 2}), prompt_embeds = g:input("prompt_embeds", {B, 77, D}),
  pooled_prompt_embeds = g:input("pooled_prompt_embeds", {B, P}), time_ids = g:input("time_ids", {B, 6}),
}
local y = ck.linear(inputs.pooled_prompt_embeds, g:param("w", {1, P}))
local p = g:compile{loss = ck.mse_loss(y, g:input("t", {B, 1})), optimizer = "adamw", lr = 1e-2, device = "cpu"}

-- a safetensors file written by hand, so each tensor has its own dtype:
-- {name, dtype, shape, values}
local PACK = {F32 = "<f", I64 = "<i8", I32 = "<i4"}
local function f16(x) -- the half nearest x for the values used here (whole numbers, 2.5, inf, nan)
  if x ~= x then return 0x7e00 end
  local sign = (x < 0 or 1 / x < 0) and 0x8000 or 0
  x = math.abs(x)
  if x == 0 then return sign end
  if x >= 65520 then return sign | 0x7c00 end
  local e = math.floor(math.log(x, 2))
  local m = math.floor((x / 2 ^ e - 1) * 1024 + 0.5)
  return sign | ((e + 15) << 10) | m
end
local function write_file(path, tensors)
  local header, blobs, at = {}, {}, 0
  for _, t in ipairs(tensors) do
    local parts = {}
    for _, v in ipairs(t[4]) do
      parts[#parts + 1] = t[2] == "F16" and string.pack("<I2", f16(v)) or string.pack(PACK[t[2]], v)
    end
    local blob = table.concat(parts)
    local dims = {}
    for i, d in ipairs(t[3]) do dims[i] = tostring(d) end
    header[#header + 1] = string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', t[1], t[2],
      table.concat(dims, ","), at, at + #blob)
    blobs[#blobs + 1] = blob
    at = at + #blob
  end
  local h = "{" .. table.concat(header, ",") .. "}"
  h = h .. string.rep(" ", (8 - #h % 8) % 8)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", #h), h, table.concat(blobs))
  f:close()
end

local function zeros(n) local t = {} for i = 1, n do t[i] = 0 end return t end
-- a sample directory holding one file; ts = {shape, values} of its timesteps
local made = 0
local function sample(ts, dtype, n_timesteps)
  made = made + 1
  local dir = string.format("%s/s%d", tmp, made)
  assert(ck.mkdir(dir))
  local path = dir .. "/sample.safetensors"
  local fields = {
    {"latents", "F32", {4, 2, 2}, zeros(16)}, {"prompt_embeds", "F32", {77, D}, zeros(77 * D)},
    {"pooled_prompt_embeds", "F32", {P}, zeros(P)}, {"time_ids", "F32", {6}, zeros(6)},
  }
  if ts then fields[#fields + 1] = {"timesteps", dtype or "F32", ts[1], ts[2]} end
  write_file(path, fields)
  return data.latents(dir, {batch = 1, seed = 1, timesteps = n_timesteps}), path
end

local function try(ts, dtype, n_timesteps)
  local ds, path = sample(ts, dtype, n_timesteps)
  local ok, given = pcall(ds.load, ds, p, inputs, {1})
  return ok, given, path
end

-- used as given
for _, c in ipairs({{0, "F32"}, {1, "F32"}, {437, "F32"}, {999, "F32"}, {999, "F16"}, {-0.0, "F32"}, {2048, "F16", 4096}}) do
  local ok, given = try({{1}, {c[1]}}, c[2], c[3])
  local t = ok and given.timesteps and given.timesteps[1]
  T.ok(ok and math.type(t) == "integer" and t == math.tointeger(c[1]),
       string.format("timestep %s (%s) is used as given: %s", tostring(c[1]), c[2], tostring(ok and t or given)))
end
do
  local ok, given = try(nil)
  T.ok(ok and given.timesteps == nil, "a sample without timesteps draws them: " .. tostring(ok and given.timesteps))
end
do
  local ok, given = try({{1}, {99}}, "F32", 100)
  T.ok(ok and given.timesteps[1] == 99, "99 is the last timestep of a 100-step scheduler")
end

-- refused, naming the file
local bad = {
  {1e9, "F32", nil, "timestep 1e+09 is not a whole number from 0 to 999"},
  {1000, "F32", nil, "timestep 1000 is not"}, {1000, "F16", nil, "timestep 1000 is not"},
  {-5, "F32", nil, "timestep -5 is not"}, {-1, "F16", nil, "timestep -1 is not"},
  {2.5, "F32", nil, "timestep 2.5 is not"}, {999.5, "F32", nil, "timestep 999.5 is not"},
  {0 / 0, "F32", nil, "timestep nan is not"}, {math.huge, "F32", nil, "timestep inf is not"},
  {-math.huge, "F32", nil, "timestep -inf is not"}, {65504, "F16", nil, "timestep 65504 is not"},
  {math.huge, "F16", nil, "timestep inf is not"}, {2.5, "F16", nil, "timestep 2.5 is not"},
  {2 ^ 63, "F32", nil, "timestep 9.22337204e+18 is not"}, {-2 ^ 63, "F32", nil, "timestep -9.22337204e+18 is not"},
  {1e-30, "F32", nil, "timestep 1e-30 is not"},
  {100, "F32", 100, "timestep 100 is not a whole number from 0 to 99"},
}
for _, c in ipairs(bad) do
  local ok, err, path = try({{1}, {c[1]}}, c[2], c[3])
  T.ok(not ok and type(err) == "string" and err:sub(1, #path + 2) == path .. ": " and err:find(c[4], 1, true)
       and not err:find("\n"),
       string.format("timestep %s (%s) is refused naming the file: %s", tostring(c[1]), c[2], tostring(err)))
end
for _, c in ipairs({{{2}, {5, 6}}, {{1, 1}, {5}}, {{0}, {}}, {{}, {5}}}) do
  local ok, err, path = try(c)
  T.ok(not ok and err:sub(1, #path + 2) == path .. ": " and err:find("a sample has one timestep", 1, true),
       string.format("a timesteps tensor of shape [%s] is refused: %s", table.concat(c[1], ", "), tostring(err)))
end

for i = 1, made do
  os.remove(string.format("%s/s%d/sample.safetensors", tmp, i))
  os.remove(string.format("%s/s%d", tmp, i))
end
os.remove(tmp)
T.done()
